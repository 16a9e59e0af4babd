"""The mount handles' write buffer (``hf3fs.fuse.extents``) against a model: a file is what its writes made it."""

from __future__ import annotations

import errno
import random
import threading
from types import SimpleNamespace
from typing import Any

import pytest

try:
    from hf3fs.fuse.appends import AppendLeases
    from hf3fs.fuse.extents import MAX_EXTENTS, ExtentBufferedFile
    from hf3fs.fuse.handles import Handle
except OSError as exc:  # hf3fs.fuse loads libfuse when imported
    pytest.skip(f"libfuse is not installed ({exc}); scripts/bootstrap.sh installs fuse3", allow_module_level=True)


class _Raw:
    """The raw file's surface the buffer uses, over a bytearray; its flushes recorded, a failure on demand."""

    def __init__(self, chunk: int = 1 << 16) -> None:
        self.layout = SimpleNamespace(chunk_size=chunk)
        self.data = bytearray()
        self.flushes: list[list[tuple[int, int]]] = []
        self.fail: OSError | None = None
        self.closed = False
        self.synced = 0
        self.leased = False
        self.meta_end = 0
        self.lease_events: list[str] = []

    def readable(self) -> bool:
        return True

    def ensure_room(self, end: int) -> None:
        if end > 1 << 30:
            raise OSError(errno.EDQUOT, "quota")

    def write_extents(self, extents: Any) -> None:
        if self.fail is not None:
            raise self.fail
        self.flushes.append([(at, len(b)) for at, b in extents])
        for at, b in extents:
            if len(self.data) < at + len(b):
                self.data.extend(bytes(at + len(b) - len(self.data)))
            self.data[at : at + len(b)] = b

    def fsync(self) -> None:
        self.synced += 1

    def truncate(self, size: int) -> int:
        del self.data[size:]
        return size

    def close(self) -> None:
        self.closed = True

    # the append lease, as meta keeps it: one holder, the end it was given back with
    def open_append_lease(self) -> tuple[str, int]:
        assert not self.leased, "the lease taken twice"
        self.leased = True
        self.lease_events.append("open")
        return "lease", max(self.meta_end, len(self.data))

    def client_length(self) -> int:
        return len(self.data)  # the handles of one client over one raw file: what they wrote

    def close_append_lease(self, lease: str, end: int, *, wrote: bool) -> None:
        assert self.leased and lease == "lease"
        self.leased, self.meta_end = False, end
        self.lease_events.append(f"close {end} {wrote}")


def _put(model: bytearray, at: int, b: bytes) -> None:
    if len(model) < at + len(b):
        model.extend(bytes(at + len(b) - len(model)))
    model[at : at + len(b)] = b


@pytest.mark.parametrize("seed", range(20))
def test_random_writes_land_as_written_and_the_extents_stay_sorted_and_disjoint(seed: int) -> None:
    rng = random.Random(seed)
    raw = _Raw(chunk=1 << 14)
    f = ExtentBufferedFile(raw)  # type: ignore[arg-type]  # the stand-in has what the buffer uses
    model = bytearray()
    for n in range(300):
        at = rng.choice([rng.randrange(0, 40000), f.tell(), max(0, f.tell() - rng.randrange(1, 64))])
        b = bytes([n % 251]) * rng.choice([1, 7, 100, 512, 4096, 20000])
        f.seek(at)
        assert f.write(b) == len(b) and f.tell() == at + len(b)
        _put(model, at, b)
        ends = [s + len(r) for s, r in zip(f._starts, f._runs, strict=True)]
        assert all(e < s for e, s in zip(ends, f._starts[1:], strict=False))  # sorted, disjoint, not touching
        assert f.buffered == sum(len(r) for r in f._runs) < raw.layout.chunk_size
        if rng.random() < 0.05:
            f.flush()
    f.close()
    assert raw.closed and bytes(raw.data) == bytes(model)


def test_pages_here_and_there_go_in_one_flush() -> None:
    raw = _Raw()
    f = ExtentBufferedFile(raw)  # type: ignore[arg-type]
    for page in (0, 5, 2, 3, 9):  # SQLite: the header page and the pages a transaction changed
        f.seek(page * 4096)
        f.write(bytes([page]) * 4096)
    assert raw.flushes == []
    f.fsync()
    assert raw.flushes == [[(0, 4096), (2 * 4096, 2 * 4096), (5 * 4096, 4096), (9 * 4096, 4096)]]
    assert raw.synced == 1 and f.buffered == 0


def test_a_full_buffer_and_too_many_extents_flush() -> None:
    raw = _Raw(chunk=1 << 16)
    f = ExtentBufferedFile(raw)  # type: ignore[arg-type]
    f.write(b"x" * 60000)
    assert raw.flushes == []
    f.write(b"y" * 6000)  # past the buffer's size: sent
    assert raw.flushes == [[(0, 66000)]] and f.buffered == 0
    for k in range(MAX_EXTENTS + 1):
        f.seek(100000 + 2 * k)
        f.write(b"z")
    assert len(raw.flushes) == 2 and len(raw.flushes[1]) == MAX_EXTENTS + 1


def test_a_failed_flush_keeps_the_bytes_for_the_next() -> None:
    raw = _Raw()
    f = ExtentBufferedFile(raw)  # type: ignore[arg-type]
    f.seek(10)
    f.write(b"abc")
    raw.fail = OSError(errno.EIO, "storage refused")
    with pytest.raises(OSError):
        f.fsync()
    assert f.buffered == 3 and raw.synced == 0
    raw.fail = None
    f.fsync()
    assert bytes(raw.data[10:13]) == b"abc" and raw.synced == 1


def test_a_close_whose_flush_fails_still_closes_and_raises() -> None:
    raw = _Raw()
    f = ExtentBufferedFile(raw)  # type: ignore[arg-type]
    f.write(b"abc")
    raw.fail = OSError(errno.EIO, "storage refused")
    with pytest.raises(OSError):
        f.close()
    assert raw.closed and f.closed


def test_truncate_sends_the_buffer_first_and_quota_errors_come_from_the_write() -> None:
    raw = _Raw()
    f = ExtentBufferedFile(raw)  # type: ignore[arg-type]
    f.seek(100)
    f.write(b"abc")
    assert f.truncate(50) == 50 and bytes(raw.data) == bytes(50)  # the bytes past the new end did not come back
    f.seek(1 << 30)
    with pytest.raises(OSError) as err:
        f.write(b"x")
    assert err.value.errno == errno.EDQUOT and f.buffered == 0
    with pytest.raises(ValueError):
        f.seek(-1)


def test_flush_span_sends_only_the_extents_it_overlaps() -> None:
    raw = _Raw()
    f = ExtentBufferedFile(raw)  # type: ignore[arg-type]
    for at in (0, 100, 200, 300):
        f.seek(at)
        f.write(b"x" * 10)
    assert f.buffered_end == 310
    f.flush_span(105, 100)  # [105, 205): the extents at 100 and 200
    assert raw.flushes == [[(100, 10), (200, 10)]] and f.buffered == 20 and f.buffered_end == 310
    f.flush_span(10, 90)  # [10, 100): touches neither
    f.flush_span(250, 0)
    assert len(raw.flushes) == 1
    f.flush_span(305, 1000)
    assert raw.flushes[1] == [(300, 10)] and f.buffered_end == 10
    f.flush()
    assert raw.flushes[2] == [(0, 10)] and f.buffered_end == 0


def test_appends_are_buffered_under_one_lease_and_given_back_with_the_end_at_the_flush() -> None:
    raw = _Raw()
    raw.meta_end = raw.data.__len__() + 100  # another client appended 100 bytes this one has not seen
    raw.data.extend(bytes(100))
    f = ExtentBufferedFile(raw)  # type: ignore[arg-type]
    f.seek(5)
    f.write(b"w")  # an ordinary write buffered before: it goes first, before the lease is taken
    assert [f.append(b"a" * 10), f.append(b"b" * 5)] == [100, 110]
    assert f.appending and raw.lease_events == ["open"] and raw.flushes == [[(5, 1)]]
    f.flush()
    assert raw.flushes[-1] == [(100, 15)] and raw.lease_events == ["open", "close 115 True"] and not f.appending
    assert bytes(raw.data[100:]) == b"a" * 10 + b"b" * 5
    assert f.append(b"c") == 115  # the next burst takes the lease again
    f.close()
    assert raw.lease_events[-2:] == ["open", "close 116 True"] and raw.closed and bytes(raw.data[115:]) == b"c"


def test_an_append_under_a_held_lease_lands_past_what_another_handle_wrote_since() -> None:
    """Two handles of one mount: an O_APPEND one appends (the lease stays with it for a moment), a plain one writes
    past the end, then the first appends again. That append landed where the last one ended, over the other
    handle's bytes (a log line and a pwrite 100 bytes past the end: the pwrite's bytes were overwritten)."""
    raw = _Raw()
    appender, writer = ExtentBufferedFile(raw), ExtentBufferedFile(raw)  # type: ignore[arg-type]
    assert appender.append(b"<one>") == 0
    writer.seek(105)
    writer.write(b"W" * 10)
    writer.flush()  # what the mount does before an append: the other handles' bytes to storage first
    assert appender.append(b"<two>") == 115 and appender.appending
    appender.flush()
    assert bytes(raw.data) == b"<one>" + bytes(100) + b"W" * 10 + b"<two>"
    assert raw.lease_events == ["open", "close 120 True"]


def test_a_full_buffer_of_appends_goes_with_the_lease_and_the_next_append_takes_it_again() -> None:
    raw = _Raw(chunk=1 << 12)
    f = ExtentBufferedFile(raw)  # type: ignore[arg-type]
    for _ in range(6):
        f.append(b"x" * 1000)  # the fifth fills the 4 KiB buffer
    assert raw.lease_events == ["open", "close 5000 True", "open"] and raw.flushes == [[(0, 5000)]]
    f.close()
    assert bytes(raw.data) == b"x" * 6000 and raw.lease_events[-1] == "close 6000 True"


def test_an_append_over_quota_changes_nothing_and_gives_the_lease_back() -> None:
    raw = _Raw()
    raw.meta_end = (1 << 30) - 10
    f = ExtentBufferedFile(raw)  # type: ignore[arg-type]
    with pytest.raises(OSError) as err:
        f.append(b"y" * 11)
    assert err.value.errno == errno.EDQUOT and not f.appending and f.buffered == 0
    assert raw.lease_events == ["open", f"close {(1 << 30) - 10} False"]


def test_a_failed_flush_keeps_the_appends_and_the_lease_for_the_next() -> None:
    raw = _Raw()
    f = ExtentBufferedFile(raw)  # type: ignore[arg-type]
    f.append(b"z" * 3)
    raw.fail = OSError(errno.EIO, "storage")
    with pytest.raises(OSError):
        f.flush()
    assert f.appending and raw.lease_events == ["open"]
    raw.fail = None
    f.flush()
    assert bytes(raw.data) == b"zzz" and raw.lease_events == ["open", "close 3 True"]


def test_a_close_whose_flush_fails_gives_the_append_lease_back() -> None:
    """The close goes on (the raw file closes) when its flush fails; the append lease must go back too, with the end
    meta gave (nothing appended under it is known to have landed). Kept, it was renewed with the mount's other
    write sessions (meta renews every session of a client), so no other client could append to the file again."""
    raw = _Raw()
    raw.meta_end = 40
    f = ExtentBufferedFile(raw)  # type: ignore[arg-type]
    assert f.append(b"z" * 3) == 40
    raw.fail = OSError(errno.EIO, "storage")
    with pytest.raises(OSError):
        f.close()
    assert raw.closed and not raw.leased and not f.appending
    assert raw.lease_events == ["open", "close 40 False"]


def test_the_mount_gives_a_quiet_handles_lease_back_after_a_failed_flush() -> None:
    """A quiet O_APPEND handle (a log file kept open) whose timed flush failed once (storage briefly away): the
    timer tries again until the appends land and the lease goes back. It gave up after one try, so the lease stayed
    with the handle (renewed with the mount's sessions) until its fsync or close: other clients' appends waited
    90 s and failed with EAGAIN, again and again, and the appended lines stayed unseen."""
    raw = _Raw()
    gave_back = threading.Event()
    real_close = raw.close_append_lease

    def close_lease(lease: str, end: int, *, wrote: bool) -> None:
        real_close(lease, end, wrote=wrote)
        gave_back.set()

    raw.close_append_lease = close_lease  # type: ignore[method-assign]
    failures = [OSError(errno.EIO, "storage")]
    real_write = raw.write_extents

    def write_extents(extents: Any) -> None:
        if failures:
            raise failures.pop()
        real_write(extents)

    raw.write_extents = write_extents  # type: ignore[method-assign]
    f = ExtentBufferedFile(raw)  # type: ignore[arg-type]
    h = Handle(file=f, inode_id=7, writable=True, append=True)  # type: ignore[arg-type]
    leases = AppendLeases(hold_s=0.001, retry_s=0.001)
    f.append(b"line\n")
    leases.held(h)
    assert gave_back.wait(10), "the lease is still held after the failed flush"
    assert raw.lease_events == ["open", "close 5 True"] and bytes(raw.data) == b"line\n" and not failures


def test_one_handles_slow_flush_does_not_hold_another_handles_lease() -> None:
    """Two O_APPEND files of one mount; the first one's flush hangs (its chain has no head: storage retries for up to
    30 s). The second one's lease still goes back on time: the mount's one timer thread flushed them in turn, so
    every other lease of the mount stayed held (and other clients' appends to those files waited) meanwhile."""
    stuck, slow = threading.Event(), _Raw()
    real_write = slow.write_extents

    def hang(extents: Any) -> None:
        stuck.wait(20)
        real_write(extents)

    slow.write_extents = hang  # type: ignore[method-assign]
    quick, gave_back = _Raw(), threading.Event()
    real_close = quick.close_append_lease

    def close_lease(lease: str, end: int, *, wrote: bool) -> None:
        real_close(lease, end, wrote=wrote)
        gave_back.set()

    quick.close_append_lease = close_lease  # type: ignore[method-assign]
    leases = AppendLeases(hold_s=0.001)
    handles = []
    for n, raw in enumerate((slow, quick)):
        f = ExtentBufferedFile(raw)  # type: ignore[arg-type]
        f.append(b"line\n")
        handles.append(Handle(file=f, inode_id=n + 1, writable=True, append=True))  # type: ignore[arg-type]
    try:
        leases.held(handles[0])
        leases.held(handles[1])
        assert gave_back.wait(10), "the quick file's lease waited for the slow file's flush"
        assert quick.lease_events == ["open", "close 5 True"] and slow.leased
    finally:
        stuck.set()


def test_the_per_file_order_of_appenders_is_kept_only_while_a_file_is_appended_to() -> None:
    """One lock per inode orders the mount's appenders; it stayed for good once made, so a mount appending to ever new
    files (a log per job, rotated logs) grew by one lock per file it ever appended to (hf3fs.keyed_locks now, whose
    test checks that the lock still excludes)."""
    leases = AppendLeases()
    for inode_id in range(1000):
        with leases.appending(inode_id):
            assert len(leases) == 1
    assert len(leases) == 0
