"""The mount's open files (FUSE file handles): each one's state, and the table of them by handle and by inode."""

from __future__ import annotations

import stat
import threading
import time
from dataclasses import dataclass, field
from typing import IO, Any

from hf3fs.entries import Stat
from hf3fs.fuse.extents import ExtentBufferedFile


@dataclass
class PendingFile:
    """What a pending file is: its name, permission bits and times (its bytes are its handle's BytesIO)."""

    path: str
    perm: int
    uid: int
    gid: int
    inode_id: int
    ctime_ns: int
    made_perm: int = 0  # the permission bits it was created with
    quota_id: int = 0  # the folder of the tightest byte quota over it (0: none)
    atime_ns: int = 0
    mtime_ns: int = 0  # 0: the time of its last write
    times_set: bool = False  # futimens was called (the times to give meta)
    atime_kept: bool = True  # no futimens gave it an atime (UTIME_OMIT: tar's)

    def __post_init__(self) -> None:
        self.atime_ns = self.atime_ns or self.ctime_ns
        self.mtime_ns = self.mtime_ns or self.ctime_ns

    def stat(self, size: int) -> Stat:
        """The Stat the mount answers for the file while it is pending, ``size`` bytes long."""
        return Stat(
            inode_id=self.inode_id,
            type="file",
            mode=stat.S_IMODE(self.perm),
            uid=self.uid,
            gid=self.gid,
            nlink=1,
            size=size,
            atime_ns=self.atime_ns,
            mtime_ns=self.mtime_ns,
            ctime_ns=self.ctime_ns,
        )

    def wrote(self) -> None:
        """Notes a write: the mtime becomes now, unless futimens set the times."""
        if not self.times_set:
            self.mtime_ns = time.time_ns()

    def set_times(self, atime_ns: int, mtime_ns: int, *, atime_kept: bool = False) -> None:
        """Notes a futimens: the times to give meta; ``atime_kept``: the atime was left as it was (UTIME_OMIT)."""
        self.atime_ns, self.mtime_ns, self.times_set = atime_ns, mtime_ns, True
        self.ctime_ns = time.time_ns()
        self.atime_kept = self.atime_kept and atime_kept

    def set_mode(self, perm: int) -> None:
        """Notes a chmod: the permission bits to give meta."""
        self.perm = perm
        self.ctime_ns = time.time_ns()

    def written_back_whole(self) -> bool:
        """Whether the write-back can carry everything set on it: it takes the bytes, the permission bits and the mtime.

        The atime becomes the time of the create, so an atime set by futimens must be that (``tar x`` sets it to the
        time of extraction) or equal the mtime, else the file needs meta at once.
        """
        return self.atime_kept or self.atime_ns == self.mtime_ns or abs(self.atime_ns - self.ctime_ns) < 10**9


@dataclass
class Handle:
    """An open file of the mount: the hf3fs file object, and what the mount tracks of it for flush and release."""

    file: IO[bytes]
    inode_id: int
    writable: bool
    end: int = 0  # highest byte written through this handle
    dirty: bool = False  # written since the length was last made exact on meta
    append: bool = False  # opened with O_APPEND: every write lands at the file's end across clients (ops.write)
    lock: threading.Lock = field(default_factory=threading.Lock)
    pending: PendingFile | None = None  # a new file meta does not know yet: ``file`` is a BytesIO (fuse.pending)


class HandleTable:
    """The open handles of a mount by number and by inode, and the lock the mount's shared state is kept under.

    ``handles`` and ``by_inode`` are read and changed under ``lock`` (with the other state the mount keeps under it).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.handles: dict[int, Handle] = {}
        self.by_inode: dict[int, set[int]] = {}  # inode -> its open handles here
        self._next_fh = 1

    def new_number(self) -> int:
        """A handle number not given out before (files and folders share them)."""
        with self.lock:
            fh = self._next_fh
            self._next_fh += 1
            return fh

    def add(self, handle: Handle) -> int:
        """Keep ``handle`` under a new number, which it returns."""
        with self.lock:
            fh = self._next_fh
            self._next_fh += 1
            self.handles[fh] = handle
            self.by_inode.setdefault(handle.inode_id, set()).add(fh)
            return fh

    def get(self, fh: int) -> Handle | None:
        """The handle numbered ``fh``, or None (released, or never given out)."""
        with self.lock:
            return self.handles.get(fh)

    def writers(self, inode_id: int) -> list[Handle]:
        """The writable handles of ``inode_id`` open here."""
        with self.lock:
            return [h for fh in self.by_inode.get(inode_id, ()) if (h := self.handles[fh]).writable]

    def has_writers(self) -> bool:
        """Whether any handle open here is writable."""
        with self.lock:
            return any(h.writable for h in self.handles.values())

    def cut(self, inode_id: int, length: int) -> None:
        """After a truncate of ``inode_id`` to ``length``: its writable handles count no byte past it."""
        for h in self.writers(inode_id):
            with h.lock:
                h.end = min(h.end, length)
                raw: Any = getattr(h.file, "raw", h.file)
                if isinstance(getattr(raw, "written", None), int):  # else its close reports the old end again
                    raw.written = min(raw.written, length)
                    raw.length = min(raw.length, length)
                    raw.meta_length = min(raw.meta_length, length)

    def flush_writers(self, inode_id: int, but: Handle | None = None, span: tuple[int, int] | None = None) -> int:
        """What the writable handles of ``inode_id`` (``but`` one) buffered, to storage: all, or what overlaps ``span``.

        ``span`` (offset, size): a read or write there needs only the bytes buffered in it. Returns the end of the
        bytes still buffered (0 when none are): the file reaches that far, though storage does not know it yet.
        """
        end = 0
        for h in self.writers(inode_id):
            with h.lock:
                if h.file.closed:
                    continue
                if h is not but:
                    if span is not None and isinstance(h.file, ExtentBufferedFile):
                        h.file.flush_span(*span)
                    else:
                        h.file.flush()
                if isinstance(h.file, ExtentBufferedFile):
                    end = max(end, h.file.buffered_end)
        return end
