"""Files removed while open on the mount: a write session (the hold) keeps each inode until its last handle here goes.

Meta frees a file once its last name is gone and no write session is open on it. POSIX wants a removed file's open
descriptors to keep reading and writing it: before the last name of a file open here goes (unlink, rename over it),
the mount opens a session on it, closed with the file's last handle (``Hf3fsOperations.release``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import IO, Any

from ff_rpc import acting_as
from hf3fs.fuse.handles import Handle, HandleTable

logger = logging.getLogger("hf3fs.fuse.ops")  # logged as the callbacks' own


class RemovedOpenFiles:
    """The holds of the mount's removed open files, kept under the handle table's lock.

    A collaborator of the callbacks, as ``PendingFiles`` is.
    """

    def __init__(
        self, fs: Any, table: HandleTable, lstat: Callable[[str], Any], changed_inode: Callable[[int, Any], None]
    ) -> None:
        """Holds over ``fs``; ``lstat`` and ``changed_inode`` are the callbacks' (their attribute cache's)."""
        self.fs = fs
        self._table, self._lock = table, table.lock
        self._lstat, self._changed_inode = lstat, changed_inode
        self._holds: dict[int, IO[bytes]] = {}  # removed files still open here: inode -> its hold (a session)
        self._removed_open: set[int] = set()  # removed files kept by a writable handle's own session (no hold yet)

    def hold_if_open(self, path: str) -> None:
        """Before the last name of a file open here goes: keep a write session on it until its last handle is released.

        The session is opened as the mount's own user. Meta keeps an inode with no name while a session is open, so
        the open handles keep reading, writing and fstat-ing it, as POSIX wants; its chunks go when the hold closes.
        A read-only file of the mount's user (git's objects and packs are 0444) is made owner-writable for the Open,
        then given its mode back. Without write permission otherwise (a single-user mount of someone else's file) no
        hold is taken, and the handles fail once meta frees the file.

        A file with a writable handle here needs no new session: that handle's keeps the inode, and should it be
        released before read-only handles, it becomes the hold (``release``). SQLite removes its journal as soon as
        it closed it, while the kernel's release of the handle may still be on its way: no Open and Close for a hold
        per transaction.
        """
        with self._lock:
            if not self._table.by_inode:
                return
            open_inodes = set(self._table.by_inode)
        try:
            st = self._lstat(path)
        except OSError:
            return  # the removal itself reports it
        if st.type != "file" or st.nlink > 1 or st.inode_id not in open_inodes:
            return
        with self._lock:
            if st.inode_id in self._holds:
                return
            if any(self._table.handles[fh].writable for fh in self._table.by_inode.get(st.inode_id, ())):
                self._removed_open.add(st.inode_id)
                return
        try:
            with acting_as(None):
                held = self._open_hold(path, st.inode_id)
        except OSError as err:
            logger.info("%s: open but not held across its removal: %s", path, err)
            return
        with self._lock:
            self._holds[st.inode_id] = held

    def _open_hold(self, path: str, inode_id: int) -> Any:
        """A write session on the file at ``path``; its owner's own read-only file gets u+rw for the Open only."""
        try:
            return self.fs.open(path, "r+b", buffering=0)
        except PermissionError:
            mode = self.fs.stat_inode(inode_id).mode
            if mode & 0o600 == 0o600:
                raise
            self.fs.set_attr_inode(inode_id, mode=mode | 0o600)  # EPERM: not the mount's user's
            try:
                return self.fs.open(path, "r+b", buffering=0)
            finally:
                self._changed_inode(inode_id, self.fs.set_attr_inode(inode_id, mode=mode))

    def becomes_hold(self, h: Handle, fh: int) -> bool:
        """Whether a writable handle being released must keep its session as the hold of its removed file.

        It must when only read-only handles of it are left here.
        """
        with self._lock:
            if not h.writable or h.inode_id not in self._removed_open or h.inode_id in self._holds:
                return False
            others = [self._table.handles[o] for o in self._table.by_inode.get(h.inode_id, ()) if o != fh]
            if not others or any(o.writable for o in others):
                return False
            self._removed_open.discard(h.inode_id)
            return True

    def released(self, inode_id: int, kept: IO[bytes] | None, *, last: bool) -> IO[bytes] | None:
        """A handle of ``inode_id`` was released (the caller holds the table's lock): the hold to close now, if any.

        ``kept``: the handle's file, when it became the hold; ``last``: no handle of the inode is left here.
        """
        if kept is not None:
            self._holds[inode_id] = kept
        if not last:
            return None
        self._removed_open.discard(inode_id)
        return self._holds.pop(inode_id, None)
