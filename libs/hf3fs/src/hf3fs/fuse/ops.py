"""The FUSE callbacks of ``hf3fs mount``, multi-threaded, over one client.

Every FUSE callback becomes a call on the synchronous :class:`hf3fs.FileSystem`; each open gets its own file
object (positional reads and writes under a per-handle lock). Errors keep the errno the client raised. Sizes of
files being written through a handle of this mount are reported up to the highest byte written, even before
the client's buffers reach storage, so the kernel never shrinks a file that is being written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from typing import IO, Any

import mfusepy

from ff_rpc import acting_as
from hf3fs.entries import Stat
from hf3fs.fuse.appends import AppendLeases
from hf3fs.fuse.attrs import ABSENT, UNKNOWN, AttrCache
from hf3fs.fuse.callers import as_caller, drops_set_id_bits_only, fuse_errors
from hf3fs.fuse.extents import open_for_handle
from hf3fs.fuse.handles import Handle, HandleTable, PendingFile
from hf3fs.fuse.holds import RemovedOpenFiles
from hf3fs.fuse.listings import ListingMark, list_folder
from hf3fs.fuse.options import DEFAULT_OPTIONS, MountOptions
from hf3fs.fuse.pending import PendingFiles

logger = logging.getLogger(__name__)

UTIME_NOW, UTIME_OMIT = (1 << 30) - 1, (1 << 30) - 2
STATFS_BLOCK_BYTES = 4096
FREE_INODES = 1 << 40  # 3FS has no inode table to fill; report plenty
MOUNT_STATS_XATTR = "user.hf3fs.mount_stats"  # the root's attribute with the mount's counters (``getxattr``)
IO_REQUEST_BYTES = 1 << 20  # the largest read/write the kernel sends (its FUSE limit is 256 pages)
FALLOC_FL_KEEP_SIZE = 0x01  # linux/falloc.h
_STAT_ATTEMPTS = 8


def _pread(f: IO[bytes], offset: int, size: int) -> bytes:
    """``size`` bytes at ``offset`` from the raw file under a buffered one, its position kept.

    Reading through the buffered layer would answer later reads from what it read ahead, which another handle or
    process may have overwritten since (SQLite's pages, with the lock that orders them held by someone else).
    """
    raw: Any = getattr(f, "raw", f)
    here = raw.tell()
    try:
        raw.seek(offset)
        return bytes(raw.read(size) or b"")
    finally:
        raw.seek(here)


class Hf3fsOperations(mfusepy.Operations):  # type: ignore[misc]  # mfusepy is untyped
    """The FUSE callbacks over one :class:`hf3fs.FileSystem`."""

    use_ns = True  # times in integer nanoseconds (utimens, getattr)
    # libfuse's nullpath_ok: calls on an open handle come without a path (the handle says which inode), so they
    # keep working after the file's last name is gone (mfusepy sets it only with both flags).
    flag_nullpath_ok = True
    flag_nopath = True

    def __init__(self, fs: Any, options: MountOptions = DEFAULT_OPTIONS, on_ready: Callable[[], None] | None = None):
        self.fs, self.options, self.on_ready = fs, options, on_ready
        self._uid, self._gid = os.getuid(), os.getgid()
        self._real_ids = options.keep_ids or options.multi_user
        self._table = HandleTable()  # the open handles
        self._appends = AppendLeases()  # O_APPEND handles holding their inode's append lease
        self._lock = self._table.lock  # the table's, which guards the mount's state below too
        self._releases = 0  # writable handles released so far (each after its close made the length exact)
        self._released = 0  # handles released so far, all kinds (the mount's stats)
        self._dirs: dict[int, str] = {}  # open folders: handle -> path
        self._cache = AttrCache(options.attr_timeout_s)  # meta's recent answers (see hf3fs.fuse.attrs)
        # new files meta does not know yet (hf3fs.fuse.pending)
        self._pending = PendingFiles(fs, options, self._cache, self._table, (self._uid, self._gid))
        self._holds = RemovedOpenFiles(fs, self._table, self._lstat, self._changed_inode)  # removed, still open here

    # ---- handles ----

    def _get(self, fh: int) -> Handle:
        handle = self._table.get(fh)
        if handle is None:
            raise mfusepy.FuseOSError(errno.EBADF)
        return handle

    # ---- attributes ----

    def _stat(self, path: str) -> dict[str, Any]:
        """Attributes of ``path``: meta's, with a file's size raised to what open handles here have written.

        A writer's release makes the length exact on meta and only then drops the handle. Should one finish
        between the meta stat and the look at the handles, both would miss its bytes (a size the kernel then
        caches: git met "object file is empty" that way), so the stat is taken again (a few times at most:
        under a storm of releases elsewhere the last answer stands).
        """
        for _ in range(_STAT_ATTEMPTS):
            with self._lock:
                releases = self._releases
            st = self._lstat(path)
            attrs = self._attrs(st)
            if st.type != "file":
                return attrs
            with self._lock:
                if self._releases == releases:
                    return attrs
        return attrs

    def _lstat(self, path: str) -> Any:
        """The lstat of ``path`` from meta, or what meta said moments ago (the attribute cache)."""
        if (pending := self._pending.stat_at(path)) is not None:
            return pending
        known, st = self._cache.lookup(path)
        if known:
            if st is ABSENT:
                raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
            return st
        since = self._cache.generation()
        try:
            st = self.fs.lstat(path)
        except FileNotFoundError:
            self._cache.remember(path, ABSENT, since)  # as the kernel's negative entry: a create may follow
            raise
        self._cache.remember(path, st, since)
        return st

    def _stat_inode(self, inode_id: int) -> Any:
        st = self._cache.lookup_inode(inode_id)
        if st is ABSENT:
            since = self._cache.generation()
            st = self.fs.stat_inode(inode_id)
            self._cache.remember(None, st, since)
        return st

    @contextlib.contextmanager
    def _changing(self, path: str) -> Iterator[None]:
        """Around a change of ``path`` through meta: should it fail half way, nothing cached about it stays."""
        try:
            yield
        except BaseException:
            self._cache.forget(path)
            raise

    def _changed_inode(self, inode_id: int, st: Any = ABSENT) -> None:
        self._cache.changed_inode(inode_id, st if isinstance(st, Stat) else ABSENT)

    def _attrs(self, st: Any) -> dict[str, Any]:
        size = st.size
        if st.type == "file":
            size = max([size, *(h.end for h in self._table.writers(st.inode_id))])
        return {
            "st_mode": st.st_mode,
            "st_ino": st.inode_id,
            "st_nlink": st.nlink,
            "st_uid": st.uid if self._real_ids else self._uid,
            "st_gid": st.gid if self._real_ids else self._gid,
            "st_size": size,
            "st_blocks": (size + 511) // 512,
            "st_blksize": st.chunk_size or 1 << 20,
            "st_rdev": st.rdev,
            "st_atime": st.atime_ns,
            "st_mtime": st.mtime_ns,
            "st_ctime": st.ctime_ns,
        }

    def init_with_config(self, conn_info: Any, config_3: Any) -> None:
        """FUSE init: asks for 1 MiB requests, and reports the mount ready (``on_ready``) once it answers."""
        if conn_info is not None:
            # 1 MiB requests instead of 128 KiB: a quarter of the Python callbacks per byte moved.
            conn_info.max_write = IO_REQUEST_BYTES
            conn_info.max_readahead = IO_REQUEST_BYTES
        if self.on_ready is not None:
            # libfuse calls init before it serves; a thread reports readiness once the mount answers.
            threading.Thread(target=self.on_ready, name="hf3fs-mount-ready", daemon=True).start()

    @as_caller
    def getattr(self, path: str | None, fh: int | None = None) -> dict[str, Any]:
        """stat/lstat (by path) and fstat (by handle, which works after the file's last name is gone)."""
        if path is None and fh is not None:  # fstat of a file whose last name is gone: by its inode, which
            h = self._get(fh)
            if h.pending is not None:
                return self._attrs(self._pending.stat_of(h))
            with acting_as(None):  # its handle keeps (fstat needs no permission: as the mount's own user)
                return self._attrs(self._stat_inode(h.inode_id))
        if path is None:
            raise mfusepy.FuseOSError(errno.ENOENT)
        return self._stat(path)

    @as_caller
    def opendir(self, path: str) -> int:
        """Checks now that the folder exists and may be looked at, as the C library's opendir does; readdir lists it."""
        if not self._cache.exists(path):  # made or seen here moments ago: it is there
            self._lstat(path)  # ENOENT/EACCES now, as opendir(3) gets them (the kernel resolved symlinks)
        fh = self._table.new_number()
        with self._lock:
            self._dirs[fh] = path
        return fh

    def readdir(self, path: str | None, fh: int) -> list[Any]:
        """The folder's names with their attributes (``listing``)."""
        return self.listing(path, fh)[1]

    @as_caller
    def listing(self, path: str | None, fh: int) -> tuple[ListingMark, list[Any]]:
        """The folder's names with their attributes, from the listing (files pending here committed first: they show).

        Whole attributes (what getattr would answer; readdirplus hands them to the kernel, ``serve._Fuse``) except for
        files open for writing here, whose size this mount knows better than the listing: type and inode number only,
        and the kernel asks getattr. With the mark of this mount's state just before meta listed the folder, which
        ``still_whole`` compares when a later page of the listing goes to the kernel.
        """
        with self._lock:
            where = self._dirs.get(fh, path)  # no path with nullpath_ok: the folder opendir named
        if where is None:
            raise mfusepy.FuseOSError(errno.EBADF)
        self._pending.settle(where)  # a listing shows the files made here that meta does not know yet
        mark = self._listing_mark()
        entries = list_folder(self.fs, where, self._listed_attrs)
        # its age from meta's last answer (a listing of many pages takes a while: its first page would be old already)
        return dataclasses.replace(mark, taken_at=time.monotonic()), entries

    def _listed_attrs(self, st: Stat) -> dict[str, Any]:
        if st.type == "file" and self._table.writers(st.inode_id):  # its size is known better here
            return {"st_mode": st.st_mode, "st_ino": st.inode_id}
        return self._attrs(st)

    def _listing_mark(self) -> ListingMark:
        with self._lock:
            return ListingMark(self._releases, self._cache.generation(), time.monotonic())

    def still_whole(self, attrs: dict[str, Any], mark: ListingMark) -> bool:
        """Whether a listing's attributes of an entry may still go to the kernel as whole (readdirplus).

        A folder's later pages go out from the listing taken at its first, maybe long after. Since then a file may
        have been opened for writing here (its handles know its size), a writer here may have released (meta's
        length is newer than the listing's: its release makes the length exact, as in ``_stat``), anything may
        have changed through this mount (the attribute cache's generation), or the listing may have grown older
        than the attribute timeout (another client's changes, which a getattr would show by then). The kernel
        takes what readdirplus hands it over what it knew (the size a write through it made) and keeps it for the
        attribute timeout: such an entry goes with its type and inode number only, and the kernel asks getattr.
        """
        # the handles first: a release bumps the generation before its handle leaves the table
        if stat.S_ISREG(attrs["st_mode"]) and self._table.writers(attrs["st_ino"]):
            return False
        return mark.still_holds(self._listing_mark(), self.options.attr_timeout_s)

    def releasedir(self, path: str | None, fh: int) -> int:
        """Forgets the folder handle."""
        with self._lock:
            self._dirs.pop(fh, None)
        return 0

    @as_caller
    def readlink(self, path: str) -> str:
        """The symlink's target."""
        return str(self.fs.readlink(path))

    @as_caller
    def statfs(self, path: str | None) -> dict[str, int]:
        """statvfs: the cluster's space in 4 KiB blocks, or a byte quota's over ``path`` when it leaves less room."""
        s = self.fs.statfs(path or None)  # df of a folder under a byte quota shows the quota
        bs = STATFS_BLOCK_BYTES
        return {
            "f_bsize": bs,
            "f_frsize": bs,
            "f_blocks": s.capacity_bytes // bs,
            "f_bfree": s.free_bytes // bs,
            "f_bavail": s.free_bytes // bs,
            "f_files": s.num_inodes + FREE_INODES,
            "f_ffree": FREE_INODES,
            "f_favail": FREE_INODES,
            "f_namemax": 255,
        }

    def getxattr(self, path: str, name: str, position: int = 0) -> bytes:
        """The mount's own counters as JSON, as ``user.hf3fs.mount_stats`` of its root; no other attribute (ENOTSUP).

        ``open_handles``, ``pending_files`` (new files whose bytes are still in memory), ``releases`` (handles the
        kernel released so far, each counted once its release is done) and ``writeback`` (``hf3fs.WritebackStats``:
        files queued, in flight, submitted, settled, failed). A program that closed files can wait on them for its
        data to be in the cluster: ``getfattr -n user.hf3fs.mount_stats --only-values MOUNT``.
        """
        if path != "/" or name != MOUNT_STATS_XATTR:
            raise mfusepy.FuseOSError(errno.ENOTSUP)
        with self._lock:
            mine = {
                "open_handles": len(self._table.handles),
                "pending_files": self._pending.count(),
                "releases": self._released,
            }
        return json.dumps({**mine, "writeback": dataclasses.asdict(self.fs.writeback_stats())}).encode()

    @as_caller
    def chmod(self, path: str | None, mode: int, fh: int | None = None) -> int:
        """chmod/fchmod; a pending new file keeps its mode until its write-back."""
        if self._pending.set_attrs(self._pending.handle(path, fh), lambda pf: pf.set_mode(mode & 0o7777)):
            return 0
        if path is None:  # fchmod
            inode = self._inode_of(fh)
            self._changed_inode(inode, self.fs.set_attr_inode(inode, mode=mode & 0o7777))
            return 0
        self._pending.settle(path)
        with self._changing(path):
            if self.options.multi_user and drops_set_id_bits_only(self.fs, path, mode):
                with acting_as(None):  # the kernel clearing set-id bits after a write by a non-owner (POSIX)
                    st = self.fs.chmod(path, mode & 0o7777, follow_symlinks=False)
            else:
                st = self.fs.chmod(path, mode & 0o7777, follow_symlinks=False)  # the kernel resolved the path
        self._cache.changed(path, st if isinstance(st, Stat) else UNKNOWN)
        return 0

    def _inode_of(self, fh: int | None) -> int:
        if fh is None:
            raise mfusepy.FuseOSError(errno.EBADF)
        return self._get(fh).inode_id

    @as_caller
    def chown(self, path: str | None, uid: int, gid: int, fh: int | None = None) -> int:
        """chown/fchown; without real ids the mounting user's ids stand for "as it is" (-1)."""
        if not self._real_ids:  # the mounting user's ids stand for "the owner as it is"
            uid = -1 if uid == self._uid else uid
            gid = -1 if gid == self._gid else gid
        if uid == -1 and gid == -1 and not self.options.multi_user:
            return 0
        if path is None:  # fchown
            if fh is not None and self._get(fh).pending is not None:
                self._pending.materialize(fh)
            inode = self._inode_of(fh)
            self._changed_inode(inode, self.fs.set_attr_inode(inode, uid=uid, gid=gid))
            return 0
        # lchown, fchownat(AT_SYMLINK_NOFOLLOW) and chown all reach here on the inode the kernel resolved
        self._pending.settle(path)
        with self._changing(path):
            st = self.fs.chown(path, uid, gid, follow_symlinks=False)
        self._cache.changed(path, st if isinstance(st, Stat) else UNKNOWN)
        return 0

    @as_caller
    def utimens(self, path: str | None, times: tuple[int, int] | None = None, fh: int | None = None) -> int:
        """utimensat/futimens, with UTIME_NOW and UTIME_OMIT; bytes written before land before the new times."""
        atime, mtime = times if times is not None else (UTIME_NOW, UTIME_NOW)
        if atime == mtime == UTIME_OMIT:
            return 0
        inode = self._inode_of(fh) if path is None else None  # futimens
        where = path or ""
        ph = self._pending.handle(path, fh)
        pending = ph.pending if ph is not None else None
        if path is not None and pending is None:
            self._pending.settle(path)  # pending files below a folder: in meta before its times are set
        if pending is not None:
            now_ns = time.time_ns()

            def times_of(pf: PendingFile) -> None:  # UTIME_OMIT keeps the one it has (tar's atime)
                a, m = (
                    pf_t if t == UTIME_OMIT else now_ns if t == UTIME_NOW else t
                    for t, pf_t in ((atime, pf.atime_ns), (mtime, pf.mtime_ns))
                )
                pf.set_times(a, m, atime_kept=atime == UTIME_OMIT)

            if self._pending.set_attrs(ph, times_of):
                return 0
            pending = None  # handed to the write-back meanwhile: by path through meta (which commits it first)
        if self._table.has_writers():  # bytes written before the new times must not land after them (a later mtime)
            self._table.flush_writers(inode if inode is not None else self._lstat(where).inode_id)
        ns: tuple[int, int] | None = None  # None: "now" (needs write permission only, not ownership: POSIX)
        if not atime == mtime == UTIME_NOW:
            now = time.time_ns()
            if UTIME_OMIT in (atime, mtime):
                st = self._lstat(where) if inode is None else self._stat_inode(inode)
                atime = st.atime_ns if atime == UTIME_OMIT else atime
                mtime = st.mtime_ns if mtime == UTIME_OMIT else mtime
            ns = (int(now if atime == UTIME_NOW else atime), int(now if mtime == UTIME_NOW else mtime))
        if inode is not None:
            self._changed_inode(inode, self.fs.set_attr_inode(inode, ns=ns, now=ns is None))
            return 0
        with self._changing(where):
            st = self.fs.utime(where, ns, follow_symlinks=False)  # the symlink itself if one
        self._cache.changed(where, st if isinstance(st, Stat) else UNKNOWN)
        return 0

    # ---- names ----

    @as_caller
    def mkdir(self, path: str, mode: int) -> int:
        """mkdir; the new folder is known empty here, so lookups of names in it need no meta call for a while.

        Pending files need not be made real first, here or for mknod and symlink: they are in meta already (created
        at once), so a name they hold, or one below them, is refused as it would be (``tar x``'s mkdir of a folder
        above files just closed waited for them, 15-35 ms each).

        On a single-user mount, a name this mount knows to exist (made or seen here within the attribute timeout) is
        EEXIST at once, as the kernel's own entry would answer: ``tar x`` makes each parent of a path again, and meta's
        answer waited behind the write-back's batches in meta's writer queue (17-20 ms per mkdir of a folder that
        exists). A multi-user mount asks meta, whose answer checks the caller's permissions on the folders above.
        """
        if not self.options.multi_user and self._cache.exists(path):
            raise mfusepy.FuseOSError(errno.EEXIST)
        with self._changing(path):
            st = self.fs.mkdir(path, mode & 0o7777)
        self._cache.changed(path, st if isinstance(st, Stat) else UNKNOWN, new_dir=True, made=True)
        return 0

    @as_caller
    def mknod(self, path: str, mode: int, dev: int) -> int:
        """mknod: an empty regular file, or a device, FIFO or socket node."""
        with self._changing(path):
            if stat.S_ISREG(mode):  # mknod(S_IFREG) makes an empty file
                st = self.fs.create(path, stat.S_IMODE(mode), exclusive=True)
            else:
                st = self.fs.mknod(path, mode, dev)
        self._cache.changed(path, st if isinstance(st, Stat) else UNKNOWN, made=True)
        return 0

    @as_caller
    def rmdir(self, path: str) -> int:
        """Removes an empty folder (rmdir)."""
        self._pending.settle(path)
        with self._changing(path):
            self.fs.rmdir(path)
        self._cache.changed(path, ABSENT)
        return 0

    @as_caller
    def unlink(self, path: str) -> int:
        """unlink; a file still open here keeps its inode (and its handles keep working) until its last release."""
        self._pending.settle(path)
        self._holds.hold_if_open(path)
        with self._changing(path):
            self.fs.remove(path)
        self._cache.changed(path, ABSENT)
        return 0

    @as_caller
    def rename(self, old: str, new: str) -> int:
        """A rename in meta (atomic); a file renamed over is kept for its handles here, as unlink keeps it."""
        self._pending.settle(old, new)
        self._holds.hold_if_open(new)  # a file renamed over loses its last name too
        try:
            self.fs.rename(old, new)
        finally:
            self._cache.clear()  # every name under the two changes
        return 0

    @as_caller
    def symlink(self, target: str, source: str) -> int:
        """symlink: a link at ``target`` pointing to ``source`` (mfusepy's names, ``ln -s source target``)."""
        with self._changing(target):
            self.fs.symlink(source, target)
        self._cache.changed(target, UNKNOWN)
        return 0

    @as_caller
    def link(self, target: str, source: str) -> int:
        """link: a new name ``target`` for the file ``source`` (mfusepy's names, ``ln source target``)."""
        self._pending.settle(source, target)
        try:
            self.fs.link(source, target)
        finally:
            self._cache.clear()  # the source's link count changes, under any of its names
        return 0

    # ---- data ----

    def _open_handle(self, path: str, flags: int, f: IO[bytes] | None = None) -> int:
        writable = (flags & os.O_ACCMODE) != os.O_RDONLY
        if f is None:
            write_only = (flags & os.O_ACCMODE) == os.O_WRONLY
            f = open_for_handle(self.fs, path, "r+b" if writable else "rb", write_only=write_only)
        try:
            inode_id = getattr(getattr(f, "raw", f), "inode_id", None)  # the client's files know their inode
            if not isinstance(inode_id, int):
                inode_id = self.fs.stat(path).inode_id
            if writable and flags & os.O_TRUNC:
                f.truncate(0)
                self._changed_inode(inode_id)
        except BaseException:
            f.close()
            raise
        known, st = self._cache.lookup(path)
        if known and st is not ABSENT and st.inode_id != inode_id:  # a written-back file's stand-in
            self._cache.changed(path, UNKNOWN)
        return self._table.add(Handle(f, inode_id, writable, append=writable and bool(flags & os.O_APPEND)))

    @as_caller
    def open(self, path: str, flags: int) -> int:
        """open; the length a writer here has not made exact on meta yet is made exact first (close-to-open)."""
        # close(2) waits for FLUSH but not for RELEASE, which closes the write session and makes the length
        # exact on meta. A program that closes a file and opens it again at once (git does, all the time) may
        # get here first: make the length exact now, or the new handle would see the old length.
        self._pending.settle(path)
        if self._table.has_writers():
            for h in self._table.writers(self._lstat(path).inode_id):
                self._sync(h, always=False)
        since = self._cache.generation()
        fh = self._open_handle(path, flags)
        opened = self._get(fh).file
        inode = getattr(getattr(opened, "raw", opened), "inode_at_open", None)
        # close-to-open across mounts: the kernel reads no further than the size it keeps (for the attribute timeout,
        # maybe from before another mount's close), so it asks again when meta's answer differs from what was known
        if inode is not None and self._cache.renewed(path, Stat.from_pb(inode), since):
            self.invalidate_kernel(path)
        return fh

    def invalidate_kernel(self, path: str) -> None:
        """Have the kernel forget the attributes and pages it keeps of ``path`` (the FUSE layer sets this)."""

    @as_caller
    def create(self, path: str, mode: int, flags: int = os.O_RDWR) -> int:
        """Creates and opens in one call (O_CREAT); with ``--writeback``, a small exclusive file may start pending.

        A file created read-only (git's objects are 0444) is still written through the descriptor that created it,
        as POSIX allows.
        """
        # Created and opened in one call: a file created read-only (git's objects are 0444) is still written
        # through the descriptor that created it, as POSIX allows.
        perm = mode & 0o7777
        deferred = self._pending.defer_create(path, perm, flags)
        if deferred is not None:
            return deferred
        self._pending.settle(path)
        with self._changing(path):
            try:
                f = open_for_handle(self.fs, path, "x+b", perm=perm)
                made = True
            except FileExistsError:
                if flags & os.O_EXCL:
                    raise
                f = open_for_handle(self.fs, path, "r+b")
                made = False
            fh = self._open_handle(path, (flags & ~os.O_ACCMODE) | os.O_RDWR, f)
        # meta's answer to the Create: the getattr libfuse makes next (and the kernel's) needs no Stat
        inode = getattr(getattr(f, "raw", f), "inode_at_open", None)
        st = UNKNOWN if inode is None or flags & os.O_TRUNC else Stat.from_pb(inode)
        self._cache.changed(path, st, made=made)
        return fh

    @fuse_errors
    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        """pread: what any handle here buffered in the range reaches storage first, then the bytes come from storage.

        Not from a cache here. Bytes buffered elsewhere in the file stay buffered: where storage's bytes end short of
        them, the file has none yet (a hole before bytes still on their way), which read as zeros.
        """
        h = self._get(fh)
        end = self._table.flush_writers(h.inode_id, span=(offset, size))  # this handle's buffer too
        with h.lock:
            data = _pread(h.file, offset, size)
        want = min(size, end - offset)
        return data + bytes(want - len(data)) if len(data) < want else data

    @fuse_errors
    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        """Writes (pwrite) through the handle's buffered file; a pending file's bytes stay in memory while they may."""
        h = self._get(fh)
        if not h.writable:
            raise mfusepy.FuseOSError(errno.EBADF)
        if h.pending is not None and self._pending.write(fh, h, data, offset):
            return len(data)
        if h.append:
            return self._append(h, data)
        # another handle's older bytes there may not land over these later
        self._table.flush_writers(h.inode_id, but=h, span=(offset, len(data)))
        with h.lock:
            h.file.seek(offset)  # the mount's files buffer every extent: a seek sends nothing
            h.file.write(data)
            h.end = max(h.end, offset + len(data))
            h.dirty = True
        return len(data)

    def _append(self, h: Handle, data: bytes) -> int:
        """A write through an O_APPEND handle: at the file's end across clients, not at the kernel's offset.

        The kernel's offset is the end it knows, which appends through another mount (another client) moved since:
        they were overwritten. The handle is direct I/O (``serve._Fuse``), so no page holds the bytes at that offset.
        What this mount's handles buffered lands first (the append lease goes after what this client wrote). The
        append is buffered under the inode's append lease, which the handle keeps for a burst of appends
        (``hf3fs.fuse.appends``): given back, with the bytes in storage, at its fsync, close or ``HOLD_S`` later.
        """
        with self._appends.appending(h.inode_id):
            self._table.flush_writers(h.inode_id, but=h)  # another handle here may hold the lease, or bytes before
            with h.lock:
                at = h.file.append(data)  # type: ignore[attr-defined]  # an ExtentBufferedFile (writable, not pending)
                h.end = max(h.end, at + len(data))
                h.dirty = True
                holds = h.file.appending  # type: ignore[attr-defined]
        if holds:
            self._appends.held(h)  # given back in a moment if no fsync or close does first
        return len(data)

    @as_caller
    def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
        """truncate/ftruncate; what handles here wrote reaches storage first, so no old byte lands past the new end."""
        # ftruncate (no path): the handle was opened for writing (the kernel checks), meta checked then
        if fh is not None and self._get(fh).pending is not None:
            self._pending.materialize(fh)
        self._pending.settle(path or "")  # ("" names no file)
        inode_id = self._inode_of(fh) if path is None else self._lstat(path).inode_id
        for h in self._table.writers(inode_id):  # meta cuts storage only below the length it knows: tell it first
            self._sync(h, always=False)
        try:
            if path is None:
                self._truncate_handle(self._get(fh) if fh is not None else None, inode_id, length)
            else:
                self.fs.truncate(path, length)
        finally:
            self._changed_inode(inode_id)
        self._table.cut(inode_id, length)
        return 0

    def _truncate_handle(self, h: Handle | None, inode_id: int, length: int) -> None:
        """An ftruncate: through a writable handle's own write session, as its writes.

        The session allows it whatever the mode says by now (a file created 0444, or chmod-ed since: POSIX checks at
        open); a read-only handle's (the kernel's O_TRUNC) goes as the mount's own user.
        """
        with acting_as(None):  # the session is the mount's own user's
            if h is None or not h.writable or h.pending is not None:
                self.fs.truncate_inode(inode_id, length)
                return
            with h.lock:
                h.file.truncate(length)

    @fuse_errors
    def fallocate(self, path: str | None, mode: int, offset: int, size: int, fh: int) -> int:
        """posix_fallocate: the file grows to ``offset + size`` if it is shorter; other modes are EOPNOTSUPP.

        The growth is a sparse extension, charged to the directory quotas at once, so EDQUOT comes here; 3FS writes
        chunks when data comes, so storage space is not set aside. FALLOC_FL_KEEP_SIZE alone has nothing to do;
        punching holes, collapsing, zeroing or inserting ranges are EOPNOTSUPP.
        """
        if offset < 0 or size <= 0:
            raise mfusepy.FuseOSError(errno.EINVAL)
        if mode & ~FALLOC_FL_KEEP_SIZE:
            raise mfusepy.FuseOSError(errno.EOPNOTSUPP)
        h = self._get(fh)
        if not h.writable:
            raise mfusepy.FuseOSError(errno.EBADF)
        if h.pending is not None:
            self._pending.materialize(fh)
        if mode & FALLOC_FL_KEEP_SIZE:
            return 0
        self._table.flush_writers(h.inode_id)
        with acting_as(None):  # on the open handle, as ftruncate: meta checked write access at open
            grow = self.fs.stat_inode(h.inode_id).size < offset + size
        try:
            if grow:
                self._truncate_handle(h, h.inode_id, offset + size)
        finally:
            self._changed_inode(h.inode_id)
        return 0

    @fuse_errors
    def flush(self, path: str, fh: int) -> int:
        """close(2) of a descriptor (each of its dups): what it wrote reaches storage, and its length meta, at once.

        So another client opening the file next sees it (close-to-open; the kernel's release comes later,
        asynchronously). A pending new file (``--writeback``) waits for its release as documented.
        """
        h = self._get(fh)
        if h.writable and h.pending is None:
            self._sync(h, always=False)
        return 0

    @fuse_errors
    def fsync(self, path: str, datasync: int, fh: int) -> int:
        """fsync/fdatasync: the bytes to storage and the length exact on meta (fsync: the mtime too).

        The file's, whichever descriptor here wrote them, as a local fsync flushes the inode: an fsync of a read-only
        descriptor (``sync FILE``) returned 0 with another descriptor's writes still in this process's memory.
        """
        h = self._get(fh)
        if h.pending is not None:
            self._pending.materialize(fh)
        for w in self._table.writers(h.inode_id):
            if w is not h:
                self._sync(w, always=False)
        self._sync(h, always=not datasync)
        return 0

    def _sync(self, h: Handle, always: bool) -> None:
        """Bytes written through ``h`` to storage, and meta's length made exact: fsync, fdatasync and close(2)'s FLUSH.

        fsync with ``always``: its mtime too, even when nothing was written. fdatasync and FLUSH only when this handle
        wrote past the length meta last gave it: the bytes are durable once storage acknowledged them, and the
        release's Close brings the mtime; SQLite's rewrite of its journal's header costs no Sync.
        """
        if not h.writable:
            return
        with h.lock:
            if h.file.closed:  # released meanwhile: the close made the length exact
                return
            h.file.flush()
            raw: Any = getattr(h.file, "raw", h.file)
            if not always and h.dirty and getattr(raw, "length_covered", lambda: False)():
                h.dirty = False
                return
            if h.dirty or always:
                try:
                    h.file.fsync()  # type: ignore[attr-defined]  # hf3fs file objects make the length exact
                except BaseException:
                    self._changed_inode(h.inode_id)
                    raise
                synced = getattr(getattr(h.file, "raw", h.file), "inode_at_sync", None)  # meta's new length, mtime
                self._changed_inode(h.inode_id, Stat.from_pb(synced) if synced is not None else ABSENT)
                h.dirty = False

    @fuse_errors
    def release(self, path: str, fh: int) -> int:
        """The kernel's release of a handle: its file closed (and its write session), or kept as a removed file's hold.

        A pending new file goes to the write-back here. Counted in the mount's stats once done, failed or not.
        """
        h = self._get(fh)
        try:
            self._release(fh, h)
        finally:
            with self._lock:
                self._released += 1
        return 0

    def destroy(self, path: str | None) -> None:
        """The mount is going (an unmount, or a signal that ended libfuse's loop): every handle left is released here.

        A signal ends the loop with the kernel's releases of files just closed still queued: a pending file's bytes,
        which go to the write-back only at its release, were lost (one of 30 files closed before a SIGTERM stayed
        empty). A handle still open then has its bytes sent too, as its close would.
        """
        with self._lock:
            left = list(self._table.handles.items())
        for fh, h in left:
            try:
                self._release(fh, h)
            except Exception:  # the others still go
                logger.exception("hf3fs mount: releasing inode %d at the unmount failed", h.inode_id)

    def _release(self, fh: int, h: Handle) -> None:
        if h.pending is not None and self._pending.release(fh, h):
            return
        hold = self._holds.becomes_hold(h, fh)
        try:
            with h.lock:
                if hold:  # its bytes and exact length go to meta now, its session stays (closed by the last handle)
                    h.file.fsync()  # type: ignore[attr-defined]  # hf3fs file objects make the length exact
                else:
                    h.file.close()  # makes the length exact on meta; until then getattr still counts h.end
        finally:
            if h.writable:
                self._changed_inode(h.inode_id)  # the close moved meta's length and mtime
            with self._lock:
                self._table.handles.pop(fh, None)
                self._releases += h.writable
                fhs = self._table.by_inode.get(h.inode_id, set())
                fhs.discard(fh)
                if not fhs:
                    self._table.by_inode.pop(h.inode_id, None)
                held = self._holds.released(h.inode_id, h.file if hold else None, last=not fhs)
            if held is not None:
                held.close()  # the last handle of a removed file: meta may free it now
