"""O_APPEND handles of the mount: one appender per inode at a time here, and a held append lease given back soon.

An O_APPEND handle buffers its appends under the inode's append lease (``ExtentBufferedFile.append``) until its next
flush. The lease keeps every other client from appending, so it must not stay with a handle that went quiet: a log
file kept open and written once a minute would hold it for a minute, and its last line would wait unseen. The
flusher gives it back ``HOLD_S`` after the first append of a burst, whatever comes after (a steady appender takes
it again on its next append and so lets waiting clients in between). A flush that fails (storage away for a while)
is tried again ``RETRY_S`` later, until it lands or the handle's fsync or close takes over: meta renews the lease
with the mount's other write sessions, so a lease left with a quiet handle would keep every other appender out.
Each flush runs in a thread of its own, so one that waits on storage holds back no other file's lease.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import threading
import time

from hf3fs.fuse.extents import ExtentBufferedFile
from hf3fs.fuse.handles import Handle
from hf3fs.keyed_locks import KeyedLocks

logger = logging.getLogger(__name__)

HOLD_S = 0.05  # the longest an O_APPEND handle keeps the append lease and its appends buffered
RETRY_S = 1.0  # how soon a flush of a lease's holder that failed is tried again


class AppendLeases:
    """Per-inode order of the mount's appenders, and the thread that flushes a lease's holder ``HOLD_S`` on."""

    def __init__(self, hold_s: float = HOLD_S, retry_s: float = RETRY_S) -> None:
        self._hold_s, self._retry_s = hold_s, retry_s
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._inode_locks = KeyedLocks()
        self._due: list[tuple[float, int, Handle]] = []  # (when, tiebreak, handle) to flush
        self._queued: set[int] = set()  # ids of the handles in ``_due``
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def appending(self, inode_id: int) -> contextlib.AbstractContextManager[None]:
        """Held while one handle of this mount appends to ``inode_id`` (flushing the others, then its own append).

        Meta's lease is per client: two handles here that both took it would append at one offset.
        """
        return self._inode_locks.hold(inode_id)

    def __len__(self) -> int:
        """How many inodes have an appender here now (holding or awaiting their lock)."""
        return len(self._inode_locks)

    def held(self, h: Handle) -> None:
        """``h`` holds the append lease now: flush it ``HOLD_S`` from now unless it is queued already."""
        self._flush_in(h, self._hold_s)

    def _flush_in(self, h: Handle, delay_s: float) -> None:
        with self._lock:
            if id(h) in self._queued:
                return
            self._queued.add(id(h))
            heapq.heappush(self._due, (time.monotonic() + delay_s, next(self._order), h))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hf3fs-mount-appends", daemon=True)
                self._thread.start()
            self._wake.notify()

    def _run(self) -> None:  # a daemon thread: it ends with the mount's process
        while True:
            with self._lock:
                while not self._due or self._due[0][0] > time.monotonic():
                    self._wake.wait(None if not self._due else max(0.0, self._due[0][0] - time.monotonic()))
                _, _, h = heapq.heappop(self._due)
                self._queued.discard(id(h))
            # each in a thread of its own: a flush may wait on storage for its retry deadline (30 s), and the other
            # holders' leases must not wait behind it (their files' appenders elsewhere would)
            threading.Thread(target=self._give_back, args=(h,), name="hf3fs-mount-append-flush", daemon=True).start()

    def _give_back(self, h: Handle) -> None:
        with h.lock:
            f = h.file
            if f.closed or not isinstance(f, ExtentBufferedFile) or not f.appending:
                return
            try:
                f.flush()
            except Exception:  # the extents stay buffered, the lease held: tried again (or at its fsync, close)
                logger.exception("hf3fs mount: flushing the appends of inode %d failed", h.inode_id)
            else:
                return
        self._flush_in(h, self._retry_s)
