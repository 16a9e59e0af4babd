"""The clients of one FileSystem (mgmtd, meta, storage) and the private event-loop thread they run on."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
import uuid
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import grpc

from ff_cluster import MgmtdClient
from ff_fsprotocol.layout import FileLayout
from ff_rpc import Identity, RpcError, acting_as, current_acting
from ff_rpc.client import UnaryCall
from fireflyer.meta.v1 import meta_pb2 as pb
from fireflyer.meta.v1.meta_client import MetaServiceClient
from fireflyer.mgmtd.v1 import mgmtd_pb2 as mpb
from hf3fs.forks import Process, fork_error
from hf3fs.meta_client import Hf3fsError, MetaClient, os_error
from hf3fs.spans import layout_of
from hf3fs.storage_client import StorageClient

T = TypeVar("T")
RequestT = TypeVar("RequestT")
ResponseT = TypeVar("ResponseT")


async def _as(identity: Identity, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` with its calls acting as ``identity`` (see ``ff_rpc.acting_as``).

    The task this runs in has a context of its own, so the identity ends with it.
    """
    with acting_as(identity):
        return await coro


class Connection:
    """One client of a cluster: its async clients on a private event-loop thread, callable from any thread.

    Made in one process and used only there (gRPC does not survive ``fork()``: see ``hf3fs.fs``).
    """

    def __init__(
        self,
        addresses: list[str],
        token: str,
        *,
        meta_addresses: list[str] | None,
        timeout_s: float,
        close_retry_s: float,
    ) -> None:
        """Start the loop thread and the clients, then check the token with mgmtd.

        Raises:
            ForkedProcessError: this process was forked from one where gRPC ran.
            PermissionError: mgmtd refused the token.
            Hf3fsError: no mgmtd answered.
        """
        if Process.forked_after_grpc:
            raise fork_error("hf3fs.connect()")
        Process.grpc_started = True
        self.pid = os.getpid()
        self.client_id = uuid.uuid4().hex  # the id meta knows this client's write sessions by
        self.timeout_s = timeout_s  # of one meta call (write-back's batches get more: see hf3fs.writeback)
        self.close_retry_s = close_retry_s  # how long a close (or a write-back batch) waits for meta to answer
        self.closed = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="hf3fs-loop", daemon=True)
        self._thread.start()

        async def setup() -> None:
            self._mgmtd = MgmtdClient(addresses, token=token, timeout_s=10.0)
            self.meta = MetaClient(self._mgmtd, token, addresses=meta_addresses, timeout_s=timeout_s)
            self.storage = StorageClient(self._mgmtd, token)

        self.run(setup())
        try:
            self.run(self._check_token(addresses))
        except BaseException:
            self.close()
            raise

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

    def in_origin_process(self) -> bool:
        """Whether this is the process that connected (not a forked copy of it)."""
        return os.getpid() == self.pid

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop thread and wait for it, acting as the calling thread's identity.

        Raises:
            ValueError: the connection is closed.
            ForkedProcessError: called in a forked copy of the process that connected.
        """
        if self.closed:
            coro.close()
            raise ValueError("the file system is closed")
        if not self.in_origin_process():  # its loop thread and channels stayed in the parent
            coro.close()
            raise fork_error(f"a FileSystem made in process {self.pid} was used")
        acting = current_acting()  # the caller's thread's identity; the loop thread has its own context
        if acting is not None:
            coro = _as(acting, coro)
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def meta_call(
        self,
        method: Callable[[MetaServiceClient], UnaryCall[RequestT, ResponseT]],
        request: RequestT,
        path: str | None = None,
    ) -> ResponseT:
        """One meta call, as the calling thread's identity.

        Raises:
            OSError: meta refused it (the errno of its error, about ``path``); Hf3fsError when no meta answered.
        """
        try:
            return self.run(self.meta.call(method, request))
        except RpcError as err:
            raise os_error(err, path) from None

    def layout(self, inode: pb.Inode) -> FileLayout:
        """The file's chains over its chain table as the storage client's routing holds it.

        The one routing cache of this client: fetched again when the table is unknown or shorter than the stripe.
        """
        table_id, routing = inode.layout.chain_table_id, self.storage.routing
        table = routing.view.table(table_id) if routing.view is not None else None
        if table is None or len(table.chain_ids) < inode.layout.stripe_size:
            table = self.run(routing.refresh(force=True)).table(table_id)
        if table is None:
            raise OSError(errno.EIO, f"chain table {table_id} is unknown")
        return layout_of(inode, table.chain_ids)

    def abandon(self) -> None:
        """In a forked copy: only mark the connection closed (its loop thread and channels are the parent's)."""
        self.closed = True

    def close(self) -> None:
        """Close the clients and stop the loop thread; later calls raise ValueError."""

        async def teardown() -> None:
            await self.storage.close()
            await self.meta.close()
            await self._mgmtd.close()

        self.run(teardown())
        self.closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
