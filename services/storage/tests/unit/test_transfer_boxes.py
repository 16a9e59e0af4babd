"""The data path's transfer boxes: pushed or staged bytes nobody collects do not stay for good."""

from __future__ import annotations

from ff_storage.dataserver import TransferBoxes


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_pushed_bytes_nobody_takes_are_dropped_after_the_ttl() -> None:
    clock = Clock()
    boxes = TransferBoxes(ttl_s=30.0, clock=clock)
    boxes.deposit("refused-write", "alice", bytearray(b"never taken"))
    clock.now += 10
    boxes.deposit("young", "alice", bytearray(b"kept"))
    clock.now += 25  # "refused-write" is 35 s old, "young" 25 s
    boxes.deposit("next", "alice", bytearray(b"x"))
    assert await boxes.take("refused-write", "alice", timeout_s=0) is None
    assert await boxes.take("young", "alice", timeout_s=0) == bytearray(b"kept")
    assert await boxes.take("young", "alice", timeout_s=0) is None  # taken once


async def test_staged_reads_nobody_claims_are_dropped_after_the_ttl() -> None:
    clock = Clock()
    boxes = TransferBoxes(ttl_s=30.0, clock=clock)
    boxes.stage("gone-reader", "bob", [b"abc"])
    clock.now += 31
    boxes.deposit("any", "alice", bytearray(b"x"))  # any deposit or stage sweeps both boxes
    assert boxes.claim("gone-reader", "bob") is None
