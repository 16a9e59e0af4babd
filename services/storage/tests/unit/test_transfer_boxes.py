"""The data path's transfer boxes: pushed or staged bytes nobody collects do not stay for good."""

from __future__ import annotations

from ff_storage.dataserver import TransferBoxes
from ff_testing.fakes import FakeClock


async def test_pushed_bytes_nobody_takes_are_dropped_after_the_ttl() -> None:
    clock = FakeClock(1000.0)
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
    clock = FakeClock(1000.0)
    boxes = TransferBoxes(ttl_s=30.0, clock=clock)
    boxes.stage("gone-reader", "bob", [b"abc"])
    clock.now += 31
    boxes.deposit("any", "alice", bytearray(b"x"))  # any deposit or stage sweeps both boxes
    assert boxes.claim("gone-reader", "bob") is None


async def test_the_inbox_holds_at_most_max_owner_bytes_per_caller() -> None:
    clock = FakeClock(1000.0)
    boxes = TransferBoxes(ttl_s=30.0, clock=clock, max_owner_bytes=100)

    def room(owner: str, length: int) -> bool:
        if boxes.reserve(owner, length):
            boxes.release(owner, length)
            return True
        return False

    boxes.deposit("a1", "alice", bytearray(60))
    assert room("alice", 40) and not room("alice", 41)
    assert room("bob", 100)  # per caller
    assert boxes.reserve("alice", 30)  # bytes on their way count too
    assert not room("alice", 11)
    boxes.release("alice", 30)
    boxes.deposit("a1", "alice", bytearray(60))  # the same transfer again replaces, it does not add
    assert room("alice", 40)
    assert await boxes.take("a1", "alice", timeout_s=0) == bytearray(60)
    assert room("alice", 100)
    boxes.deposit("a2", "alice", bytearray(100))
    boxes.discard("a2")
    assert room("alice", 100)
    boxes.deposit("a3", "alice", bytearray(100))
    assert await boxes.take("a3", "mallory", timeout_s=0) is None  # not hers; and it is gone
    assert room("alice", 100)
    boxes.deposit("a4", "alice", bytearray(100))
    clock.now += 31
    assert room("alice", 100)  # expired bytes are no longer held
