"""Client of mgmtd: finds the primary (following standbys' redirects), deadlines, safe retries."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

import grpc

from ff_rpc import RetryPolicy, RpcClient, RpcError
from ff_rpc.client import NO_RETRY, ChannelInvoker, ChannelPool
from ff_rpc.retry import NOT_PRIMARY_METADATA, PRIMARY_ADDRESS_METADATA, RETRYABLE_CODES
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2
from fireflyer.mgmtd.v1.mgmtd_client import IdentityServiceClient, MgmtdServiceClient

logger = logging.getLogger(__name__)

__all__ = ["NOT_PRIMARY_METADATA", "PRIMARY_ADDRESS_METADATA", "MgmtdClient"]


class MgmtdClient:
    """Calls to the primary mgmtd, wherever it is: ``await client.mgmtd.heartbeat(request)``.

    ``mgmtd`` and ``identity`` are the generated typed clients of MgmtdService and IdentityService, sent through
    one ``ChannelInvoker`` whose route is this client. A standby answers UNAVAILABLE with ``ff-not-primary`` (and
    the primary's address when it knows it): the call did not run, so it is sent again to the primary, whatever
    the method. Other UNAVAILABLE or DEADLINE_EXCEEDED answers are retried, on the next known address, only for
    methods the proto marks idempotent (``ff_rpc.retry``).
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
        self._channels = ChannelPool()
        self._rpc = RpcClient(token=token, timeout_s=timeout_s, retry=NO_RETRY)
        self._retry = retry or RetryPolicy(max_attempts=6, max_backoff_s=1.0)
        invoker = ChannelInvoker(self._rpc, self._channels, self, retry=self._retry)
        self.mgmtd = MgmtdServiceClient(invoker)
        self.identity = IdentityServiceClient(invoker)

    @property
    def current_address(self) -> str:
        """The mgmtd address the next call goes to: the primary, as far as the client knows."""
        return self._current

    async def close(self) -> None:
        """Closes the open channels to mgmtd (at shutdown)."""
        await self._channels.close()

    async def follow(self, err: RpcError) -> bool:
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
        resp = await self.mgmtd.get_routing_info(mgmtd_pb2.GetRoutingInfoRequest())
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
            request = mgmtd_pb2.WatchRoutingInfoRequest(known_version=known_version)
            try:
                async for msg in self.mgmtd.watch_routing_info(request):
                    attempt = 0
                    known_version = msg.routing_info.version
                    yield msg.routing_info
                redirected = await self.follow(RpcError(grpc.StatusCode.UNAVAILABLE, "watch stream ended"))
            except RpcError as err:
                if err.code not in RETRYABLE_CODES:
                    raise
                redirected = await self.follow(err)
            attempt += 1
            if not redirected:
                await asyncio.sleep(self._retry.backoff_s(min(attempt, 6)))
