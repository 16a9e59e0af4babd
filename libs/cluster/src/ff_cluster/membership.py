"""A service's membership in the cluster: register with mgmtd, heartbeat, and the T/2 rule."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc

from ff_cluster.lease import LeaseWatch
from ff_cluster.mgmtd_client import MgmtdClient
from ff_rpc import RpcError
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2

logger = logging.getLogger(__name__)
# How long a cleanly stopping node waits for mgmtd to take its last ("leaving") heartbeat.
LEAVING_TIMEOUT_S = 1.0


@dataclass(kw_only=True)
class MembershipOptions:
    """Who the node is and where to register: what ``NodeMembership`` sends to mgmtd.

    Attributes:
        mgmtd_addresses: the mgmtd instances; the client follows the primary among them.
        cluster_token: the token the node registers and heartbeats with.
        node_type: what the node serves (NODE_TYPE_STORAGE, ...).
        hostname: the host's name, as mgmtd lists the node.
        endpoints: named addresses others reach the node at ("grpc", "metrics", ...).
        node_id: the id to register under; 0: mgmtd assigns one.
        tags: free-form labels registered with the node ("instance_id", ...).
    """

    mgmtd_addresses: list[str]
    cluster_token: str
    node_type: common_pb2.NodeType.ValueType
    hostname: str
    endpoints: dict[str, str]
    node_id: int = 0
    tags: dict[str, str] = field(default_factory=dict)
    # Called once when mgmtd has been unreachable for T/2 (stop serving), and once when it is back.
    on_lease_lost: Callable[[], None] | None = None
    on_lease_regained: Callable[[], None] | None = None
    retry_interval_s: float = 0.5
    # Storage nodes: (target id, LocalTargetState value) of every target, sent with each heartbeat.
    target_reports: Callable[[], Sequence[tuple[int, int]]] | None = None


class NodeMembership:
    """Registers the node, then heartbeats every interval mgmtd asks for, until stopped."""

    def __init__(self, options: MembershipOptions, client: MgmtdClient | None = None) -> None:
        self._opts = options
        self._client = client or MgmtdClient(options.mgmtd_addresses, token=options.cluster_token, timeout_s=2.0)
        self.node_id = options.node_id
        self.cluster_id = ""
        self.lease_duration_s = 0.0
        self.heartbeat_interval_s = options.retry_interval_s
        self.routing_version = 0
        # The config version of this node's type that mgmtd announced, and whether the node is enabled.
        self.config_version = 0
        self.enabled = True
        self.registered = asyncio.Event()
        self._watch: LeaseWatch | None = None

    @property
    def lease_lost(self) -> bool:
        """True while mgmtd has not been reached for more than T/2: the node must not serve."""
        return self._watch is not None and self._watch.lost

    async def _register(self) -> None:
        request = mgmtd_pb2.RegisterNodeRequest(
            node_id=self.node_id,
            node_type=self._opts.node_type,
            hostname=self._opts.hostname,
            endpoints=[common_pb2.Endpoint(name=k, address=v) for k, v in self._opts.endpoints.items()],
            tags=self._opts.tags,
        )
        sent_at = time.monotonic()
        resp = await self._client.mgmtd.register_node(request)
        self.node_id, self.cluster_id = resp.node_id, resp.cluster_id
        self.lease_duration_s, self.heartbeat_interval_s = resp.lease_duration_s, resp.heartbeat_interval_s
        self.routing_version = resp.routing_version
        if self._watch is None:
            self._watch = LeaseWatch(self.lease_duration_s, sent_at)
        elif self._watch.acked(sent_at):
            self._regained()
        self.registered.set()
        logger.info("registered with mgmtd", extra={"node_id": self.node_id, "cluster_id": self.cluster_id})

    async def _heartbeat(self) -> None:
        reports = self._opts.target_reports() if self._opts.target_reports else ()
        request = mgmtd_pb2.HeartbeatRequest(
            node_id=self.node_id,
            routing_version=self.routing_version,
            config_version=self.config_version,
            targets=[
                mgmtd_pb2.LocalTargetReport(target_id=t, local_state=mgmtd_pb2.LocalTargetState.ValueType(s))
                for t, s in reports
            ],
        )
        # The lease is fresh as of when the request left, not when the answer came back.
        sent_at = time.monotonic()
        try:
            resp = await self._client.mgmtd.heartbeat(request)
        except RpcError as err:
            if err.code is not grpc.StatusCode.NOT_FOUND:
                raise
            logger.warning("mgmtd does not know this node; registering again")
            await self._register()
            return
        self.routing_version, self.config_version, self.enabled = (
            resp.routing_version,
            resp.config_version,
            resp.enabled,
        )
        if self._watch is not None and self._watch.acked(sent_at):
            self._regained()

    def _regained(self) -> None:
        logger.info("mgmtd reachable again")
        if self._opts.on_lease_regained:
            self._opts.on_lease_regained()

    def _check_lease(self) -> None:
        if self._watch is not None and self._watch.check(time.monotonic()):
            logger.error("mgmtd unreachable for %.1fs (T/2): this node must stop serving", self._watch.tolerance_s)
            if self._opts.on_lease_lost:
                self._opts.on_lease_lost()

    async def run(self, stop: asyncio.Event) -> None:
        """Register (retrying), then heartbeat until ``stop``.

        The T/2 watch runs on its own timer: a heartbeat stuck in retries must not delay the moment
        the node is told to stop serving.
        """
        try:
            while not stop.is_set() and not self.registered.is_set():
                try:
                    await self._register()
                except RpcError as err:
                    logger.warning("cannot register with mgmtd yet: %s", err)
                    await _sleep_or_stop(stop, self._opts.retry_interval_s)
            loops = [asyncio.create_task(self._heartbeat_loop(stop)), asyncio.create_task(self._lease_watch_loop(stop))]
            try:
                await stop.wait()
            finally:
                # A heartbeat may be in the middle of its retries: stopping does not wait for it.
                for task in loops:
                    task.cancel()
                await asyncio.gather(*loops, return_exceptions=True)
            if self.registered.is_set():  # (stopped before it ever registered: nothing to tell)
                await self._say_leaving()
        finally:
            await self._client.close()

    async def _say_leaving(self) -> None:
        """A clean stop: one last heartbeat tells mgmtd, which declares the node dead now, not after its lease.

        Its targets leave their chains at once and it can be removed; best effort, bounded (a stop never waits
        long for an unreachable mgmtd: the lease then runs out as after a crash).
        """
        request = mgmtd_pb2.HeartbeatRequest(node_id=self.node_id, leaving=True)
        try:
            call = self._client.mgmtd.heartbeat(request, timeout_s=LEAVING_TIMEOUT_S)
            await asyncio.wait_for(call, LEAVING_TIMEOUT_S)  # (bounds its retries too)
        except (RpcError, TimeoutError) as err:
            logger.info("could not tell mgmtd this node is leaving (its lease will run out): %s", err)
        else:
            logger.info("told mgmtd this node is leaving", extra={"node_id": self.node_id})

    async def _heartbeat_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self._heartbeat()
            except RpcError as err:
                logger.warning("heartbeat failed: %s", err)
            await _sleep_or_stop(stop, self.heartbeat_interval_s)

    async def _lease_watch_loop(self, stop: asyncio.Event) -> None:
        period_s = max(0.01, min(0.1, self.lease_duration_s / 20))
        while not stop.is_set():
            self._check_lease()
            await _sleep_or_stop(stop, period_s)


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
