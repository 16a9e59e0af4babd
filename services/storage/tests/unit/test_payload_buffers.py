"""Which buffers of calls' bulk bytes the data server keeps for later calls (``PayloadBuffers.give_back``)."""

from __future__ import annotations

from ff_storage.dataserver import PayloadBuffers


def test_a_buffer_nobody_holds_is_kept_and_counted() -> None:
    buffers = PayloadBuffers(max_bytes=1 << 20)
    attached = {"t": bytearray(4096)}
    buf = attached.pop("t")
    buffers.give_back(buf)
    assert buffers.held_bytes == 4096


def test_a_buffer_with_a_live_view_is_not_kept() -> None:
    buffers = PayloadBuffers(max_bytes=1 << 20)
    buf = bytearray(4096)
    view = memoryview(buf)[100:200]  # work that outlived its call still reads these bytes
    buffers.give_back(buf)
    assert buffers.held_bytes == 0
    assert bytes(view) == bytes(100)
    assert len(buf) == 4096  # the check left the buffer as it was


def test_a_buffer_somebody_else_refers_to_is_not_kept() -> None:
    buffers = PayloadBuffers(max_bytes=1 << 20)
    buf = bytearray(b"x" * 4096)
    kept_elsewhere = [buf]
    buffers.give_back(buf)
    assert buffers.held_bytes == 0
    assert kept_elsewhere[0] == b"x" * 4096


def test_no_more_than_max_bytes_wait() -> None:
    buffers = PayloadBuffers(max_bytes=10_000)
    for _ in range(3):
        buf = bytearray(4096)
        buffers.give_back(buf)
    assert buffers.held_bytes == 8192
