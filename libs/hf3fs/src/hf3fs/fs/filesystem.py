"""``FileSystem``, the user's API of hf3fs: files, folders, batch I/O, quotas and trash over one connection.

Its collaborators: the connection (``hf3fs.fs.connection``), the write sessions (``hf3fs.fs.sessions``), the data
side (``hf3fs.fs.data``) and the write-back queue (``hf3fs.fs.writeback_queue``).
"""

from __future__ import annotations

import errno
import io
import os
import stat as stat_mod
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import Any, TypeVar

from ff_fsprotocol.layout import FileLayout
from ff_rpc import current_acting
from ff_rpc.client import UnaryCall
from fireflyer.meta.v1 import meta_pb2 as pb
from fireflyer.meta.v1.meta_client import MetaServiceClient
from hf3fs.entries import DirEntry, Quota, Stat, StatFs, TrashEntry, quota_of
from hf3fs.files import MAX_FILE_BYTES, OpenMode
from hf3fs.fs.connection import Connection
from hf3fs.fs.data import DataPath
from hf3fs.fs.exits import catch_sigterm
from hf3fs.fs.paths import absolute, path_at
from hf3fs.fs.sessions import WriteSessions
from hf3fs.fs.writeback_queue import WritebackQueue
from hf3fs.meta_client import ERRNO_OF_FS_ERROR, MetaClient
from hf3fs.statfs import within_quotas
from hf3fs.writeback import PendingFile, WritebackError, WritebackFile, WritebackOptions, WritebackStats

T = TypeVar("T")
RequestT = TypeVar("RequestT")
ResponseT = TypeVar("ResponseT")
_NODE_TYPES = {
    stat_mod.S_IFIFO: pb.INODE_TYPE_FIFO,
    stat_mod.S_IFSOCK: pb.INODE_TYPE_SOCKET,
    stat_mod.S_IFCHR: pb.INODE_TYPE_CHAR_DEVICE,
    stat_mod.S_IFBLK: pb.INODE_TYPE_BLOCK_DEVICE,
}


class FileSystem:
    """A connection to one 3FS cluster (see ``hf3fs.fs``). Close it, or use it as a context manager."""

    def __init__(
        self,
        mgmtd: str | list[str],
        token: str,
        *,
        meta_addresses: list[str] | None = None,
        timeout_s: float = 30.0,
        renew_interval_s: float | None = None,
        close_retry_s: float = 60.0,
        writeback: bool | WritebackOptions = False,
    ) -> None:
        """A client of the cluster ``mgmtd`` names (addresses, comma-separated or a list), with the user's token.

        ``writeback``: files opened ``"w"``/``"wb"`` are written back (``True``: with the default
        ``WritebackOptions``); off by default, so a close is visible to every client when it returns (see
        ``hf3fs.writeback`` for the semantics and ``sync``).
        """
        addresses = [a.strip() for a in (mgmtd.split(",") if isinstance(mgmtd, str) else mgmtd) if a.strip()]
        if not addresses:
            raise ValueError("at least one mgmtd address is needed")
        if not token:
            raise ValueError("a token is needed (FF_TOKEN)")
        self._args = (addresses, token, meta_addresses, timeout_s, renew_interval_s, close_retry_s, writeback)
        self._wb_default = bool(writeback)
        self._conn = Connection(
            addresses, token, meta_addresses=meta_addresses, timeout_s=timeout_s, close_retry_s=close_retry_s
        )
        if writeback:
            catch_sigterm()
        self.client_id = self._conn.client_id
        self.timeout_s = timeout_s  # of one meta call (write-back's batches get more: see hf3fs.writeback)
        self._writeback = WritebackQueue(
            self._conn, writeback if isinstance(writeback, WritebackOptions) else WritebackOptions()
        )
        self._sessions = WriteSessions(self._conn, self._meta_call, renew_interval_s)
        self._data = DataPath(self._conn, self._sessions, self._meta_call)

    # ---- plumbing ----

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        """``Connection.run``: on the loop thread, as the calling thread's identity."""
        return self._conn.run(coro)

    @property
    def _meta(self) -> MetaClient:
        return self._conn.meta

    def _layout(self, inode: pb.Inode) -> FileLayout:
        """``Connection.layout``: the file's chains."""
        return self._conn.layout(inode)

    def _meta_call(
        self,
        method: Callable[[MetaServiceClient], UnaryCall[RequestT, ResponseT]],
        request: RequestT,
        path: str | None = None,
    ) -> ResponseT:
        """One meta call; the files queued for write-back that it names are committed first.

        So this client sees its queued files as committed.
        """
        self._writeback.before_meta_call(request)
        return self._conn.meta_call(method, request, path)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled, a FileSystem is its arguments: unpickling connects again.

        The new client has its own sessions; files open here stay here. The pickle holds the token in clear, like
        the arguments it was made with: hand it to worker processes, do not store it.
        """
        return _reconnect, self._args

    def close(self) -> None:
        """Commits what write-back holds, closes every open file's write session, and disconnects.

        In a forked copy it only marks itself closed: the connection is the parent's.

        Raises:
            WritebackError: files whose write-back failed (the rest is closed all the same).
        """
        if self._conn.closed:
            return
        if not self._conn.in_origin_process():  # a forked copy: the connection belongs to the parent, leave it be
            self._conn.abandon()
            return
        failures = self._writeback.close()
        try:
            self._sessions.close()
            self._conn.close()
        finally:
            if failures:
                raise WritebackError(failures)

    def __enter__(self) -> FileSystem:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- write-back of small files (hf3fs.writeback) ----

    def write_back(
        self,
        path: str,
        data: bytes,
        *,
        perm: int = 0o644,
        mtime_ns: int | None = None,
        parent: tuple[int, str] | None = None,
        set_mode: bool = False,
        inode_id: int = 0,
        quota_id: int = 0,
    ) -> None:
        """Queue a whole small file for write-back: created (or truncated) with ``data`` in the next batch.

        As ``open(path, "wb")``, ``write(data)`` and ``close()`` would. ``parent`` (folder inode id, name) creates
        it in that folder instead of at ``path`` (which then only names it in errors); ``mtime_ns``: its write
        time (default now); ``set_mode``: an existing file gets ``perm`` too (a chmod by its owner, after the
        check that it may be written), not only a new one; ``inode_id``: the file exists already (made earlier by
        this client) and only it is written, wherever it is by then (a file that took its name is left alone;
        one removed meanwhile is not written); ``quota_id``: the folder of the byte quota it counts against, for
        ``writeback_held_bytes``. Returns at once; errors come from ``sync``/``close`` (``WritebackError``).
        """
        absolute(path)
        item = PendingFile(
            path=path,
            data=bytes(data),
            perm=perm,
            mtime_ns=mtime_ns or time.time_ns(),
            parent=parent,
            acting=current_acting(),
            set_mode=set_mode,
            inode_id=inode_id,
            quota_id=quota_id,
        )
        self._writeback.submit(item)

    def sync(self) -> None:
        """Commit every file queued for write-back; ``WritebackError`` for each one whose commit failed.

        Failed since the last ``sync`` (or ``close``). Without write-back: nothing to do.
        """
        self._writeback.sync()

    def writeback_pending(self) -> int:
        """How many files are queued or being committed."""
        return self._writeback.pending()

    def writeback_stats(self) -> WritebackStats:
        """The write-back queue's counts (all zero before the first file was queued)."""
        return self._writeback.stats()

    def writeback_held_bytes(self, quota_id: int) -> int:
        """Bytes of files queued or being committed with this ``quota_id`` (see ``write_back``)."""
        return self._writeback.held_bytes(quota_id)

    # ---- write sessions ----

    def unclosed_sessions(self) -> list[str]:
        """Paths of files whose close has not reached meta yet (closed later, see ``WriteSessions.close_session``)."""
        return self._sessions.unclosed()

    def renew_sessions_now(self) -> None:
        """Report written lengths and renew leases now (normally every lease/3 seconds)."""
        self._sessions.renew_now()

    # ---- metadata ----

    def stat(self, path: str, follow_symlinks: bool = True) -> Stat:
        """The attributes of ``path`` (of a symlink's target; of the link itself without ``follow_symlinks``).

        Raises:
            OSError: FileNotFoundError, NotADirectoryError, PermissionError... as meta answered.
        """
        resp = self._meta_call(
            lambda m: m.stat, pb.StatRequest(path=path_at(path), follow_last_symlink=follow_symlinks), path
        )
        return Stat.from_pb(resp.inode)

    def lstat(self, path: str) -> Stat:
        """The attributes of ``path`` itself, a symlink not followed."""
        return self.stat(path, follow_symlinks=False)

    def stat_inode(self, inode_id: int) -> Stat:
        """The inode itself, by id (also one no name reaches any more while a session keeps it: fstat)."""
        resp = self._meta_call(lambda m: m.stat, pb.StatRequest(path=pb.PathAt(parent_inode_id=inode_id)))
        return Stat.from_pb(resp.inode)

    def set_attr_inode(
        self,
        inode_id: int,
        *,
        mode: int | None = None,
        uid: int = -1,
        gid: int = -1,
        ns: tuple[int, int] | None = None,
        now: bool = False,
    ) -> Stat:
        """fchmod, fchown and futimens: the attributes of an inode by id (``now``: both times to meta's clock).

        Returns the inode as meta left it.
        """
        req = pb.SetAttrRequest(path=pb.PathAt(parent_inode_id=inode_id))
        if mode is not None:
            req.mode = mode
        if uid >= 0:
            req.uid = uid
        if gid >= 0:
            req.gid = gid
        if ns is not None:
            req.atime_ns, req.mtime_ns = ns
        if now:
            req.atime_now = req.mtime_now = True
        return Stat.from_pb(self._meta_call(lambda m: m.set_attr, req).inode)

    def truncate_inode(self, inode_id: int, length: int) -> None:
        """ftruncate: an inode's length by id."""
        if length < 0:
            raise OSError(errno.EINVAL, "negative length")
        if length > MAX_FILE_BYTES:
            raise OSError(errno.EFBIG, f"file too large: {length} bytes, past {MAX_FILE_BYTES}")
        self._meta_call(
            lambda m: m.truncate, pb.TruncateRequest(path=pb.PathAt(parent_inode_id=inode_id), length_bytes=length)
        )

    def exists(self, path: str) -> bool:
        """True when ``path`` resolves (symlinks followed); False for a missing name, other errors raised."""
        try:
            self.stat(path)
        except FileNotFoundError:
            return False
        return True

    def isdir(self, path: str) -> bool:
        """True for a folder (or a symlink to one); False when missing or not a folder."""
        try:
            return self.stat(path).is_dir()
        except (FileNotFoundError, NotADirectoryError):
            return False

    def isfile(self, path: str) -> bool:
        """True for a regular file (or a symlink to one); False when missing or not a file."""
        try:
            return self.stat(path).is_file()
        except (FileNotFoundError, NotADirectoryError):
            return False

    def batch_stat(self, paths: list[str]) -> list[Stat | OSError]:
        """Each path's Stat (symlinks followed), or the OSError of a path that failed, in order, from one meta call."""
        resp = self._meta_call(
            lambda m: m.batch_stat, pb.BatchStatRequest(paths=[path_at(p) for p in paths], follow_last_symlink=True)
        )
        out: list[Stat | OSError] = []
        for p, r in zip(paths, resp.results, strict=True):
            if r.error:
                code = ERRNO_OF_FS_ERROR.get(pb.FsError.Name(r.error), errno.EIO)
                out.append(OSError(code, os.strerror(code), p))
            else:
                out.append(Stat.from_pb(r.inode))
        return out

    def _list(self, path: str, with_inodes: bool) -> list[pb.DirEntry]:
        entries: list[pb.DirEntry] = []
        token = ""
        while True:
            resp = self._meta_call(
                lambda m: m.list, pb.ListRequest(path=path_at(path), page_token=token, include_inodes=with_inodes), path
            )
            entries.extend(resp.entries)
            token = resp.next_page_token
            if not token:
                return entries

    def listdir(self, path: str) -> list[str]:
        """The names in a folder (without ``.`` and ``..``), read page by page."""
        return [e.name for e in self._list(path, False)]

    def scandir(self, path: str) -> list[DirEntry]:
        """The folder's entries with their attributes, from the same listing (no Stat per entry)."""
        return [DirEntry(e.name, Stat.from_pb(e.inode)) for e in self._list(path, True)]

    def walk(self, top: str) -> Iterator[tuple[str, list[str], list[str]]]:
        """``os.walk`` top-down over a tree (symlinks not followed); a folder that cannot be listed is skipped."""
        try:
            entries = self.scandir(top)
        except OSError:
            return
        dirs = [e.name for e in entries if e.stat.is_dir()]
        files = [e.name for e in entries if not e.stat.is_dir()]
        yield top, dirs, files
        for d in dirs:
            yield from self.walk(f"{top.rstrip('/')}/{d}")

    def mkdir(self, path: str, mode: int = 0o755) -> Stat:
        """Makes a folder whose parent exists (FileExistsError when the name is taken); the new folder's Stat."""
        resp = self._meta_call(lambda m: m.mkdirs, pb.MkdirsRequest(path=path_at(path), mode=mode), path)
        return Stat.from_pb(resp.inode)

    def makedirs(self, path: str, mode: int = 0o755, exist_ok: bool = False) -> None:
        """Makes a folder and its missing parents in one meta call; FileExistsError if it is there, unless exist_ok."""
        if not exist_ok and self.exists(path):
            raise FileExistsError(errno.EEXIST, "File exists", path)
        self._meta_call(lambda m: m.mkdirs, pb.MkdirsRequest(path=path_at(path), mode=mode, recursive=True), path)

    def create(self, path: str, mode: int = 0o644, exclusive: bool = False) -> Stat:
        """Creates an empty file (``exclusive``: FileExistsError if the name is taken, else an existing one is kept)."""
        return self.create_file(path, mode, exclusive)[0]

    def create_file(self, path: str, mode: int = 0o644, exclusive: bool = False) -> tuple[Stat, tuple[int, int] | None]:
        """``create`` and (bytes still allowed, folder) of the tightest byte quota over the file, or None.

        None when no byte quota applies. The room is what a caller that holds the file's bytes before writing them
        stays within.
        """
        resp = self._meta_call(
            lambda m: m.create,
            pb.CreateRequest(path=path_at(path), mode=mode, exclusive=exclusive, open_mode=pb.OPEN_MODE_READ),
            path,
        )
        room = (resp.quota_room_bytes, resp.quota_inode_id) if resp.HasField("quota_room_bytes") else None
        return Stat.from_pb(resp.inode), room

    def remove(self, path: str) -> None:
        """unlink(2): a file, symlink or special file (IsADirectoryError for a folder, nothing removed).

        One meta call: meta checks the type in the same transaction.
        """
        self._meta_call(lambda m: m.remove, pb.RemoveRequest(path=path_at(path), expect_directory=False), path)

    unlink = remove

    def rmdir(self, path: str) -> None:
        """Removes an empty folder, as rmdir (NotADirectoryError for anything else, nothing removed)."""
        self._meta_call(lambda m: m.remove, pb.RemoveRequest(path=path_at(path), expect_directory=True), path)

    def rmtree(self, path: str, trash: bool = True) -> str:
        """Remove a tree; to the trash by default (returns the trash entry id), else deleted now."""
        resp = self._meta_call(lambda m: m.remove, pb.RemoveRequest(path=path_at(path), recursive=True), path)
        if not trash:
            self._meta_call(lambda m: m.empty_trash, pb.EmptyTrashRequest(trash_ids=[resp.trash_id]), path)
            return ""
        return str(resp.trash_id)

    def rename(self, src: str, dst: str) -> None:
        """Renames ``src`` to ``dst`` atomically, with the POSIX rename's rules; a tree moves in one meta call."""
        self._meta_call(lambda m: m.rename, pb.RenameRequest(src_path=path_at(src), dst_path=path_at(dst)), src)

    def symlink(self, target: str, link_path: str) -> None:
        """Makes a symlink at ``link_path`` pointing to ``target`` (kept as given, not resolved)."""
        self._meta_call(lambda m: m.symlink, pb.SymlinkRequest(path=path_at(link_path), target=target), link_path)

    def mknod(self, path: str, mode: int = 0o600 | stat_mod.S_IFIFO, device: int = 0) -> Stat:
        """A FIFO, socket or device node (``mode`` carries its type bits, as os.mknod's does)."""
        kind = _NODE_TYPES.get(stat_mod.S_IFMT(mode))
        if kind is None:
            raise OSError(errno.EINVAL, "mknod makes FIFOs, sockets and device nodes", path)
        resp = self._meta_call(
            lambda m: m.mknod,
            pb.MknodRequest(path=path_at(path), type=kind, mode=stat_mod.S_IMODE(mode), rdev=device),
            path,
        )
        return Stat.from_pb(resp.inode)

    def readlink(self, path: str) -> str:
        """A symlink's target.

        Raises:
            OSError: EINVAL when ``path`` is not a symlink.
        """
        st = self.lstat(path)
        if not st.is_symlink():
            raise OSError(errno.EINVAL, "Invalid argument (not a symlink)", path)
        return st.symlink_target

    def link(self, existing: str, new_path: str) -> None:
        """Makes ``new_path`` another name of the file ``existing`` (a hard link)."""
        self._meta_call(
            lambda m: m.hard_link, pb.HardLinkRequest(old_path=path_at(existing), new_path=path_at(new_path)), new_path
        )

    def truncate(self, path: str, length: int) -> None:
        """Cuts or extends (a hole) the file at ``path`` to ``length`` bytes.

        Raises:
            OSError: EINVAL for a negative length; EFBIG past the largest file; EDQUOT when growing it goes over a
                quota.
        """
        if length < 0:
            raise OSError(errno.EINVAL, "negative length", path)
        if length > MAX_FILE_BYTES:
            raise OSError(errno.EFBIG, f"file too large: {length} bytes, past {MAX_FILE_BYTES}", path)
        self._meta_call(lambda m: m.truncate, pb.TruncateRequest(path=path_at(path), length_bytes=length), path)

    def chmod(self, path: str, mode: int, *, follow_symlinks: bool = True) -> Stat:
        """Returns the inode as meta left it (as chown and utime do)."""
        return Stat.from_pb(
            self._meta_call(
                lambda m: m.set_attr,
                pb.SetAttrRequest(path=path_at(path), follow_last_symlink=follow_symlinks, mode=mode),
                path,
            ).inode
        )

    def chown(self, path: str, uid: int, gid: int, *, follow_symlinks: bool = True) -> Stat:
        """Sets the owner and/or group (-1 keeps one); returns the new attributes."""
        req = pb.SetAttrRequest(path=path_at(path), follow_last_symlink=follow_symlinks)
        if uid >= 0:
            req.uid = uid
        if gid >= 0:
            req.gid = gid
        return Stat.from_pb(self._meta_call(lambda m: m.set_attr, req, path).inode)

    def utime(self, path: str, ns: tuple[int, int] | None = None, *, follow_symlinks: bool = True) -> Stat:
        """Sets the access and modification times, in ns (None: both now, which needs write permission only)."""
        req = pb.SetAttrRequest(path=path_at(path), follow_last_symlink=follow_symlinks)
        if ns is None:
            req.atime_now = req.mtime_now = True
        else:
            req.atime_ns, req.mtime_ns = ns
        return Stat.from_pb(self._meta_call(lambda m: m.set_attr, req, path).inode)

    def realpath(self, path: str) -> str:
        """The canonical absolute path of ``path``: symlinks resolved, ``.`` and ``..`` gone."""
        return str(self._meta_call(lambda m: m.realpath, pb.RealpathRequest(path=path_at(path)), path).path)

    def realpath_inode(self, inode_id: int) -> str:
        """A path that reaches the inode now (one of its names), wherever another client moved it.

        Raises:
            FileNotFoundError: no name reaches it any more (removed).
        """
        req = pb.RealpathRequest(path=pb.PathAt(parent_inode_id=inode_id))
        return str(self._meta_call(lambda m: m.realpath, req).path)

    def statfs(self, path: str | None = None) -> StatFs:
        """The cluster's space (meta sums the storage targets' disks); with ``path``, ``df`` of that folder.

        Of that folder: where a byte quota over it leaves less room than the cluster has, that quota's figures.
        """
        r = self._meta_call(lambda m: m.stat_fs, pb.StatFsRequest())
        space = StatFs(r.capacity_bytes, r.used_bytes, r.free_bytes, r.num_inodes)
        return space if path is None else within_quotas(space, self.get_quotas(path))

    def du(self, path: str, on_error: Callable[[str, OSError], None] | None = None) -> tuple[int, int]:
        """(bytes in files, inodes) under ``path``.

        A folder below it that cannot be listed raises, or, with ``on_error``, is passed to it and left out (the sums
        are then of what could be read).
        """
        total, count = 0, 0
        st = self.lstat(path)
        if not st.is_dir():
            return (st.size if st.is_file() else 0), 1
        stack = [path]
        count = 1
        while stack:
            d = stack.pop()
            try:
                entries = self.scandir(d)
            except OSError as err:
                if on_error is None or d == path:
                    raise
                on_error(d, err)
                continue
            for e in entries:
                count += 1
                if e.stat.is_dir():
                    stack.append(f"{d.rstrip('/')}/{e.name}")
                elif e.stat.is_file():
                    total += e.stat.size
        return total, count

    # ---- quotas and trash ----

    def get_quota(self, path: str) -> Quota | None:
        """The nearest directory quota that applies to ``path`` (None when none does)."""
        quotas = self._meta_call(lambda m: m.get_quota, pb.GetQuotaRequest(path=path_at(path)), path).quotas
        return quota_of(quotas[0]) if quotas else None

    def get_quotas(self, path: str) -> list[Quota]:
        """Every directory quota that applies to ``path``, nearest first."""
        resp = self._meta_call(lambda m: m.get_quota, pb.GetQuotaRequest(path=path_at(path)), path)
        return [quota_of(q) for q in resp.quotas]

    def set_quota(self, path: str, max_bytes: int | None = None, max_inodes: int | None = None) -> Quota:
        """Sets a folder's quota (admins); a limit None (or 0) is none of that kind, and both None remove the quota.

        A limit below the current use is allowed: it blocks further growth.
        """
        resp = self._meta_call(
            lambda m: m.set_quota,
            pb.SetQuotaRequest(path=path_at(path), max_bytes=max_bytes or 0, max_inodes=max_inodes or 0),
            path,
        )
        return quota_of(resp.quota)

    def list_quotas(self) -> list[Quota]:
        """Every folder quota with its use (admins)."""
        return [quota_of(q) for q in self._meta_call(lambda m: m.list_quotas, pb.ListQuotasRequest()).quotas]

    def trash_list(self, all_users: bool = False) -> list[TrashEntry]:
        """The caller's trash entries (``all_users``: everyone's, for admins), every page read."""
        out: list[TrashEntry] = []
        token = ""
        while True:
            resp = self._meta_call(lambda m: m.list_trash, pb.ListTrashRequest(page_token=token, all_users=all_users))
            for e in resp.entries:
                out.append(
                    TrashEntry(
                        e.trash_id,
                        e.original_path,
                        e.removed_at_ns,
                        e.expires_at_ns,
                        e.inode_id,
                        e.type == pb.INODE_TYPE_DIRECTORY,
                    )
                )
            token = resp.next_page_token
            if not token:
                return out

    def trash_restore(self, entry_id: str, path: str | None = None) -> str:
        """Puts a trash entry back at ``path``, or where it was removed from; returns the path it is at now.

        Raises:
            FileExistsError: the name is taken.
        """
        req = pb.RestoreTrashEntryRequest(trash_id=entry_id)
        if path:
            req.path.CopyFrom(path_at(path))
        return str(self._meta_call(lambda m: m.restore_trash_entry, req, path).path)

    def trash_empty(self, entry_ids: list[str] | None = None) -> int:
        """Deletes trash entries now (default: all of the caller's); the number deleted. Unknown ids are ignored."""
        resp = self._meta_call(lambda m: m.empty_trash, pb.EmptyTrashRequest(trash_ids=entry_ids or []))
        return int(resp.num_deleted)

    # ---- data ----

    def open(
        self,
        path: str,
        mode: str = "rb",
        *,
        buffering: int = -1,
        perm: int = 0o644,
        encoding: str | None = None,
        errors: str | None = None,
        newline: str | None = None,
        write_only: bool = False,
        writeback: bool | None = None,
    ) -> Any:
        """Open a file, as ``open()`` does (modes ``r``, ``w``, ``a``, ``x`` with ``+``, ``b`` or ``t``).

        ``write_only`` with a writable mode asks meta for write permission only (POSIX O_WRONLY: a file the caller
        may write but not read opens), though the file object may still read. ``writeback`` (default: the
        FileSystem's): ``"w"``/``"wb"`` files are written back (see ``hf3fs.writeback``).
        """
        om = OpenMode.parse(mode)
        absolute(path)
        if (self._wb_default if writeback is None else writeback) and om.truncate and not om.readable:
            return self._open_writeback(path, mode, om, perm, buffering, encoding, errors, newline)
        return self._data.open(
            path,
            mode,
            om,
            buffering=buffering,
            perm=perm,
            encoding=encoding,
            errors=errors,
            newline=newline,
            write_only=write_only,
        )

    def _open_writeback(
        self,
        path: str,
        mode: str,
        om: OpenMode,
        perm: int,
        buffering: int,
        encoding: str | None,
        errors: str | None,
        newline: str | None,
    ) -> Any:
        if buffering == 0 and not om.binary:
            raise ValueError("can't have unbuffered text I/O")

        def open_through(name: str, file_perm: int) -> Any:
            return self.open(name, "wb", perm=file_perm, writeback=False)

        f = WritebackFile(self._writeback.queue(), open_through, path, mode, perm)
        if om.binary:
            return f
        return io.TextIOWrapper(
            f, encoding=encoding or "utf-8", errors=errors, newline=newline, line_buffering=buffering == 1
        )

    def read_batch(self, reads: list[tuple[str, int, int]]) -> list[bytes]:
        """Many (path, offset, length) reads: one BatchStat for the files, then all chunks in one batch.

        A read past the end of a file stops there (as ``read`` does): a length of ``WHOLE_FILE`` reads to the end.
        """
        return self._data.read_batch(reads)

    def read_batch_into(self, reads: list[tuple[str, int, int]], buffers: Sequence[Any]) -> list[int]:
        """``read_batch`` into the caller's writable buffers; the number of bytes each read (short past its file's end).

        One buffer per read, each at least its length; the bytes land there from the transport, no copy.
        """
        return self._data.read_batch_into(reads, buffers)

    def write_batch(self, writes: list[tuple[str, int, bytes]]) -> None:
        """Many (path, offset, data) writes into existing files: one session per file, chunks in one batch."""
        self._data.write_batch(writes)


def _reconnect(
    addresses: list[str],
    token: str,
    meta_addresses: list[str] | None,
    timeout_s: float,
    renew_interval_s: float | None,
    close_retry_s: float = 60.0,
    writeback: bool | WritebackOptions = False,
) -> FileSystem:
    return FileSystem(
        addresses,
        token,
        meta_addresses=meta_addresses,
        timeout_s=timeout_s,
        renew_interval_s=renew_interval_s,
        close_retry_s=close_retry_s,
        writeback=writeback,
    )


def connect(mgmtd: str | list[str] | None = None, token: str | None = None, **kwargs: Any) -> FileSystem:
    """A FileSystem for the cluster at ``mgmtd`` (default: FF_MGMTD_ADDRESSES) with ``token`` (default: FF_TOKEN)."""
    mgmtd = mgmtd or os.environ.get("FF_MGMTD_ADDRESSES", "")
    token = token or os.environ.get("FF_TOKEN", "")
    if not mgmtd:
        raise ValueError("no mgmtd address: pass mgmtd= or set FF_MGMTD_ADDRESSES")
    return FileSystem(mgmtd, token, **kwargs)
