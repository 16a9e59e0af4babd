"""New small files the mount has not told meta about yet (write-back through the mount).

``tar x`` creates each file with ``O_WRONLY|O_CREAT|O_EXCL``, writes it, sets its mode and times and closes it:
a Create, a storage write, two SetAttrs and a Close per file when each goes to the cluster at once. A file created
so (single-user mounts) starts here instead: its bytes stay in the mount's memory, ``fchmod``/``futimens`` only
change what is kept, and its release hands it to the client's write-back (``FileSystem.write_back``), which
creates, writes and closes queued files in batches (``hf3fs.writeback``). Anything else that needs the file in
meta first (another open of it, an ``fsync``, a name operation on it or its folder, a listing of its folder, more
than ``MAX_PENDING_BYTES``) makes it real at once: created (exclusively), written, its times set.

What changes for the program: the file's inode number (``st_ino``) is a stand-in until the file reaches meta; an
``O_EXCL`` create is checked against what meta said moments ago (the kernel's lookup), so another client creating
the same name in that moment is overwritten rather than refused; errors of the deferred create (quota, a folder
removed meanwhile) are logged by the write-back, not returned to the program. Other clients see the file once its
batch is committed (``WritebackOptions.max_delay_s`` after the close, 50 ms by default).
"""

from __future__ import annotations

import io
import itertools
import logging
import os
import stat
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hf3fs.fs import Stat
from hf3fs.fuse.attrs import UNKNOWN, AttrCache

if TYPE_CHECKING:
    from hf3fs.fuse.handles import Handle

logger = logging.getLogger(__name__)

MAX_PENDING_BYTES = 1 << 20  # the write-back's own bound for a small file (WritebackOptions.max_file_bytes)
STAND_IN_INODES = itertools.count(1 << 62)  # inode numbers meta never hands out (ids are 48-bit at most here)


def deferrable(flags: int) -> bool:
    """Whether a create with these open flags may start as a pending file: write-only, exclusive."""
    return (flags & os.O_ACCMODE) == os.O_WRONLY and bool(flags & os.O_EXCL) and not flags & os.O_APPEND


@dataclass
class PendingFile:
    """What a pending file is: its name, permission bits and times (its bytes are its handle's BytesIO)."""

    path: str
    perm: int
    uid: int
    gid: int
    inode_id: int = field(default_factory=lambda: next(STAND_IN_INODES))
    ctime_ns: int = field(default_factory=time.time_ns)
    atime_ns: int = 0
    mtime_ns: int = 0  # 0: the time of its last write
    times_set: bool = False  # futimens was called (the times to give meta)

    def __post_init__(self) -> None:
        self.atime_ns = self.atime_ns or self.ctime_ns
        self.mtime_ns = self.mtime_ns or self.ctime_ns

    def stat(self, size: int) -> Stat:
        return Stat(inode_id=self.inode_id, type="file", mode=stat.S_IMODE(self.perm), uid=self.uid, gid=self.gid,
                    nlink=1, size=size, atime_ns=self.atime_ns, mtime_ns=self.mtime_ns,
                    ctime_ns=self.ctime_ns)  # fmt: skip

    def wrote(self) -> None:
        if not self.times_set:
            self.mtime_ns = time.time_ns()

    def set_times(self, atime_ns: int, mtime_ns: int) -> None:
        self.atime_ns, self.mtime_ns, self.times_set = atime_ns, mtime_ns, True
        self.ctime_ns = time.time_ns()

    def set_mode(self, perm: int) -> None:
        self.perm = perm
        self.ctime_ns = time.time_ns()

    def written_back_whole(self) -> bool:
        """Whether the write-back can carry everything set on it: it takes the bytes, the permission bits and the
        mtime; the atime becomes the time of the create, so an atime set by futimens must be that (``tar x``
        sets it to the time of extraction) or equal the mtime, else the file needs meta at once."""
        return not self.times_set or self.atime_ns == self.mtime_ns or abs(self.atime_ns - self.ctime_ns) < 10**9


def _under(path: str, name: str) -> bool:
    """Whether ``path`` is ``name`` itself or below it."""
    return path == name or path.startswith(name.rstrip("/") + "/")


def _size(h: Handle) -> int:
    return len(h.file.getvalue())  # type: ignore[attr-defined]  # a pending handle's file is a BytesIO


class PendingFiles:
    """The pending-file half of the FUSE callbacks (mixed into ``Hf3fsOperations``, whose state it uses)."""

    fs: Any
    options: Any
    _cache: AttrCache
    _lock: threading.Lock
    _handles: dict[int, Handle]
    _by_inode: dict[int, set[int]]
    _pending: dict[str, int]  # path -> the handle of the pending file there
    _uid: int
    _gid: int

    def _add(self, handle: Handle) -> int:
        raise NotImplementedError  # Hf3fsOperations'  own

    def _defer_create(self, path: str, perm: int, flags: int) -> int | None:
        """A handle on a new pending file at ``path``, when the create may wait (see the module docstring):
        meta said moments ago that nothing is there."""
        if not self.options.writeback or self.options.multi_user or self.options.keep_ids or not deferrable(flags):
            return None
        if self._cache.lookup(path) != (True, None):  # not known absent
            return None
        from hf3fs.fuse.handles import Handle

        pf = PendingFile(path, perm, self._uid, self._gid)
        fh = self._add(Handle(io.BytesIO(), pf.inode_id, True, pending=pf))
        with self._lock:
            self._pending[path] = fh
        self._cache.changed(path, pf.stat(0))
        return fh

    def _pending_at(self, path: str) -> Stat | None:
        with self._lock:
            fh = self._pending.get(path)
            h = self._handles.get(fh) if fh is not None else None
        return None if h is None or h.pending is None else self._pending_stat(h)

    def _pending_handle(self, path: str | None, fh: int | None) -> Handle | None:
        """The handle of the pending file a setattr names, by handle or by path (the kernel names the path for
        chmod and utimens even on an open file)."""
        with self._lock:
            if path is not None:
                fh = self._pending.get(path)
            h = self._handles.get(fh) if fh is not None else None
        return h if h is not None and h.pending is not None else None

    def _pending_stat(self, h: Handle) -> Stat:
        assert h.pending is not None
        with h.lock:
            return h.pending.stat(_size(h))

    def _settle(self, *names: str) -> None:
        """Make real every pending file at or below these names (a call on them needs meta to know it)."""
        with self._lock:
            if not self._pending:
                return
            fhs = [fh for path, fh in self._pending.items() if any(_under(path, n) for n in names)]
        for fh in fhs:
            self._materialize(fh)

    def _materialize(self, fh: int) -> None:
        """Create a pending file in meta now (exclusively), write its bytes, give it its times: its handle
        becomes an ordinary one."""
        h = self._handles.get(fh)
        if h is None:
            return
        with h.lock:
            pf = h.pending
            if pf is None:
                return
            data = h.file.getvalue()  # type: ignore[attr-defined]
            f = self.fs.open(pf.path, "x+b", perm=pf.perm)
            try:
                f.write(data)
                inode_id = int(getattr(f, "raw", f).inode_id)
                if pf.times_set:
                    f.flush()
                    self.fs.set_attr_inode(inode_id, ns=(pf.atime_ns, pf.mtime_ns))
            except BaseException:
                f.close()
                raise
            fake, h.file, h.inode_id, h.pending, h.dirty = h.inode_id, f, inode_id, None, bool(data)
            with self._lock:
                self._pending.pop(pf.path, None)
                self._by_inode.pop(fake, None)
                self._by_inode.setdefault(inode_id, set()).add(fh)
        self._cache.changed(pf.path, UNKNOWN)
        self._cache.changed_inode(fake)

    def _pending_write(self, fh: int, h: Handle, data: bytes, offset: int) -> bool:
        """Write into a pending file's memory: False (made real first) when it would grow past the bound."""
        if offset + len(data) > MAX_PENDING_BYTES:
            self._materialize(fh)
            return False
        with h.lock:
            if h.pending is None:  # made real meanwhile
                return False
            h.file.seek(offset)
            h.file.write(data)
            h.end = max(h.end, offset + len(data))
            h.pending.wrote()
        return True

    def _pending_changed(self, h: Handle) -> None:
        assert h.pending is not None
        self._cache.changed_inode(h.inode_id, self._pending_stat(h))

    def _pending_release(self, fh: int, h: Handle) -> bool:
        """Hand a released pending file to the write-back (or make it real when the write-back cannot carry all
        that was set on it); False when it is an ordinary handle by now."""
        with h.lock:
            pf = h.pending
            if pf is not None and pf.written_back_whole():
                data = h.file.getvalue()  # type: ignore[attr-defined]
                self.fs.write_back(pf.path, data, perm=pf.perm, mtime_ns=pf.mtime_ns)
                with self._lock:
                    self._pending.pop(pf.path, None)
                    self._handles.pop(fh, None)
                    self._by_inode.pop(h.inode_id, None)
                self._cache.changed(pf.path, pf.stat(len(data)))  # its stand-in until meta has it
                return True
        if pf is not None:
            self._materialize(fh)
        return False
