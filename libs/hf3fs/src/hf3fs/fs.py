"""The hf3fs file system, synchronous: metadata through meta, data straight to storage.

``hf3fs.connect()`` gives a FileSystem; it runs the async gRPC clients on one private event-loop thread,
so any number of threads may use it at once (FUSE callbacks, fsspec, the CLI, data loaders).

Processes: gRPC does not survive ``fork()`` (a child of a process that has used it hangs in its first
call), so a FileSystem, or a new one, used in a forked child raises ``ForkedProcessError`` at once. Worker
processes are started with ``spawn`` or ``forkserver`` (torch: ``DataLoader(...,
multiprocessing_context="forkserver")``); a FileSystem pickles to its arguments and connects again, as a
client of its own, in the process that unpickles it.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import errno
import io
import logging
import os
import signal
import stat as stat_mod
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import Any, TypeVar

import grpc

from ff_cluster import MgmtdClient
from ff_fsprotocol.layout import FileLayout
from ff_rpc import Identity, RpcError, acting_as, current_acting
from ff_rpc.client import UnaryCall
from fireflyer.meta.v1 import meta_pb2 as pb
from fireflyer.meta.v1.meta_client import MetaServiceClient
from fireflyer.mgmtd.v1 import mgmtd_pb2 as mpb
from hf3fs.entries import DirEntry, Quota, Stat, StatFs, TrashEntry, quota_of
from hf3fs.files import OpenMode, RawFile, layout_of, read_spans, session_lost, wrap, write_spans
from hf3fs.forks import ForkedProcessError, Process, fork_error
from hf3fs.meta_client import ERRNO_OF_FS_ERROR, Hf3fsError, MetaClient, os_error
from hf3fs.statfs import within_quotas
from hf3fs.storage_client import StorageClient
from hf3fs.writeback import (
    PendingFile,
    Writeback,
    WritebackError,
    WritebackFile,
    WritebackOptions,
    WritebackStats,
    places_of,
)

__all__ = [
    "WHOLE_FILE",
    "DirEntry",
    "FileSystem",
    "ForkedProcessError",
    "Quota",
    "Stat",
    "StatFs",
    "TrashEntry",
    "connect",
]
logger = logging.getLogger(__name__)
T = TypeVar("T")
RequestT = TypeVar("RequestT")
ResponseT = TypeVar("ResponseT")
_NODE_TYPES = {
    stat_mod.S_IFIFO: pb.INODE_TYPE_FIFO,
    stat_mod.S_IFSOCK: pb.INODE_TYPE_SOCKET,
    stat_mod.S_IFCHR: pb.INODE_TYPE_CHAR_DEVICE,
    stat_mod.S_IFBLK: pb.INODE_TYPE_BLOCK_DEVICE,
}


WHOLE_FILE = 1 << 62  # a read_batch length meaning "to the end of the file"
UNCLOSED_RETRY_S = 0.5  # how often the renewer retries closes that did not reach meta


async def _as(identity: Identity, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` with its calls acting as ``identity`` (see ``ff_rpc.acting_as``).

    The task this runs in has a context of its own, so the identity ends with it.
    """
    with acting_as(identity):
        return await coro


def _abs(path: str) -> str:
    if not isinstance(path, str):
        raise TypeError(f"path must be str, not {type(path).__name__}")
    if not path.startswith("/"):
        raise ValueError(f"hf3fs paths are absolute: {path!r}")
    return path


def _at(path: str) -> pb.PathAt:
    return pb.PathAt(path=_abs(path))


class FileSystem:
    """A connection to one 3FS cluster (see the module docstring). Close it, or use it as a context manager."""

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
        if Process.forked_after_grpc:
            raise fork_error("hf3fs.connect()")
        Process.grpc_started = True
        self._args = (addresses, token, meta_addresses, timeout_s, renew_interval_s, close_retry_s, writeback)
        self._wb_options = writeback if isinstance(writeback, WritebackOptions) else WritebackOptions()
        self._wb_default = bool(writeback)
        self._wb: Writeback | None = None
        if writeback:
            _catch_sigterm()
        self._pid = os.getpid()
        self.client_id = uuid.uuid4().hex
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="hf3fs-loop", daemon=True)
        self._thread.start()
        self._writers: dict[str, RawFile] = {}
        self._writers_lock = threading.Lock()
        self._unclosed: dict[str, tuple[pb.CloseRequest, str]] = {}  # sessions whose Close did not reach meta
        self._append_locks: dict[int, threading.Lock] = {}
        self._close_retry_s = close_retry_s
        self.timeout_s = timeout_s  # of one meta call (write-back's batches get more: see hf3fs.writeback)
        self._closing_by: float | None = None  # while close() runs: one retry deadline for all its writers
        self._closed = False
        self._backend = _FileBackend(self)
        self._renew_interval_s = renew_interval_s
        self._stop = asyncio.Event()

        async def setup() -> None:
            self._mgmtd = MgmtdClient(addresses, token=token, timeout_s=10.0)
            self._meta = MetaClient(self._mgmtd, token, addresses=meta_addresses, timeout_s=timeout_s)
            self._storage = StorageClient(self._mgmtd, token)
            self._stop = asyncio.Event()
            self._renewer = asyncio.ensure_future(self._renew_loop())

        self._run(setup())
        try:
            self._run(self._check_token(addresses))
        except BaseException:
            self.close()
            raise

    # ---- plumbing ----

    async def _check_token(self, addresses: list[str]) -> None:
        """Ask mgmtd who the token belongs to, so a refused token and an unreachable cluster fail at connect.

        Each fails with its own error.

        Raises:
            PermissionError: mgmtd refused the token (unknown, revoked, or its user disabled).
            Hf3fsError: no mgmtd answered.
        """
        try:
            await self._mgmtd.identity.who_am_i(mpb.WhoAmIRequest())
        except RpcError as err:
            if err.code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                raise PermissionError(errno.EACCES, f"token refused by mgmtd ({err.details})") from None
            raise Hf3fsError(f"cannot reach mgmtd at {','.join(addresses)}: {err.code.name} {err.details}") from None

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coro.close()
            raise ValueError("the file system is closed")
        if os.getpid() != self._pid:  # its loop thread and channels stayed in the parent
            coro.close()
            raise fork_error(f"a FileSystem made in process {self._pid} was used")
        acting = current_acting()  # the caller's thread's identity; the loop thread has its own context
        if acting is not None:
            coro = _as(acting, coro)
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled, a FileSystem is its arguments: unpickling connects again.

        The new client has its own sessions; files open here stay here. The pickle holds the token in clear, like
        the arguments it was made with: hand it to worker processes, do not store it.
        """
        return _reconnect, self._args

    def _meta_call(
        self,
        method: Callable[[MetaServiceClient], UnaryCall[RequestT, ResponseT]],
        request: RequestT,
        path: str | None = None,
    ) -> ResponseT:
        wb = self._wb
        if wb is not None and wb.busy() and not wb.on_flusher() and wb.related(places_of(request)):
            wb.flush()  # this client sees its queued files as committed
        try:
            return self._run(self._meta.call(method, request))
        except RpcError as err:
            raise os_error(err, path) from None

    def close(self) -> None:
        """Commits what write-back holds, closes every open file's write session, and disconnects.

        In a forked copy it only marks itself closed: the connection is the parent's.

        Raises:
            WritebackError: files whose write-back failed (the rest is closed all the same).
        """
        if self._closed:
            return
        if os.getpid() != self._pid:  # a forked copy: the connection belongs to the parent, leave it be
            self._closed = True
            return
        if self._wb is not None:
            self._wb.close()
        failures = self._wb.take_errors() if self._wb is not None else []
        try:
            self._teardown()
        finally:
            if failures:
                raise WritebackError(failures)

    def _teardown(self) -> None:
        with self._writers_lock:
            writers = list(self._writers.values())
        self._closing_by = time.monotonic() + self._close_retry_s
        for w in writers:
            with contextlib.suppress(OSError):
                w.close()
        self._run(self._close_unclosed())
        if self._unclosed:
            logger.warning(
                "closing with %d write sessions meta never closed: %s",
                len(self._unclosed),
                ", ".join(self.unclosed_sessions()),
            )

        async def teardown() -> None:
            self._stop.set()
            self._renewer.cancel()
            await asyncio.gather(self._renewer, return_exceptions=True)
            await self._storage.close()
            await self._meta.close()
            await self._mgmtd.close()

        self._run(teardown())
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    # ---- write-back of small files (hf3fs.writeback) ----

    def _writeback_queue(self) -> Writeback:
        with self._writers_lock:
            if self._wb is None:
                self._wb = Writeback(self, self._wb_options)
                _exiting.add(self)
                _catch_sigterm()
            return self._wb

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
        _abs(path)
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
        self._writeback_queue().submit(item)

    def sync(self) -> None:
        """Commit every file queued for write-back; ``WritebackError`` for each one whose commit failed.

        Failed since the last ``sync`` (or ``close``). Without write-back: nothing to do.
        """
        if self._wb is None:
            return
        self._wb.flush()
        failures = self._wb.take_errors()
        if failures:
            raise WritebackError(failures)

    def writeback_pending(self) -> int:
        """How many files are queued or being committed."""
        return self._wb.pending() if self._wb is not None else 0

    def writeback_stats(self) -> WritebackStats:
        """The write-back queue's counts (all zero before the first file was queued)."""
        return self._wb.stats() if self._wb is not None else WritebackStats()

    def writeback_held_bytes(self, quota_id: int) -> int:
        """Bytes of files queued or being committed with this ``quota_id`` (see ``write_back``)."""
        return self._wb.held_bytes(quota_id) if self._wb is not None else 0

    def __enter__(self) -> FileSystem:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- write sessions ----

    def _forget_writer(self, session_id: str) -> None:
        with self._writers_lock:
            self._writers.pop(session_id, None)

    def _local_length(self, inode_id: int) -> int:
        """The furthest any open writer of this client wrote into ``inode_id`` (0 if none)."""
        with self._writers_lock:
            return max((w.written for w in self._writers.values() if w.inode_id == inode_id), default=0)

    @contextlib.contextmanager
    def _append_guard(self, inode_id: int) -> Iterator[None]:
        """One appending thread per inode in this client (meta's append lease is per client)."""
        with self._writers_lock:
            lock = self._append_locks.setdefault(inode_id, threading.Lock())
        with lock:
            yield

    def _close_session(self, request: pb.CloseRequest, path: str) -> None:
        """Close a write session, retrying while meta cannot be reached, for up to ``close_retry_s``.

        Retries are idempotent: a retry that finds the session gone means an earlier attempt committed it.
        When the deadline passes the session is kept and closed later (by the renewer, within a second of meta
        answering again, or by ``close()``), and Hf3fsError is raised: until then the file's length may be
        short of what was written.

        Raises:
            Hf3fsError: meta did not answer within ``close_retry_s``.
            OSError: meta refused the close.
        """
        deadline = time.monotonic() + self._close_retry_s
        if self._closing_by is not None:
            deadline = min(deadline, self._closing_by)
        delay, retry = 0.1, False
        while True:
            try:
                self._run(self._close_once(request, retry))
                self._forget_writer(request.session_id)
                return
            except Hf3fsError as err:
                if time.monotonic() + delay > deadline:
                    with self._writers_lock:
                        self._writers.pop(request.session_id, None)
                        self._unclosed[request.session_id] = (request, path)
                    raise Hf3fsError(
                        f"{path}: close did not reach meta within {self._close_retry_s:g} s ({err}); "
                        "the session stays open and is closed once meta answers"
                    ) from None
            except OSError:
                self._forget_writer(request.session_id)
                raise
            time.sleep(delay)
            delay, retry = min(delay * 2, 2.0), True

    async def _close_once(self, request: pb.CloseRequest, retry: bool) -> None:
        """One Close; on a retry, a session meta no longer knows was closed by an earlier attempt.

        Raises:
            Hf3fsError: meta could not be reached.
            OSError: meta refused the close.
        """
        try:
            await self._meta.call(lambda m: m.close, request)
        except RpcError as err:
            error = os_error(err, None)
            if isinstance(error, Hf3fsError) or not retry or error.errno != errno.EBADF:
                raise error from None

    async def _close_unclosed(self) -> None:
        """Retry the closes that failed while meta was away; stop at the first that still cannot reach it."""
        with self._writers_lock:
            pending = list(self._unclosed.values())
        for request, path in pending:
            try:
                await self._close_once(request, retry=True)
            except Hf3fsError:
                return
            except OSError as err:
                logger.warning("%s: close of write session %s refused: %s", path, request.session_id, err)
            with self._writers_lock:
                self._unclosed.pop(request.session_id, None)

    def unclosed_sessions(self) -> list[str]:
        """Paths of files whose close has not reached meta yet (closed later, see ``_close_session``)."""
        with self._writers_lock:
            return [path for _, path in self._unclosed.values()]

    async def _renew_loop(self) -> None:
        """Every lease/4, report written lengths and renew the leases of every write session of this process.

        Meta says how long a lease is; each session carries it. Closes that did not reach meta are retried every
        ``UNCLOSED_RETRY_S``.
        """
        renew_at = time.monotonic()
        while not self._stop.is_set():
            if renew_at <= time.monotonic():
                with self._writers_lock:
                    writers = dict(self._writers)
                leases = [w.session.lease_s for w in writers.values() if w.session is not None and w.session.lease_s]
                renew_at = time.monotonic() + (self._renew_interval_s or (max(0.1, min(leases) / 4) if leases else 1.0))
            # wakes every UNCLOSED_RETRY_S at least, so a close that missed meta is retried within that of meta
            # answering again, not at the next renewal (lease/4, 7.5 s with meta's default lease)
            wait_s = min(max(0.0, renew_at - time.monotonic()), UNCLOSED_RETRY_S)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), wait_s)
                return
            if self._unclosed:
                await self._close_unclosed()
            if time.monotonic() < renew_at:
                continue
            with self._writers_lock:
                writers = dict(self._writers)
            if not writers:
                continue
            reports = [r for w in writers.values() if (r := w.report()) is not None]
            try:
                request = pb.RenewSessionsRequest(client_id=self.client_id, sessions=reports)
                resp = await self._meta.call(lambda m: m.renew_sessions, request)
            except (RpcError, Hf3fsError):
                continue
            for sid in resp.lost_session_ids:
                if sid in writers:
                    await self._reopen(writers[sid])

    async def _reopen(self, raw: RawFile) -> None:
        """A session meta collected (its lease lapsed while this process was too busy to renew it): open it again.

        Under the same id, or, if that fails (the file was renamed or removed), fail later writes.
        """
        session = raw.session
        if session is None:
            return
        request = pb.OpenRequest(
            path=_at(raw.name), open_mode=pb.OPEN_MODE_WRITE, session_id=session.session_id, client_id=self.client_id
        )
        try:
            resp = await self._meta.call(lambda m: m.open, request)
        except (RpcError, Hf3fsError):
            session_lost(raw)
            return
        if resp.inode.inode_id != raw.inode_id:
            session_lost(raw)
            return
        raw.session_renewed(resp.session)

    def renew_sessions_now(self) -> None:
        """Report written lengths and renew leases now (normally every lease/3 seconds)."""
        with self._writers_lock:
            reports = [r for w in self._writers.values() if (r := w.report()) is not None]
        self._meta_call(lambda m: m.renew_sessions, pb.RenewSessionsRequest(client_id=self.client_id, sessions=reports))

    # ---- metadata ----

    def stat(self, path: str, follow_symlinks: bool = True) -> Stat:
        """The attributes of ``path`` (of a symlink's target; of the link itself without ``follow_symlinks``).

        Raises:
            OSError: FileNotFoundError, NotADirectoryError, PermissionError... as meta answered.
        """
        resp = self._meta_call(
            lambda m: m.stat, pb.StatRequest(path=_at(path), follow_last_symlink=follow_symlinks), path
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
            lambda m: m.batch_stat, pb.BatchStatRequest(paths=[_at(p) for p in paths], follow_last_symlink=True)
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
                lambda m: m.list, pb.ListRequest(path=_at(path), page_token=token, include_inodes=with_inodes), path
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

    def mkdir(self, path: str, mode: int = 0o755) -> None:
        """Makes a folder whose parent exists (FileExistsError when the name is taken)."""
        self._meta_call(lambda m: m.mkdirs, pb.MkdirsRequest(path=_at(path), mode=mode), path)

    def makedirs(self, path: str, mode: int = 0o755, exist_ok: bool = False) -> None:
        """Makes a folder and its missing parents in one meta call; FileExistsError if it is there, unless exist_ok."""
        if not exist_ok and self.exists(path):
            raise FileExistsError(errno.EEXIST, "File exists", path)
        self._meta_call(lambda m: m.mkdirs, pb.MkdirsRequest(path=_at(path), mode=mode, recursive=True), path)

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
            pb.CreateRequest(path=_at(path), mode=mode, exclusive=exclusive, open_mode=pb.OPEN_MODE_READ),
            path,
        )
        room = (resp.quota_room_bytes, resp.quota_inode_id) if resp.HasField("quota_room_bytes") else None
        return Stat.from_pb(resp.inode), room

    def remove(self, path: str) -> None:
        """unlink(2): a file, symlink or special file (IsADirectoryError for a folder, nothing removed).

        One meta call: meta checks the type in the same transaction.
        """
        self._meta_call(lambda m: m.remove, pb.RemoveRequest(path=_at(path), expect_directory=False), path)

    unlink = remove

    def rmdir(self, path: str) -> None:
        """Removes an empty folder, as rmdir (NotADirectoryError for anything else, nothing removed)."""
        self._meta_call(lambda m: m.remove, pb.RemoveRequest(path=_at(path), expect_directory=True), path)

    def rmtree(self, path: str, trash: bool = True) -> str:
        """Remove a tree; to the trash by default (returns the trash entry id), else deleted now."""
        resp = self._meta_call(lambda m: m.remove, pb.RemoveRequest(path=_at(path), recursive=True), path)
        if not trash:
            self._meta_call(lambda m: m.empty_trash, pb.EmptyTrashRequest(trash_ids=[resp.trash_id]), path)
            return ""
        return str(resp.trash_id)

    def rename(self, src: str, dst: str) -> None:
        """Renames ``src`` to ``dst`` atomically, with the POSIX rename's rules; a tree moves in one meta call."""
        self._meta_call(lambda m: m.rename, pb.RenameRequest(src_path=_at(src), dst_path=_at(dst)), src)

    def symlink(self, target: str, link_path: str) -> None:
        """Makes a symlink at ``link_path`` pointing to ``target`` (kept as given, not resolved)."""
        self._meta_call(lambda m: m.symlink, pb.SymlinkRequest(path=_at(link_path), target=target), link_path)

    def mknod(self, path: str, mode: int = 0o600 | stat_mod.S_IFIFO, device: int = 0) -> Stat:
        """A FIFO, socket or device node (``mode`` carries its type bits, as os.mknod's does)."""
        kind = _NODE_TYPES.get(stat_mod.S_IFMT(mode))
        if kind is None:
            raise OSError(errno.EINVAL, "mknod makes FIFOs, sockets and device nodes", path)
        resp = self._meta_call(
            lambda m: m.mknod,
            pb.MknodRequest(path=_at(path), type=kind, mode=stat_mod.S_IMODE(mode), rdev=device),
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
            lambda m: m.hard_link, pb.HardLinkRequest(old_path=_at(existing), new_path=_at(new_path)), new_path
        )

    def truncate(self, path: str, length: int) -> None:
        """Cuts or extends (a hole) the file at ``path`` to ``length`` bytes.

        Raises:
            OSError: EINVAL for a negative length; EDQUOT when growing it goes over a quota.
        """
        if length < 0:
            raise OSError(errno.EINVAL, "negative length", path)
        self._meta_call(lambda m: m.truncate, pb.TruncateRequest(path=_at(path), length_bytes=length), path)

    def chmod(self, path: str, mode: int, *, follow_symlinks: bool = True) -> Stat:
        """Returns the inode as meta left it (as chown and utime do)."""
        return Stat.from_pb(
            self._meta_call(
                lambda m: m.set_attr,
                pb.SetAttrRequest(path=_at(path), follow_last_symlink=follow_symlinks, mode=mode),
                path,
            ).inode
        )

    def chown(self, path: str, uid: int, gid: int, *, follow_symlinks: bool = True) -> Stat:
        """Sets the owner and/or group (-1 keeps one); returns the new attributes."""
        req = pb.SetAttrRequest(path=_at(path), follow_last_symlink=follow_symlinks)
        if uid >= 0:
            req.uid = uid
        if gid >= 0:
            req.gid = gid
        return Stat.from_pb(self._meta_call(lambda m: m.set_attr, req, path).inode)

    def utime(self, path: str, ns: tuple[int, int] | None = None, *, follow_symlinks: bool = True) -> Stat:
        """Sets the access and modification times, in ns (None: both now, which needs write permission only)."""
        req = pb.SetAttrRequest(path=_at(path), follow_last_symlink=follow_symlinks)
        if ns is None:
            req.atime_now = req.mtime_now = True
        else:
            req.atime_ns, req.mtime_ns = ns
        return Stat.from_pb(self._meta_call(lambda m: m.set_attr, req, path).inode)

    def realpath(self, path: str) -> str:
        """The canonical absolute path of ``path``: symlinks resolved, ``.`` and ``..`` gone."""
        return str(self._meta_call(lambda m: m.realpath, pb.RealpathRequest(path=_at(path)), path).path)

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
        quotas = self._meta_call(lambda m: m.get_quota, pb.GetQuotaRequest(path=_at(path)), path).quotas
        return quota_of(quotas[0]) if quotas else None

    def get_quotas(self, path: str) -> list[Quota]:
        """Every directory quota that applies to ``path``, nearest first."""
        return [
            quota_of(q) for q in self._meta_call(lambda m: m.get_quota, pb.GetQuotaRequest(path=_at(path)), path).quotas
        ]

    def set_quota(self, path: str, max_bytes: int | None = None, max_inodes: int | None = None) -> Quota:
        """Sets a folder's quota (admins); a limit None (or 0) is none of that kind, and both None remove the quota.

        A limit below the current use is allowed: it blocks further growth.
        """
        resp = self._meta_call(
            lambda m: m.set_quota,
            pb.SetQuotaRequest(path=_at(path), max_bytes=max_bytes or 0, max_inodes=max_inodes or 0),
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
            req.path.CopyFrom(_at(path))
        return str(self._meta_call(lambda m: m.restore_trash_entry, req, path).path)

    def trash_empty(self, entry_ids: list[str] | None = None) -> int:
        """Deletes trash entries now (default: all of the caller's); the number deleted. Unknown ids are ignored."""
        resp = self._meta_call(lambda m: m.empty_trash, pb.EmptyTrashRequest(trash_ids=entry_ids or []))
        return int(resp.num_deleted)

    # ---- data ----

    def _layout(self, inode: pb.Inode) -> FileLayout:
        """The file's chains over its chain table as the storage client's routing holds it.

        The one routing cache of this client: fetched again when the table is unknown or shorter than the stripe.
        """
        table_id, routing = inode.layout.chain_table_id, self._storage.routing
        table = routing.view.table(table_id) if routing.view is not None else None
        if table is None or len(table.chain_ids) < inode.layout.stripe_size:
            table = self._run(routing.refresh(force=True)).table(table_id)
        if table is None:
            raise OSError(errno.EIO, f"chain table {table_id} is unknown")
        return layout_of(inode, table.chain_ids)

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
        _abs(path)
        if (self._wb_default if writeback is None else writeback) and om.truncate and not om.readable:
            return self._open_writeback(path, mode, om, perm, buffering, encoding, errors, newline)
        session_id = uuid.uuid4().hex if om.writable else ""
        open_mode = (
            (pb.OPEN_MODE_READ_WRITE if om.readable and not write_only else pb.OPEN_MODE_WRITE)
            if om.writable
            else pb.OPEN_MODE_READ
        )
        resp: pb.CreateResponse | pb.OpenResponse
        if om.create:
            resp = self._meta_call(
                lambda m: m.create,
                pb.CreateRequest(
                    path=_at(path),
                    mode=perm,
                    exclusive=om.exclusive,
                    open_mode=open_mode,
                    truncate=om.truncate,
                    session_id=session_id,
                    client_id=self.client_id,
                ),
                path,
            )
        else:
            resp = self._meta_call(
                lambda m: m.open,
                pb.OpenRequest(path=_at(path), open_mode=open_mode, session_id=session_id, client_id=self.client_id),
                path,
            )
        inode = resp.inode
        if inode.type == pb.INODE_TYPE_DIRECTORY:
            raise IsADirectoryError(errno.EISDIR, "Is a directory", path)
        session = resp.session if resp.HasField("session") else None
        raw = RawFile(self._backend, path, mode, om, inode, self._layout(inode), resp.io_capability.token, session)
        raw.cap_expires_at_ns = resp.io_capability.expires_at_ns
        if session is not None:
            with self._writers_lock:
                self._writers[session.session_id] = raw
        if om.append:
            raw.seek(raw.length)  # the length Open just answered
        try:
            return wrap(raw, om, buffering, encoding, errors, newline)
        except BaseException:
            raw.close()
            raise

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
        f = WritebackFile(self, path, mode, perm, self._writeback_queue().options.max_file_bytes)
        if om.binary:
            return f
        return io.TextIOWrapper(
            f, encoding=encoding or "utf-8", errors=errors, newline=newline, line_buffering=buffering == 1
        )

    def read_batch(self, reads: list[tuple[str, int, int]]) -> list[bytes]:
        """Many (path, offset, length) reads: one BatchStat for the files, then all chunks in one batch.

        A read past the end of a file stops there (as ``read`` does): a length of ``WHOLE_FILE`` reads to the end.
        """
        jobs = self._read_jobs(reads)

        async def all_reads() -> list[bytearray | memoryview]:
            return list(
                await asyncio.gather(
                    *(read_spans(self._storage, layout, cap, off, size, p) for p, layout, cap, off, size in jobs)
                )
            )

        return [bytes(b) for b in self._run(all_reads())]

    def read_batch_into(self, reads: list[tuple[str, int, int]], buffers: Sequence[Any]) -> list[int]:
        """``read_batch`` into the caller's writable buffers; the number of bytes each read (short past its file's end).

        One buffer per read, each at least its length; the bytes land there from the transport, no copy.
        """
        if len(buffers) != len(reads):
            raise ValueError(f"{len(reads)} reads but {len(buffers)} buffers")
        views = [memoryview(b).cast("B") for b in buffers]
        for n, ((p, _, length), view) in enumerate(zip(reads, views, strict=True)):
            if view.readonly or (length != WHOLE_FILE and len(view) < length):
                raise ValueError(f"buffers[{n}] ({p}): must be writable and hold {length} bytes")
        jobs = self._read_jobs(reads)
        for n, ((p, _, _, _, size), view) in enumerate(zip(jobs, views, strict=True)):
            if len(view) < size:
                raise ValueError(f"buffers[{n}] ({p}): holds {len(view)} bytes, the read is {size}")

        async def all_reads() -> None:
            await asyncio.gather(
                *(
                    read_spans(self._storage, layout, cap, off, size, p, view[:size])
                    for (p, layout, cap, off, size), view in zip(jobs, views, strict=True)
                )
            )

        self._run(all_reads())
        return [size for _, _, _, _, size in jobs]

    def _read_jobs(self, reads: list[tuple[str, int, int]]) -> list[tuple[str, FileLayout, bytes, int, int]]:
        """Each read's (path, layout, read capability, offset, bytes to read): one BatchStat for the files."""
        paths = list(dict.fromkeys(p for p, _, _ in reads))
        resp = self._meta_call(
            lambda m: m.batch_stat,
            pb.BatchStatRequest(paths=[_at(p) for p in paths], follow_last_symlink=True, include_read_capability=True),
        )
        files: dict[str, tuple[pb.Inode, bytes]] = {}
        for p, r in zip(paths, resp.results, strict=True):
            if r.error:
                code = ERRNO_OF_FS_ERROR.get(pb.FsError.Name(r.error), errno.EIO)
                raise OSError(code, os.strerror(code), p)
            if r.inode.type != pb.INODE_TYPE_FILE:
                raise IsADirectoryError(errno.EISDIR, "Is a directory", p)
            if not r.read_capability.token:
                raise PermissionError(errno.EACCES, "Permission denied", p)
            files[p] = (r.inode, r.read_capability.token)
        layouts = {p: self._layout(files[p][0]) for p in paths}
        jobs = []
        for p, off, n in reads:
            inode, cap = files[p]
            jobs.append((p, layouts[p], cap, off, max(0, min(n, inode.length_bytes - off))))
        return jobs

    def write_batch(self, writes: list[tuple[str, int, bytes]]) -> None:
        """Many (path, offset, data) writes into existing files: one session per file, chunks in one batch."""
        opened: dict[str, RawFile] = {}
        try:
            for p, _, _ in writes:
                if p not in opened:
                    opened[p] = self.open(p, "r+b", buffering=0)
            for p, off, data in writes:
                opened[p].ensure_room(off + len(data))

            async def all_writes() -> None:
                await asyncio.gather(
                    *(
                        write_spans(self._storage, opened[p].layout, opened[p]._cap, off, memoryview(data), p)
                        for p, off, data in writes
                    )
                )

            self._run(all_writes())
            for p, off, data in writes:
                raw = opened[p]
                raw.written = max(raw.written, off + len(data))
                raw.length = max(raw.length, off + len(data))
        finally:
            for raw in opened.values():
                raw.close()


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


_exiting: weakref.WeakSet[FileSystem] = weakref.WeakSet()  # file systems with a write-back queue


@atexit.register
def _commit_at_exit() -> None:
    """A process exiting with files queued for write-back commits them; what fails is logged (by the flusher)."""
    for fs in list(_exiting):
        if not fs._closed and fs._wb is not None and os.getpid() == fs._pid:
            with contextlib.suppress(Exception):
                fs._wb.flush()


SIGTERM_COMMIT_S = 8.0  # what a SIGTERM waits for queued files (docker stop waits 10 s before SIGKILL)


def _commit_then_die(signum: int, frame: Any) -> None:
    """SIGTERM runs no atexit: commit the queued files first, then die of the signal as its default action would.

    SIGTERM comes from ``kill``, ``docker stop``, a task stopped. The commit lasts at most ``SIGTERM_COMMIT_S``
    and runs in another thread, so a main thread stopped inside the queue cannot hold it up.
    """
    committer = threading.Thread(target=_commit_at_exit, name="hf3fs-sigterm-commit", daemon=True)
    committer.start()
    committer.join(SIGTERM_COMMIT_S)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _catch_sigterm() -> None:
    """Commit queued files on SIGTERM, where the process left SIGTERM to its default action.

    A handler of its own is left alone: it decides how to exit, and atexit or ``fs.close()`` commit. Only the
    main thread may set a handler: a write-back first used elsewhere sets none.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    with contextlib.suppress(ValueError, OSError):
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _commit_then_die)


def connect(mgmtd: str | list[str] | None = None, token: str | None = None, **kwargs: Any) -> FileSystem:
    """A FileSystem for the cluster at ``mgmtd`` (default: FF_MGMTD_ADDRESSES) with ``token`` (default: FF_TOKEN)."""
    mgmtd = mgmtd or os.environ.get("FF_MGMTD_ADDRESSES", "")
    token = token or os.environ.get("FF_TOKEN", "")
    if not mgmtd:
        raise ValueError("no mgmtd address: pass mgmtd= or set FF_MGMTD_ADDRESSES")
    return FileSystem(mgmtd, token, **kwargs)


class _FileBackend:
    """What an open file needs of its ``FileSystem`` (``files.FileBackend``), so ``files`` never imports ``fs``."""

    def __init__(self, fs: FileSystem) -> None:
        self._fs = fs

    @property
    def client_id(self) -> str:
        """The id meta knows this client's write sessions by."""
        return self._fs.client_id

    @property
    def storage(self) -> StorageClient:
        """The storage client the file's chunks go through."""
        return self._fs._storage

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """``FileSystem._run``: on the file system's loop, as the calling thread's identity."""
        return self._fs._run(coro)

    def meta_call(
        self,
        method: Callable[[MetaServiceClient], UnaryCall[RequestT, ResponseT]],
        request: RequestT,
        path: str | None = None,
    ) -> ResponseT:
        """``FileSystem._meta_call``: write-back flushed first, OSError when meta refuses."""
        return self._fs._meta_call(method, request, path)

    def local_length(self, inode_id: int) -> int:
        """The furthest any open writer of this client wrote into ``inode_id`` (0 if none)."""
        return self._fs._local_length(inode_id)

    def append_guard(self, inode_id: int) -> contextlib.AbstractContextManager[None]:
        """One appending thread per inode in this client."""
        return self._fs._append_guard(inode_id)

    def close_session(self, request: pb.CloseRequest, path: str) -> None:
        """``FileSystem._close_session``: retried while meta cannot be reached, for up to ``close_retry_s``."""
        self._fs._close_session(request, path)
