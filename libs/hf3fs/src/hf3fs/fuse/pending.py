"""New small files whose bytes the mount keeps until their close (write-back through the mount).

``tar x`` creates each file with ``O_WRONLY|O_CREAT|O_EXCL``, writes it, sets its mode and times and closes it:
a Create, a storage write, two SetAttrs and a Close per file when each goes to the cluster at once. A file created
so (single-user mounts) is created in meta at once, exclusively and without a write session (so ``O_EXCL`` holds
across clients and the file has its inode), but its bytes stay in the mount's memory, ``fchmod``/``futimens`` only
change what is kept, and its release hands it to the client's write-back (``FileSystem.write_back``), which
writes and closes queued files in batches (``hf3fs.writeback``). Anything else that needs the bytes in meta first
(another open of it, an ``fsync``, a rename, link or removal of it or its folder, a listing of its folder, more than
``MAX_PENDING_BYTES``, more than its folder's byte quota has room for as the last Create told) writes them at once,
so a quota's EDQUOT comes at ``write(2)`` as without write-back.

What changes for the program: other clients see the file empty until its batch is committed
(``WritebackOptions.max_delay_s`` after the close, 50 ms by default); errors of the deferred write (a folder
renamed or removed by another client meanwhile, storage refusing, another client filling the quota) are logged by
the write-back, not returned to the program.
"""

from __future__ import annotations

import errno
import io
import logging
import os
import stat
from collections.abc import Callable
from typing import Any

from hf3fs.entries import Stat
from hf3fs.fuse.attrs import UNKNOWN, AttrCache
from hf3fs.fuse.extents import open_for_handle
from hf3fs.fuse.handles import Handle, HandleTable, PendingFile
from hf3fs.fuse.options import MountOptions

logger = logging.getLogger(__name__)

MAX_PENDING_BYTES = 1 << 20  # the write-back's own bound for a small file (WritebackOptions.max_file_bytes)
_REOPEN_ATTEMPTS = 3  # finds of a pending file's path by its inode before it is given up as moving (ESTALE)


def deferrable(flags: int) -> bool:
    """Whether a create with these open flags may start as a pending file: write-only, exclusive."""
    return (flags & os.O_ACCMODE) == os.O_WRONLY and bool(flags & os.O_EXCL) and not flags & os.O_APPEND


def _under(path: str, name: str) -> bool:
    """Whether ``path`` is ``name`` itself or below it."""
    return path == name or path.startswith(name.rstrip("/") + "/")


def _size(h: Handle) -> int:
    return len(h.file.getvalue())  # type: ignore[attr-defined]  # a pending handle's file is a BytesIO


class PendingFiles:
    """The mount's pending files: the callbacks ask it first about a name or handle that may be one.

    It keeps its state under the handle table's lock (a release drops the handle and the pending file at once).
    """

    def __init__(
        self, fs: Any, options: MountOptions, cache: AttrCache, table: HandleTable, owner: tuple[int, int]
    ) -> None:
        """Pending files of the mount over ``fs``; ``owner``: the (uid, gid) they are shown with."""
        self.fs, self.options = fs, options
        self._cache = cache
        self._table = table
        self._lock = table.lock  # the table's: it guards the state below too
        self._uid, self._gid = owner
        self._pending: dict[str, int] = {}  # path -> the handle of the pending file there
        self._quota_room: dict[int, int] = {}  # quota folder -> bytes its pending files may still hold (see _hold)

    def count(self) -> int:
        """How many files are pending now (the caller holds the table's lock for a snapshot with other counts)."""
        return len(self._pending)

    def defer_create(self, path: str, perm: int, flags: int) -> int | None:
        """A handle on a new pending file at ``path`` when its bytes may wait (see the module docstring).

        The file is created in meta now, exclusively and without a write session, so ``O_EXCL`` holds across clients
        (a lock file excludes) and it has its inode; its owner may write it (the write-back opens it).
        """
        if not self.options.writeback or self.options.multi_user or self.options.keep_ids or not deferrable(flags):
            return None
        made, room = self.fs.create_file(path, perm | stat.S_IWUSR, exclusive=True)
        pf = PendingFile(
            path,
            perm,
            self._uid,
            self._gid,
            made.inode_id,
            made.ctime_ns,
            made_perm=perm | stat.S_IWUSR,
            quota_id=room[1] if room else 0,
        )
        fh = self._table.add(Handle(io.BytesIO(), pf.inode_id, True, pending=pf))
        with self._lock:
            self._pending[path] = fh
        if room is not None:
            self._count_room(*room)
        self._cache.changed(path, pf.stat(0), made=True)
        return fh

    def stat_at(self, path: str) -> Stat | None:
        """The Stat of the pending file at ``path``; None when no file there is pending."""
        with self._lock:
            fh = self._pending.get(path)
            h = self._table.handles.get(fh) if fh is not None else None
        return None if h is None or h.pending is None else self.stat_of(h)

    def handle(self, path: str | None, fh: int | None) -> Handle | None:
        """The handle of the pending file a setattr names, by handle or by path.

        The kernel names the path for chmod and utimens even on an open file.
        """
        with self._lock:
            if path is not None:
                fh = self._pending.get(path)
            h = self._table.handles.get(fh) if fh is not None else None
        return h if h is not None and h.pending is not None else None

    def stat_of(self, h: Handle) -> Stat:
        """The Stat of the pending file of handle ``h`` (which must be pending), its size what it holds."""
        assert h.pending is not None
        with h.lock:
            return h.pending.stat(_size(h))

    def settle(self, *names: str) -> None:
        """Make real every pending file at or below these names (a call on them needs meta to know it)."""
        with self._lock:
            if not self._pending:
                return
            fhs = [fh for path, fh in self._pending.items() if any(_under(path, n) for n in names)]
        for fh in fhs:
            try:
                self.materialize(fh)
            except OSError as err:
                if err.errno != errno.ESTALE:
                    raise
                # removed by another client: the name is not this file's any more (its handle keeps what it holds)

    def materialize(self, fh: int) -> None:
        """Write a pending file's bytes and times to its inode now: its handle becomes ordinary.

        Raises:
            OSError: ESTALE when another client removed the file (the handle stays pending, no longer at its name).
        """
        h = self._table.handles.get(fh)
        if h is None:
            return
        with h.lock:
            pf = h.pending
            if pf is None:
                return
            data = h.file.getvalue()  # type: ignore[attr-defined]
            f = self._reopen(fh, pf)
            try:
                f.write(data)
                f.flush()
                if pf.perm != pf.made_perm:
                    self.fs.set_attr_inode(pf.inode_id, mode=pf.perm)
                if pf.times_set:
                    self.fs.set_attr_inode(pf.inode_id, ns=(pf.atime_ns, pf.mtime_ns))
            except BaseException:
                f.close()
                raise
            h.file, h.pending, h.dirty = f, None, bool(data)
            with self._lock:
                if self._pending.get(pf.path) == fh:
                    del self._pending[pf.path]
        self._cache.changed(pf.path, UNKNOWN)

    def _reopen(self, fh: int, pf: PendingFile) -> Any:
        """The pending file's own inode opened to write, at the name it has now.

        Another client may have renamed it (or a folder above it) since its create, and put another file at its
        name: opened by its old path, that other file got the bytes and this one stayed empty. Its name is checked
        first (a Stat of the path: no commit of the write-back's queue, which a call by inode would wait for); a name
        that holds another inode, or none, is asked of meta by the inode. The file opened must be that inode.
        """
        path = pf.path
        for _ in range(_REOPEN_ATTEMPTS):
            try:
                if not self._holds_inode(path, pf.inode_id):
                    path = self.fs.realpath_inode(pf.inode_id)
            except FileNotFoundError:
                self._gone(fh, pf)
                raise OSError(errno.ESTALE, "removed by another client before its bytes went", pf.path) from None
            try:
                f = open_for_handle(self.fs, path, "r+b")
            except FileNotFoundError:
                continue  # renamed or removed meanwhile: looked for again
            if getattr(f, "raw", f).inode_id == pf.inode_id:
                return f
            f.close()
        raise OSError(errno.ESTALE, "renamed again and again by another client", pf.path)

    def _holds_inode(self, path: str, inode_id: int) -> bool:
        """Whether the name ``path`` reaches ``inode_id`` now."""
        try:
            return bool(self.fs.lstat(path).inode_id == inode_id)
        except FileNotFoundError:
            return False

    def _gone(self, fh: int, pf: PendingFile) -> None:
        """A pending file another client removed: its name shows what meta has there now; its handle keeps its bytes."""
        with self._lock:
            if self._pending.get(pf.path) == fh:
                del self._pending[pf.path]
        self._cache.changed(pf.path, UNKNOWN)

    def _count_room(self, room: int, quota_id: int) -> None:
        """Meta's word on a byte quota (``room`` bytes left, as of a Create just now) less what this mount holds.

        What this mount holds that meta does not count yet: bytes of open pending files and of files queued for
        write-back under it.
        """
        with self._lock:
            handles = [self._table.handles.get(fh) for fh in self._pending.values()]
        held = sum(h.end for h in handles if h is not None and h.pending is not None and h.pending.quota_id == quota_id)
        held += self.fs.writeback_held_bytes(quota_id)
        with self._lock:
            self._quota_room[quota_id] = room - held

    def _hold(self, pf: PendingFile, grow: int) -> bool:
        """Count ``grow`` more bytes of a pending file against its quota's room; False (none counted) if they don't fit.

        The file must then be written through, where meta reserves its bytes (EDQUOT at write(2)). The room is meta's
        at the last Create under that quota less what this mount holds since, so it errs on the side of writing
        through (another client's writes meanwhile are meta's to refuse, at the write-back).
        """
        if not pf.quota_id or grow <= 0:
            return True
        with self._lock:
            left = self._quota_room.get(pf.quota_id, 0)
            if grow > left:
                return False
            self._quota_room[pf.quota_id] = left - grow
        return True

    def write(self, fh: int, h: Handle, data: bytes, offset: int) -> bool:
        """Write into a pending file's memory: False (made real first) when it would grow past the bound or its quota.

        Its quota: what its folder's byte quota allows.
        """
        if offset + len(data) > MAX_PENDING_BYTES:
            self.materialize(fh)
            return False
        with h.lock:
            if h.pending is None:  # made real meanwhile
                return False
            fits = self._hold(h.pending, offset + len(data) - h.end)
            if fits:
                h.file.seek(offset)
                h.file.write(data)
                h.end = max(h.end, offset + len(data))
                h.pending.wrote()
        if not fits:
            self.materialize(fh)
        return fits

    def set_attrs(self, h: Handle | None, change: Callable[[PendingFile], None]) -> bool:
        """Apply a setattr to a pending file, under its handle's lock; False when it is not pending (any more).

        No longer pending: its release handed it to the write-back meanwhile. The setattr must then go to meta.
        """
        if h is None:
            return False
        with h.lock:
            if h.pending is None:
                return False
            change(h.pending)
            st = h.pending.stat(_size(h))
        self._cache.changed_inode(h.inode_id, st)
        return True

    def release(self, fh: int, h: Handle) -> bool:
        """Hand a released pending file to the write-back; False when it is an ordinary handle by now.

        It is made real instead when the write-back cannot carry all that was set on it; should that fail (another
        client removed it, meta away), it goes to the write-back all the same, without its atime: a handle kept
        pending past its release would leave its name showing a file here, whatever meta has there, until unmount.
        """
        with h.lock:
            pf = h.pending
            if pf is None:
                return False
            whole = pf.written_back_whole()
        if not whole:
            try:
                self.materialize(fh)
            except OSError as err:
                logger.warning("%s: not made real at its close (%s): written back without its atime", pf.path, err)
        with h.lock:
            pf = h.pending
            if pf is not None:
                data = h.file.getvalue()  # type: ignore[attr-defined]
                # a mode set since the create (tar's fchmod) goes with the batch's Create: meta checks that the owner
                # may write it, then applies it (a mode without owner write too), no SetAttr of its own
                # by its inode: written into this file wherever another client moved it, never into one that took
                # its name
                queued = UNKNOWN
                try:
                    self.fs.write_back(
                        pf.path,
                        data,
                        perm=pf.perm,
                        mtime_ns=pf.mtime_ns,
                        set_mode=pf.perm != pf.made_perm,
                        inode_id=pf.inode_id,
                        quota_id=pf.quota_id,
                    )
                    queued = pf.stat(len(data))  # what meta will have once it commits
                except BaseException as err:
                    logger.error("%s: its bytes could not be handed to the write-back: %s", pf.path, err)
                    raise
                finally:  # the handle goes either way (kept, its name would show it here until unmount)
                    h.pending = None  # a setattr or open that looked the handle up before waits on its lock: meta now
                    with self._lock:
                        if self._pending.get(pf.path) == fh:
                            del self._pending[pf.path]
                        self._table.handles.pop(fh, None)
                        self._table.by_inode.pop(h.inode_id, None)
                    self._cache.changed(pf.path, queued)
                return True
        return False
