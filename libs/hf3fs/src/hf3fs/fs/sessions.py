"""The write sessions of one FileSystem: its open writers, their closes (retried) and the lease renewer."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar

from ff_rpc import RpcError
from ff_rpc.client import UnaryCall
from fireflyer.meta.v1 import meta_pb2 as pb
from fireflyer.meta.v1.meta_client import MetaServiceClient
from hf3fs.files import RawFile, session_lost
from hf3fs.fs.connection import Connection
from hf3fs.fs.paths import path_at
from hf3fs.keyed_locks import KeyedLocks
from hf3fs.meta_client import Hf3fsError, os_error
from hf3fs.storage_client import StorageClient

logger = logging.getLogger(__name__)
T = TypeVar("T")
RequestT = TypeVar("RequestT")
ResponseT = TypeVar("ResponseT")

UNCLOSED_RETRY_S = 0.5  # how often the renewer retries closes that did not reach meta


class MetaCall(Protocol):
    """The file system's meta call: ``Connection.meta_call`` after write-back committed the queued files it names."""

    def __call__(
        self,
        method: Callable[[MetaServiceClient], UnaryCall[RequestT, ResponseT]],
        request: RequestT,
        path: str | None = None,
    ) -> ResponseT:
        """One meta call; OSError for ``path`` when meta refuses it."""
        ...


class WriteSessions:
    """The write sessions of one client: which files are open for writing, closing them, keeping their leases.

    A close that cannot reach meta is retried for up to ``close_retry_s``, then kept and closed by the renewer once
    meta answers (or by ``close``). The renewer, on the connection's loop, reports written lengths and renews the
    leases every lease/4 and opens again a session meta collected.
    """

    def __init__(self, conn: Connection, meta_call: MetaCall, renew_interval_s: float | None) -> None:
        self._conn = conn
        self._meta_call = meta_call  # the file system's (write-back flushed first)
        self._renew_interval_s = renew_interval_s
        self._writers: dict[str, RawFile] = {}
        self._lock = threading.Lock()
        self._unclosed: dict[str, tuple[pb.CloseRequest, str]] = {}  # sessions whose Close did not reach meta
        self._append_locks = KeyedLocks()  # one appending thread per inode (a lock only while it is appended to)
        self._closing_by: float | None = None  # while close() runs: one retry deadline for all its writers

        async def start() -> None:
            self._stop = asyncio.Event()
            self._renewer = asyncio.ensure_future(self._renew_loop())

        conn.run(start())

    # ---- open writers ----

    def add(self, raw: RawFile, session_id: str) -> None:
        """Track a file opened for writing under its write session."""
        with self._lock:
            self._writers[session_id] = raw

    def _forget(self, session_id: str) -> None:
        with self._lock:
            self._writers.pop(session_id, None)

    def local_length(self, inode_id: int) -> int:
        """The furthest any open writer of this client wrote into ``inode_id`` (0 if none)."""
        with self._lock:
            return max((w.written for w in self._writers.values() if w.inode_id == inode_id), default=0)

    def append_guard(self, inode_id: int) -> contextlib.AbstractContextManager[None]:
        """One appending thread per inode in this client (meta's append lease is per client)."""
        return self._append_locks.hold(inode_id)

    # ---- closes ----

    def close_session(self, request: pb.CloseRequest, path: str) -> None:
        """Close a write session, retrying while meta cannot be reached, for up to ``close_retry_s``.

        Retries are idempotent: a retry that finds the session gone means an earlier attempt committed it.
        When the deadline passes the session is kept and closed later (by the renewer, within a second of meta
        answering again, or by ``close()``), and Hf3fsError is raised: until then the file's length may be
        short of what was written.

        Raises:
            Hf3fsError: meta did not answer within ``close_retry_s``.
            OSError: meta refused the close.
        """
        close_retry_s = self._conn.close_retry_s
        deadline = time.monotonic() + close_retry_s
        if self._closing_by is not None:
            deadline = min(deadline, self._closing_by)
        delay, retry = 0.1, False
        while True:
            try:
                self._conn.run(self._close_once(request, retry))
                self._forget(request.session_id)
                return
            except Hf3fsError as err:
                if time.monotonic() + delay > deadline:
                    with self._lock:
                        self._writers.pop(request.session_id, None)
                        self._unclosed[request.session_id] = (request, path)
                    raise Hf3fsError(
                        f"{path}: close did not reach meta within {close_retry_s:g} s ({err}); "
                        "the session stays open and is closed once meta answers"
                    ) from None
            except OSError:
                self._forget(request.session_id)
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
            await self._conn.meta.call(lambda m: m.close, request)
        except RpcError as err:
            error = os_error(err, None)
            if isinstance(error, Hf3fsError) or not retry or error.errno != errno.EBADF:
                raise error from None

    async def _close_unclosed(self) -> None:
        """Retry the closes that failed while meta was away; stop at the first that still cannot reach it."""
        with self._lock:
            pending = list(self._unclosed.values())
        for request, path in pending:
            try:
                await self._close_once(request, retry=True)
            except Hf3fsError:
                return
            except OSError as err:
                logger.warning("%s: close of write session %s refused: %s", path, request.session_id, err)
            with self._lock:
                self._unclosed.pop(request.session_id, None)

    def unclosed(self) -> list[str]:
        """Paths of files whose close has not reached meta yet (closed later, see ``close_session``)."""
        with self._lock:
            return [path for _, path in self._unclosed.values()]

    def close(self) -> None:
        """Close every open writer (one retry deadline for all), retry the unclosed sessions once, stop the renewer."""
        with self._lock:
            writers = list(self._writers.values())
        self._closing_by = time.monotonic() + self._conn.close_retry_s
        for w in writers:
            with contextlib.suppress(OSError):
                w.close()
        self._conn.run(self._close_unclosed())
        if self._unclosed:
            logger.warning(
                "closing with %d write sessions meta never closed: %s",
                len(self._unclosed),
                ", ".join(self.unclosed()),
            )

        async def stop() -> None:
            self._stop.set()
            self._renewer.cancel()
            await asyncio.gather(self._renewer, return_exceptions=True)

        self._conn.run(stop())

    # ---- leases ----

    async def _renew_loop(self) -> None:
        """Every lease/4, report written lengths and renew the leases of every write session of this process.

        Meta says how long a lease is; each session carries it. Closes that did not reach meta are retried every
        ``UNCLOSED_RETRY_S``.
        """
        renew_at = time.monotonic()
        while not self._stop.is_set():
            if renew_at <= time.monotonic():
                with self._lock:
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
            with self._lock:
                writers = dict(self._writers)
            if not writers:
                continue
            reports = [r for w in writers.values() if (r := w.report()) is not None]
            try:
                request = pb.RenewSessionsRequest(client_id=self._conn.client_id, sessions=reports)
                resp = await self._conn.meta.call(lambda m: m.renew_sessions, request)
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
            path=path_at(raw.name),
            open_mode=pb.OPEN_MODE_WRITE,
            session_id=session.session_id,
            client_id=self._conn.client_id,
        )
        try:
            resp = await self._conn.meta.call(lambda m: m.open, request)
        except (RpcError, Hf3fsError):
            session_lost(raw)
            return
        if resp.inode.inode_id != raw.inode_id:
            session_lost(raw)
            return
        raw.session_renewed(resp.session)
        raw.take_capability(resp.io_capability.token, resp.io_capability.expires_at_ns)

    def renew_now(self) -> None:
        """Report written lengths and renew leases now."""
        with self._lock:
            reports = [r for w in self._writers.values() if (r := w.report()) is not None]
        self._meta_call(
            lambda m: m.renew_sessions, pb.RenewSessionsRequest(client_id=self._conn.client_id, sessions=reports)
        )


class OpenFileBackend:
    """What an open file needs of its file system (``files.FileBackend``): the connection and the write sessions."""

    def __init__(self, conn: Connection, sessions: WriteSessions, meta_call: MetaCall) -> None:
        self._conn = conn
        self._sessions = sessions
        self._meta_call = meta_call

    @property
    def client_id(self) -> str:
        """The id meta knows this client's write sessions by."""
        return self._conn.client_id

    @property
    def storage(self) -> StorageClient:
        """The storage client the file's chunks go through."""
        return self._conn.storage

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """``Connection.run``: on the file system's loop, as the calling thread's identity."""
        return self._conn.run(coro)

    def meta_call(
        self,
        method: Callable[[MetaServiceClient], UnaryCall[RequestT, ResponseT]],
        request: RequestT,
        path: str | None = None,
    ) -> ResponseT:
        """The file system's meta call: write-back flushed first, OSError when meta refuses."""
        return self._meta_call(method, request, path)

    def local_length(self, inode_id: int) -> int:
        """The furthest any open writer of this client wrote into ``inode_id`` (0 if none)."""
        return self._sessions.local_length(inode_id)

    def append_guard(self, inode_id: int) -> contextlib.AbstractContextManager[None]:
        """One appending thread per inode in this client."""
        return self._sessions.append_guard(inode_id)

    def close_session(self, request: pb.CloseRequest, path: str) -> None:
        """``WriteSessions.close_session``: retried while meta cannot be reached, for up to ``close_retry_s``."""
        self._sessions.close_session(request, path)
