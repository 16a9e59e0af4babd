"""Client of mgmtd: finds the primary (following standbys' redirects), deadlines, safe retries."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from ff_rpc import RetryPolicy, RpcClient, RpcError
from ff_rpc.client import NO_RETRY, RETRYABLE_CODES, StubPool, is_idempotent, method_path
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2, mgmtd_pb2_grpc

logger = logging.getLogger(__name__)

PRIMARY_ADDRESS_METADATA = "ff-primary-address"
NOT_PRIMARY_METADATA = "ff-not-primary"

MgmtdStub = mgmtd_pb2_grpc.MgmtdServiceStub
IdentityStub = mgmtd_pb2_grpc.IdentityServiceStub


class MgmtdClient:
    """Calls to the primary mgmtd, wherever it is.

    A standby answers UNAVAILABLE with ``ff-not-primary`` (and the primary's address when it knows
    it): the call did not run, so it is sent again to the primary, whatever the method. Other
    UNAVAILABLE or DEADLINE_EXCEEDED answers are retried, on the next known address, only for methods
    the proto marks idempotent.
    """

    def __init__(
        self,
        addresses: list[str],
        *,
        token: str | Callable[[], str],
        timeout_s: float = 5.0,
        retry: RetryPolicy | None = None,
    ) -> None:
        if not addresses:
            raise ValueError("at least one mgmtd address is needed")
        self._addresses = list(dict.fromkeys(addresses))
        self._current = self._addresses[0]
        self._stubs = StubPool(lambda ch: (MgmtdStub(ch), IdentityStub(ch)))
        self._rpc = RpcClient(token=token, timeout_s=timeout_s, retry=NO_RETRY)
        self._retry = retry or RetryPolicy(max_attempts=6, max_backoff_s=1.0)

    @property
    def current_address(self) -> str:
        """The mgmtd address the next call goes to: the primary, as far as the client knows."""
        return self._current

    async def close(self) -> None:
        """Closes the open channels to mgmtd (at shutdown)."""
        await self._stubs.close()

    async def mgmtd(self, select: Callable[[MgmtdStub], Any], request: Any, *, timeout_s: float | None = None) -> Any:
        """A unary MgmtdService call: ``await client.mgmtd(lambda s: s.Heartbeat, request)``."""
        return await self._invoke(lambda stubs: select(stubs[0]), request, timeout_s)

    async def identity(
        self, select: Callable[[IdentityStub], Any], request: Any, *, timeout_s: float | None = None
    ) -> Any:
        """A unary IdentityService call."""
        return await self._invoke(lambda stubs: select(stubs[1]), request, timeout_s)

    async def _invoke(
        self, bind: Callable[[tuple[MgmtdStub, IdentityStub]], Any], request: Any, timeout_s: float | None
    ) -> Any:
        attempt = 1
        while True:
            call = bind(self._stubs.get(self._current))
            try:
                return await self._rpc.unary(call, request, timeout_s=timeout_s)
            except RpcError as err:
                # Move on from an address that did not answer even when this call will not be retried,
                # so the next call does not start from it again.
                redirected = self._follow(err) if err.code in RETRYABLE_CODES else False
                if not self._should_retry(err, method_path(call)) or attempt >= self._retry.max_attempts:
                    raise
                attempt += 1
                if not redirected:
                    await asyncio.sleep(self._retry.backoff_s(attempt - 1))

    def _should_retry(self, err: RpcError, method: str) -> bool:
        if err.code is grpc.StatusCode.UNAVAILABLE and NOT_PRIMARY_METADATA in err.trailing_metadata:
            return True
        return err.code in RETRYABLE_CODES and is_idempotent(method)

    def _follow(self, err: RpcError) -> bool:
        """Switch to the primary the answer names, else to the next known address. True if redirected."""
        primary = err.trailing_metadata.get(PRIMARY_ADDRESS_METADATA, "")
        if primary and primary != self._current:
            logger.info("mgmtd primary is %s", primary)
            if primary not in self._addresses:
                self._addresses.append(primary)
            self._current = primary
            return True
        index = self._addresses.index(self._current) if self._current in self._addresses else -1
        self._current = self._addresses[(index + 1) % len(self._addresses)]
        return False

    async def service_address(self, node_type: common_pb2.NodeType.ValueType, endpoint: str = "grpc") -> str:
        """The ``endpoint`` address of the first alive node of ``node_type`` in the routing info; "" when none is.

        A user token is enough (GetRoutingInfo is ACCESS_USER).
        """
        resp = await self.mgmtd(lambda s: s.GetRoutingInfo, mgmtd_pb2.GetRoutingInfoRequest())
        for node in resp.routing_info.nodes:
            if node.node_type == node_type and node.status == mgmtd_pb2.NODE_STATUS_ALIVE:
                for ep in node.endpoints:
                    if ep.name == endpoint:
                        return str(ep.address)
        return ""

    async def watch_routing(self, known_version: int = 0) -> AsyncIterator[mgmtd_pb2.RoutingInfo]:
        """Routing info at every change, following the primary across failovers, until cancelled.

        A stream that ends (the primary stopped or stepped down) is opened again, on the primary.
        """
        attempt = 0
        while True:
            stub = self._stubs.get(self._current)[0]
            request = mgmtd_pb2.WatchRoutingInfoRequest(known_version=known_version)
            try:
                async for msg in self._rpc.stream(stub.WatchRoutingInfo, request):
                    attempt = 0
                    known_version = msg.routing_info.version
                    yield msg.routing_info
                redirected = self._follow(RpcError(grpc.StatusCode.UNAVAILABLE, "watch stream ended"))
            except RpcError as err:
                if err.code not in RETRYABLE_CODES:
                    raise
                redirected = self._follow(err)
            attempt += 1
            if not redirected:
                await asyncio.sleep(self._retry.backoff_s(min(attempt, 6)))
