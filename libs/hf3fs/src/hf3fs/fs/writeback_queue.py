"""The write-back queue of one FileSystem (``hf3fs.writeback``), made on first use."""

from __future__ import annotations

import threading

from fireflyer.meta.v1 import meta_pb2 as pb
from hf3fs.fs.connection import Connection
from hf3fs.fs.exits import commit_at_exit
from hf3fs.writeback import PendingFile, Writeback, WritebackError, WritebackOptions, WritebackStats, places_of


class WritebackQueue:
    """The file system's side of write-back: its queue (a ``Writeback`` and its flushers, from the first file queued).

    Before any other meta call of this client, it commits the queued files the call names, so the client sees
    them as committed.
    """

    def __init__(self, conn: Connection, options: WritebackOptions) -> None:
        self._conn = conn
        self.options = options
        self._wb: Writeback | None = None
        self._lock = threading.Lock()

    @property
    def started(self) -> Writeback | None:
        """The queue, once a file was queued (None before)."""
        return self._wb

    def queue(self) -> Writeback:
        """The queue, made (its flushers started, its commit at exit set) the first time."""
        with self._lock:
            if self._wb is None:
                self._wb = Writeback(self._conn, self.options)
                commit_at_exit(self)
            return self._wb

    def submit(self, item: PendingFile) -> None:
        """Queue ``item`` (see ``Writeback.submit``)."""
        self.queue().submit(item)

    def before_meta_call(self, request: object) -> None:
        """Commit the queued files ``request`` names first (not on a flusher, which makes the calls of a commit)."""
        wb = self._wb
        if wb is None or not wb.busy() or wb.on_flusher():
            return
        folder_blind = isinstance(request, _FOLDER_BLIND)
        if wb.related(places_of(request), makes_name=_makes_name(request), folder_blind=folder_blind):
            wb.flush()

    def sync(self) -> None:
        """Commit everything queued; ``WritebackError`` for the files that failed since the last ``sync``."""
        if self._wb is None:
            return
        self._wb.flush()
        failures = self._wb.take_errors()
        if failures:
            raise WritebackError(failures)

    def pending(self) -> int:
        """How many files are queued or being committed."""
        return self._wb.pending() if self._wb is not None else 0

    def stats(self) -> WritebackStats:
        """The queue's counts (all zero before the first file was queued)."""
        return self._wb.stats() if self._wb is not None else WritebackStats()

    def held_bytes(self, quota_id: int) -> int:
        """Bytes of files queued or being committed with this ``quota_id``."""
        return self._wb.held_bytes(quota_id) if self._wb is not None else 0

    def close(self) -> list[tuple[str, OSError]]:
        """Commit what is queued and stop the flushers; the files that failed since the last ``sync``."""
        if self._wb is None:
            return []
        self._wb.close()
        return self._wb.take_errors()

    def commit_before_exit(self) -> None:
        """The process exits: commit what is queued, if the file system is open in this process."""
        if not self._conn.closed and self._wb is not None and self._conn.in_origin_process():
            self._wb.flush()


# Requests whose answer about a folder does not depend on the files below it (``Writeback.related``'s
# ``folder_blind``): a stat of the folder, its real path. Not a setattr: a chmod or chown could take away the search
# permission the queued files' commit needs, so it commits them first.
_FOLDER_BLIND = (pb.StatRequest, pb.BatchStatRequest, pb.RealpathRequest)


def _makes_name(request: object) -> bool:
    """Whether a meta request only makes a new name (``Writeback.related``'s ``makes_name``)."""
    if isinstance(request, pb.CreateRequest):
        return request.exclusive
    return isinstance(request, (pb.MkdirsRequest, pb.SymlinkRequest, pb.MknodRequest))
