"""Async client of the meta service: finds meta in mgmtd's routing, fails over, turns meta's errors into OSError.

Meta's errors come as ``ff-fs-error`` trailing metadata, which gives the errno.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import random
from collections.abc import Callable
from typing import TypeVar

import grpc

from ff_cluster import MgmtdClient
from ff_fsprotocol.meta_once import ONCE_METHODS, ONCE_TAG, ONCE_TAG_VALUE
from ff_rpc import RetriesExhausted, RetryPolicy, RpcClient, RpcError
from ff_rpc.client import NO_RETRY, ChannelInvoker, ChannelPool, UnaryCall
from ff_rpc.fastpath import FastPool
from fireflyer.common.v1 import common_pb2
from fireflyer.meta.v1 import meta_pb2
from fireflyer.meta.v1.meta_client import MetaServiceClient
from fireflyer.mgmtd.v1 import mgmtd_pb2 as mpb

logger = logging.getLogger(__name__)

FS_ERROR_METADATA = "ff-fs-error"
RequestT = TypeVar("RequestT")
ResponseT = TypeVar("ResponseT")

ERRNO_OF_FS_ERROR = {
    "FS_ERROR_NOT_FOUND": errno.ENOENT,
    "FS_ERROR_EXISTS": errno.EEXIST,
    "FS_ERROR_NOT_DIRECTORY": errno.ENOTDIR,
    "FS_ERROR_IS_DIRECTORY": errno.EISDIR,
    "FS_ERROR_NOT_EMPTY": errno.ENOTEMPTY,
    "FS_ERROR_ACCESS_DENIED": errno.EACCES,
    "FS_ERROR_NOT_PERMITTED": errno.EPERM,
    "FS_ERROR_NAME_TOO_LONG": errno.ENAMETOOLONG,
    "FS_ERROR_INVALID_ARGUMENT": errno.EINVAL,
    "FS_ERROR_SYMLINK_LOOP": errno.ELOOP,
    "FS_ERROR_RENAME_LOOP": errno.EINVAL,
    "FS_ERROR_QUOTA_EXCEEDED": errno.EDQUOT,
    "FS_ERROR_NO_SPACE": errno.ENOSPC,
    "FS_ERROR_TOO_MANY_LINKS": errno.EMLINK,
    "FS_ERROR_BAD_SESSION": errno.EBADF,
    "FS_ERROR_BUSY": errno.EBUSY,
    "FS_ERROR_CONFLICT": errno.EAGAIN,
    "FS_ERROR_STALE": errno.ESTALE,
}
ERRNO_OF_FS_ERROR_VALUE = {i + 1: e for i, e in enumerate(ERRNO_OF_FS_ERROR.values())}
_ERRNO_OF_CODE = {
    grpc.StatusCode.NOT_FOUND: errno.ENOENT,
    grpc.StatusCode.ALREADY_EXISTS: errno.EEXIST,
    grpc.StatusCode.PERMISSION_DENIED: errno.EACCES,
    grpc.StatusCode.UNAUTHENTICATED: errno.EACCES,
    grpc.StatusCode.INVALID_ARGUMENT: errno.EINVAL,
    grpc.StatusCode.RESOURCE_EXHAUSTED: errno.ENOSPC,
    grpc.StatusCode.ABORTED: errno.EAGAIN,
    grpc.StatusCode.FAILED_PRECONDITION: errno.EINVAL,
}


class Hf3fsError(ConnectionError):
    """The file system could not be reached (no meta or storage answered)."""


def os_error(err: RpcError, path: str | None = None) -> OSError:
    """The OSError (with errno and filename) for a failed meta call."""
    name = err.trailing_metadata.get(FS_ERROR_METADATA, "")
    code = ERRNO_OF_FS_ERROR.get(name) or _ERRNO_OF_CODE.get(err.code)
    if code is None:
        return Hf3fsError(f"{err.code.name}: {err.details}")
    return OSError(code, err.details or errno.errorcode.get(code, ""), path)


class MetaClient:
    """Calls one of the meta services, failing over to the others.

    A call that never reached an instance (no connection) goes to the next one whatever the method; a connection
    lost mid-call or a timeout is retried elsewhere only for methods the proto marks idempotent and for those meta
    does once per key (``ff_fsprotocol.meta_once``: Rename, Remove, Mkdirs, ...; every attempt carries the call's
    key, and meta answers a repeated key with its first result), while every meta instance it may call says in its
    mgmtd registration that it does (an older one would run the retry as a new call). Others may have run (a Create
    sent again would apply twice): they are not retried. ``ff_rpc.retry_call``, with this client as its
    router: the next instance at once, a backoff and fresh routing after a round of them all.
    """

    def __init__(
        self,
        mgmtd: MgmtdClient,
        token: str,
        *,
        addresses: list[str] | None = None,
        timeout_s: float = 30.0,
        attempts: int = 6,
    ) -> None:
        self._mgmtd = mgmtd
        self._fixed = list(addresses or [])
        self._addresses: list[str] = list(self._fixed)
        self._current = 0
        self._channels = ChannelPool()
        self._fast = FastPool()
        self._fast_of: dict[str, str] = {}  # gRPC address -> the same instance's fast endpoint (``ff_rpc.fastpath``)
        self._looked_up = False  # whether mgmtd was asked yet (fixed addresses: for their fast endpoints)
        self._once_everywhere = False  # whether every instance called records ONCE_METHODS' keys (mgmtd's tags)
        retry = RetryPolicy(max_attempts=attempts, initial_backoff_s=0.1, max_backoff_s=1.0)
        rpc = RpcClient(token=token, timeout_s=timeout_s, retry=NO_RETRY)
        self._client = MetaServiceClient(
            ChannelInvoker(
                rpc,
                self._channels,
                self,
                retry=retry,
                unavailable_did_not_run=True,
                fast=self._fast,
                fast_address=self._fast_of.get,
                once=lambda: ONCE_METHODS if self._once_everywhere else frozenset(),
            )
        )
        self._lock = asyncio.Lock()

    async def close(self) -> None:
        """Closes the channels to every meta instance (at shutdown)."""
        self._fast.close()
        await self._channels.close()

    @property
    def current_address(self) -> str:
        """The meta instance the next call goes to."""
        return self._addresses[self._current % len(self._addresses)]

    async def follow(self, err: RpcError) -> bool:
        """After an instance did not answer: the next one at once, or after a round of them all fresh routing."""
        logger.info("meta %s: %s; trying another instance", self.current_address, err.code.name)
        self._current += 1
        if self._current % len(self._addresses):
            return True
        with contextlib.suppress(RpcError):
            await self.refresh()
        return False

    async def refresh(self) -> list[str]:
        """Meta addresses from mgmtd (alive META nodes), unless fixed at construction; their fast endpoints either way.

        Raises:
            RpcError: mgmtd did not answer (with fixed addresses: never; they are used over gRPC then).
        """
        async with self._lock:
            self._looked_up = True
            try:
                resp = await self._mgmtd.mgmtd.get_routing_info(mpb.GetRoutingInfoRequest())
            except RpcError:
                if self._fixed:
                    self._once_everywhere = False  # what the fixed instances do is not known
                    return self._fixed
                raise
            found = []
            fast_of = {}
            # Instances' gRPC addresses, by whether they record ONCE_METHODS' keys.
            tagged: set[str] = set()
            untagged: set[str] = set()
            for n in resp.routing_info.nodes:
                if n.node_type != common_pb2.NODE_TYPE_META or n.status != mpb.NODE_STATUS_ALIVE or not n.enabled:
                    continue
                endpoints = {e.name: e.address for e in n.endpoints}
                if "grpc" in endpoints:
                    found.append(endpoints["grpc"])
                    if "fast" in endpoints:
                        fast_of[endpoints["grpc"]] = endpoints["fast"]
                    (tagged if n.tags.get(ONCE_TAG) == ONCE_TAG_VALUE else untagged).add(endpoints["grpc"])
            self._fast_of.clear()
            self._fast_of.update(fast_of)
            called = self._fixed or found
            self._once_everywhere = bool(called) and all(a in tagged and a not in untagged for a in called)
            if self._fixed:
                return self._fixed
            if found:
                random.shuffle(found)
                self._addresses = found
                self._current = 0
            return self._addresses

    async def call(
        self,
        method: Callable[[MetaServiceClient], UnaryCall[RequestT, ResponseT]],
        request: RequestT,
        *,
        timeout_s: float | None = None,
    ) -> ResponseT:
        """One unary MetaService call: ``await meta.call(lambda m: m.stat, request)``.

        Raises:
            RpcError: the service's answer (map it with ``os_error``).
            Hf3fsError: no meta instance answered.
        """
        if not self._addresses or not self._looked_up:
            try:
                await self.refresh()
            except RpcError as err:
                raise Hf3fsError(f"cannot reach mgmtd to find meta services: {err}") from None
            if not self._addresses:
                raise Hf3fsError("no meta service is registered with mgmtd")
        try:
            return await method(self._client)(request, timeout_s=timeout_s)
        except RetriesExhausted as err:
            raise Hf3fsError(f"no meta service answered: {err}") from None

    async def reserve_space(
        self, inode_id: int, session_id: str, write_limit_bytes: int, *, partial: bool = False
    ) -> tuple[int, int]:
        """Raise a write session's limit to ``write_limit_bytes`` before writing past it: ``(limit, available)``.

        Call it from ``write()`` before taking (or buffering) bytes past the session's limit, so that the quota
        error reaches the writing call. All or nothing; with ``partial`` meta grants as much as the directory
        quotas allow, and ``limit`` may be below the one asked (never below the current one): write up to it
        (a short write) and report EDQUOT on the next. ``available`` is what the quotas would still grant
        (2^64-1: no byte quota applies).

        Raises:
            RpcError: RESOURCE_EXHAUSTED with ``ff-fs-error`` FS_ERROR_QUOTA_EXCEEDED (``os_error`` gives EDQUOT)
                when nothing (all or nothing: not everything) could be granted; FAILED_PRECONDITION
                (FS_ERROR_BAD_SESSION, EBADF) for a session meta no longer knows.
        """
        request = meta_pb2.ReserveSpaceRequest(
            inode_id=inode_id, session_id=session_id, write_limit_bytes=write_limit_bytes, partial=partial
        )
        resp = await self.call(lambda m: m.reserve_space, request)
        return int(resp.write_limit_bytes), int(resp.available_bytes)
