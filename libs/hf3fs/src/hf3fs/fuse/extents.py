"""A writable mount handle's buffer: every extent written since its last flush, sent to storage in one batch.

``io.BufferedRandom`` keeps one contiguous run and sends it to storage as soon as a write lands anywhere else. A
database's transaction writes its header page and the pages it changed, each somewhere else: every page cost a
durable chain write of its own before its fsync, which then sent the last one. Here the pages wait, sorted and
merged, for the flush (fsync, close, a read or another handle's write of the file, or the buffer full), and go in
one storage batch, each chunk's writes in parallel on their chains.
"""

from __future__ import annotations

import contextlib
import io
from bisect import bisect_left, bisect_right
from typing import Any

from hf3fs.files import RawFile

MAX_EXTENTS = 1024  # a flush when more are buffered: one storage batch is at most a few thousand chunk writes


class ExtentBufferedFile:
    """A ``RawFile`` opened to write, its writes kept as sorted, disjoint extents until ``flush``.

    What the mount's handles need of a file object: ``seek``/``tell``/``write`` (pwrite), ``flush``, ``fsync``,
    ``truncate``, ``close``, ``closed`` and ``raw`` (reads go to the raw file, after a flush). A failed flush keeps
    the extents, so a later flush (the fsync after a failed close's, say) tries them again rather than losing them.
    """

    def __init__(self, raw: RawFile, limit: int | None = None) -> None:
        self.raw = raw
        self._limit = limit or raw.layout.chunk_size  # bytes buffered before a flush
        self._starts: list[int] = []
        self._runs: list[bytearray] = []
        self._buffered = 0
        self._pos = 0
        self._lease: Any = None  # the inode's append lease while appends are buffered under it (a WriteSession)
        self._append_end = 0  # where the next append lands while the lease is held
        self._lease_start = 0  # where the appends under it began (the end meta gave)
        self._lease_wrote = False

    @property
    def closed(self) -> bool:
        """Whether the raw file is closed."""
        return bool(self.raw.closed)

    @property
    def buffered(self) -> int:
        """Bytes written here and not yet to storage."""
        return self._buffered

    @property
    def buffered_end(self) -> int:
        """The end of the last extent buffered here (0 when none): the file reaches at least that far."""
        return self._starts[-1] + len(self._runs[-1]) if self._runs else 0

    def readable(self) -> bool:
        """Whether the raw file reads (the mount reads through ``raw``)."""
        return self.raw.readable()

    def writable(self) -> bool:
        """Always: only files opened to write get a buffer."""
        return True

    def tell(self) -> int:
        """The position the next ``write`` lands at."""
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        """Moves the position (``SEEK_SET`` only: the mount gives offsets); nothing is sent."""
        if whence != io.SEEK_SET or offset < 0:
            raise ValueError(f"seek to {offset} (whence {whence}): only non-negative absolute positions")
        self._pos = offset
        return offset

    def write(self, b: Any) -> int:
        """Buffers ``b`` at the position (its quota reserved now: EDQUOT here, not at the flush); all of it.

        A write of the buffer's size or more goes straight to storage, after what is buffered.
        """
        data = memoryview(b).cast("B")
        n = len(data)
        if not n:
            return 0
        self.raw.ensure_room(self._pos + n)
        if n >= self._limit:
            self.flush()
            self.raw.write_extents([(self._pos, data)])
        else:
            self._add(self._pos, data)
            if self._buffered >= self._limit or len(self._runs) > MAX_EXTENTS:
                self.flush()
        self._pos += n
        return n

    def _add(self, at: int, data: memoryview) -> None:
        end = at + len(data)
        starts, runs = self._starts, self._runs
        i = bisect_right(starts, at) - 1  # the last extent starting at or before ``at``
        if i >= 0 and at <= starts[i] + len(runs[i]) and (i + 1 == len(starts) or end < starts[i + 1]):
            run, first = runs[i], starts[i]  # within or right after extent i, short of the next: in place
            grow = max(0, end - first - len(run))
            run[at - first : end - first] = data
            self._buffered += grow
            return
        lo = i if i >= 0 and at <= starts[i] + len(runs[i]) else i + 1
        hi = bisect_right(starts, end)  # extents lo..hi-1 overlap or touch [at, end]
        if lo == hi:
            starts.insert(lo, at)
            runs.insert(lo, bytearray(data))
            self._buffered += len(data)
            return
        first = min(starts[lo], at)
        merged = bytearray(max(starts[hi - 1] + len(runs[hi - 1]), end) - first)
        for k in range(lo, hi):
            merged[starts[k] - first : starts[k] - first + len(runs[k])] = runs[k]
            self._buffered -= len(runs[k])
        merged[at - first : end - first] = data
        starts[lo:hi] = [first]
        runs[lo:hi] = [merged]
        self._buffered += len(merged)

    @property
    def appending(self) -> bool:
        """Whether this file holds its inode's append lease (appends buffered here, given back at the next flush)."""
        return self._lease is not None

    def append(self, b: Any) -> int:
        """Buffers ``b`` at the file's end across clients, under the inode's append lease; the offset it lands at.

        The first append after a flush sends what is buffered, then takes the lease (``RawFile.open_append_lease``:
        no other client appends until it is given back); the appends after it are buffered one after another from
        there, and the next ``flush`` (fsync, close, the buffer full, or the mount's timer a moment later) sends
        them and gives the lease back with the new end. One lease round trip and one storage batch for a burst of
        appends, instead of each append its own (a log line cost two meta calls and a durable chain write). The
        caller keeps other handles of this client from appending to the inode meanwhile, and sends what they buffered
        first: an append under a held lease lands past what any writer of this client wrote since, too.
        """
        data = memoryview(b).cast("B")
        if self._lease is None:
            self.flush()
            self._lease, self._append_end = self.raw.open_append_lease()
            self._lease_start, self._lease_wrote = self._append_end, False
        else:  # another writer of this client may have written past the appends since (the caller sent its bytes)
            self._append_end = max(self._append_end, self.raw.client_length())
        start = self._append_end
        try:
            self.raw.ensure_room(start + len(data))  # an append lands whole or not at all
        except BaseException:
            if not self._runs:  # nothing appended under it yet: give it back now
                self._give_back()
            raise
        self._add(start, data)
        self._append_end = start + len(data)
        self._lease_wrote = self._lease_wrote or bool(len(data))
        if self._buffered >= self._limit or len(self._runs) > MAX_EXTENTS:
            self.flush()
        return start

    def flush(self) -> None:
        """Every buffered extent to storage, in one batch where they fit; kept for a later flush if it fails.

        Then the append lease, if held, goes back with the end of what was appended under it.
        """
        if self._runs:
            self.raw.write_extents([(at, memoryview(run)) for at, run in zip(self._starts, self._runs, strict=True)])
            self._starts, self._runs, self._buffered = [], [], 0
        if self._lease is not None:
            self._give_back()

    def _give_back(self, end: int | None = None) -> None:
        """The append lease back to meta, with the file's end after what was appended (``end``: what landed of it)."""
        lease, self._lease = self._lease, None
        assert lease is not None
        end = self._append_end if end is None else end
        self.raw.close_append_lease(lease, end, wrote=self._lease_wrote and end > self._lease_start)

    def flush_span(self, offset: int, size: int) -> None:
        """The buffered extents overlapping ``[offset, offset + size)`` to storage, the others kept.

        What a read there needs (and another handle's write there, so these older bytes cannot land over it later):
        extents elsewhere may wait, the order of writes to different bytes does not matter.
        """
        end = offset + size
        first = max(0, bisect_right(self._starts, offset) - 1)
        picked = [
            k for k in range(first, bisect_left(self._starts, end)) if self._starts[k] + len(self._runs[k]) > offset
        ]
        if not picked:
            return
        self.raw.write_extents([(self._starts[k], memoryview(self._runs[k])) for k in picked])
        for k in reversed(picked):
            self._buffered -= len(self._runs[k])
            del self._starts[k], self._runs[k]

    def fsync(self) -> None:
        """Flushes, then makes the file's length exact on meta (as the client's buffered files do)."""
        self.flush()
        self.raw.fsync()

    def truncate(self, size: int | None = None) -> int:
        """Flushes (so no buffered byte lands past the new end after it), then cuts or extends the file in meta."""
        self.flush()
        return self.raw.truncate(self._pos if size is None else size)

    def close(self) -> None:
        """Flushes and closes the raw file (its write session: the length exact on meta), even if the flush fails.

        Then what stays buffered is dropped, and the append lease, if held, goes back with the end of what landed:
        kept, meta would renew it with this client's other sessions, and no other client could append again.
        """
        if self.closed:
            return
        try:
            self.flush()
        finally:
            try:
                if self._lease is not None:  # the flush failed: the appends still buffered never land
                    with contextlib.suppress(OSError):  # meta away: closed once it answers (``close_session``)
                        self._give_back(self._starts[0] if self._runs else self._append_end)
            finally:
                self.raw.close()


def open_for_handle(fs: Any, path: str, mode: str, **kw: Any) -> Any:
    """``fs.open`` as a mount handle needs it: a raw file to read, an extent-buffered one to write (``mode`` with +)."""
    raw = fs.open(path, mode, buffering=0, **kw)
    return ExtentBufferedFile(raw) if "+" in mode else raw
