"""The service chassis: how every service serves, joins the cluster, runs its loops and stops.

A service's ``server.py`` builds its own parts (store, app, servicers, loops) and hands them to
:func:`serve_service`, which owns the rest in one order for all of them:

1. the gRPC server starts (health, reflection, /metrics, the policy interceptor);
2. ``on_bound`` runs with the advertised address (mgmtd starts campaigning with it);
3. signals are installed; membership (register, heartbeat, T/2) and ``loops`` start in one task group;
4. once registered: ``loops_after_registration`` start (they may need the node id), then the ready file is
   written, so whoever waits on it (the appliance, tests) finds the node in mgmtd's registry;
5. on stop: ``on_stop`` runs while the server still serves, the loops end (each watches ``stop``), then the
   server drains in-flight calls within ``grace_s`` and closes. The service's own resources are closed by
   its ``server.py`` after :func:`serve_service` returns (``try``/``finally``), so after the server.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ff_cluster.membership import MembershipOptions, NodeMembership
from ff_cluster.mgmtd_client import MgmtdClient
from ff_config.service import ServiceSettings
from ff_rpc import RpcServer, ServerOptions, ServiceBinding, StatusTable, TokenValidator, install_stop_signals
from ff_rpc.server import MAX_MESSAGE_BYTES, write_ready_file
from fireflyer.common.v1 import common_pb2

logger = logging.getLogger(__name__)

Loop = Coroutine[Any, Any, None]


@dataclass
class Serving:
    """A service being served, as its hooks see it."""

    server: RpcServer
    address: str  # the advertised gRPC address (advertise_address, else the bound one)
    instance_id: str
    hostname: str
    membership: NodeMembership
    stop: asyncio.Event

    @property
    def node_id(self) -> int:
        """The node id mgmtd registered this instance under (0 until registered)."""
        return self.membership.node_id

    @property
    def metrics_port(self) -> int:
        """The port /metrics is served on; 0 when the service has no ``metrics_address``."""
        return self.server.metrics_port


@dataclass(kw_only=True)
class ServiceWiring:
    """What one service brings to :func:`serve_service`; the chassis does everything else."""

    node_type: common_pb2.NodeType.ValueType
    bindings: Sequence[ServiceBinding]
    status_table: StatusTable
    token_validator: TokenValidator | None
    # mgmtd instances to register with; None: this process is mgmtd and registers with itself.
    mgmtd_addresses: Sequence[str] | None
    max_request_bytes: int = MAX_MESSAGE_BYTES
    # The client membership uses (and closes when it ends); default: one of its own.
    mgmtd_client: MgmtdClient | None = None
    hostname: str = ""  # default: the host's name
    default_instance_id: str = ""  # when the instance_id setting is empty; default: the advertised address
    endpoints: Mapping[str, str] = field(default_factory=dict)  # registered besides "grpc" and "metrics"
    # Serve the unary methods over the fast path too (``ff_rpc.fastpath``), on a free port of the gRPC host,
    # registered as the "fast" endpoint.
    fast: bool = False
    tags: Mapping[str, str] = field(default_factory=dict)  # registered besides "instance_id"
    on_lease_lost: Callable[[], None] | None = None
    on_lease_regained: Callable[[], None] | None = None
    target_reports: Callable[[], Sequence[tuple[int, int]]] | None = None
    # After the server is bound, before registering: given the advertised address.
    on_bound: Callable[[str], Awaitable[None]] | None = None
    # Background loops, started with membership; each must return once ``serving.stop`` is set.
    loops: Callable[[Serving], Iterable[Loop]] | None = None
    # Started once registered (``serving.node_id`` known), before the ready file is written.
    loops_after_registration: Callable[[Serving], Iterable[Loop]] | None = None
    # Entries of the ready file besides grpc, metrics_port, node_id and instance_id.
    ready_info: Callable[[Serving], Mapping[str, Any]] | None = None
    # After stop is set, while the server still serves and the loops still run.
    on_stop: Callable[[Serving], Awaitable[None]] | None = None


async def serve_service(settings: ServiceSettings, wiring: ServiceWiring, stop: asyncio.Event) -> None:
    """Serve until ``stop`` is set (SIGTERM, SIGINT, or the caller), then stop in order; see the module doc."""
    server = RpcServer(
        ServerOptions(
            listen_address=settings.listen_address,
            metrics_address=settings.metrics_address or None,
            cluster_token=settings.resolved_cluster_token(),
            token_validator=wiring.token_validator,
            status_table=wiring.status_table,
            grace_s=settings.grace_s,
            max_request_bytes=wiring.max_request_bytes,
            fast_address=f"{settings.listen_address.rsplit(':', 1)[0]}:0" if wiring.fast else None,
        ),
        wiring.bindings,
    )
    await server.start()
    try:
        address = settings.advertise_address or server.address
        if server.fast_address:
            fast = f"{address.rsplit(':', 1)[0]}:{server.fast_address.rsplit(':', 1)[1]}"
            wiring = replace(wiring, endpoints={**wiring.endpoints, "fast": fast})
        if wiring.on_bound is not None:
            await wiring.on_bound(address)
        hostname = wiring.hostname or socket.gethostname()
        instance_id = settings.instance_id or wiring.default_instance_id or address
        membership = _membership(settings, wiring, server, address, hostname, instance_id)
        serving = Serving(server, address, instance_id, hostname, membership, stop)
        install_stop_signals(stop)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(membership.run(stop))
            for loop in wiring.loops(serving) if wiring.loops else ():
                tg.create_task(loop)
            if await _registered_or_stopped(membership, stop):
                for loop in wiring.loops_after_registration(serving) if wiring.loops_after_registration else ():
                    tg.create_task(loop)
                _write_ready(settings, wiring, serving)
            await stop.wait()
            if wiring.on_stop is not None:
                await wiring.on_stop(serving)
    finally:
        await server.stop()


async def cancel_on_stop(loop: Loop, stop: asyncio.Event) -> None:
    """Run ``loop`` until it returns or ``stop`` is set, then cancel it; re-raises what ``loop`` raised.

    For loops that wait on something other than ``stop`` (a server stream) and so would not return by themselves.
    """
    task = asyncio.ensure_future(loop)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not task.done():
            task.cancel()
        await asyncio.gather(task, stopped, return_exceptions=True)
    error = None if task.cancelled() else task.exception()
    if error is not None:
        raise error


def _membership(
    settings: ServiceSettings,
    wiring: ServiceWiring,
    server: RpcServer,
    address: str,
    hostname: str,
    instance_id: str,
) -> NodeMembership:
    port = server.metrics_port
    metrics = {"metrics": _metrics_endpoint(settings.metrics_address, address, port)} if port else {}
    options = MembershipOptions(
        mgmtd_addresses=list(wiring.mgmtd_addresses) if wiring.mgmtd_addresses is not None else [address],
        cluster_token=settings.resolved_cluster_token(),
        node_id=settings.node_id,
        node_type=wiring.node_type,
        hostname=hostname,
        endpoints={"grpc": address, **wiring.endpoints, **metrics},
        tags={"instance_id": instance_id, **wiring.tags},
        on_lease_lost=wiring.on_lease_lost,
        on_lease_regained=wiring.on_lease_regained,
        target_reports=wiring.target_reports,
    )
    return NodeMembership(options, wiring.mgmtd_client)


def _metrics_endpoint(metrics_address: str, address: str, port: int) -> str:
    """Where others scrape /metrics: the metrics host, or the advertised gRPC host when it listens on all interfaces.

    Services registered 127.0.0.1 before, which a scraper on another host cannot reach.
    """
    host = metrics_address.rsplit(":", 1)[0]
    if host in ("", "0.0.0.0", "[::]", "::"):
        host = address.rsplit(":", 1)[0]
    return f"{host}:{port}"


async def _registered_or_stopped(membership: NodeMembership, stop: asyncio.Event) -> bool:
    """Wait until registered (True) or asked to stop first (False)."""
    registered = asyncio.ensure_future(membership.registered.wait())
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({registered, stopped}, return_when=asyncio.FIRST_COMPLETED)
    registered.cancel()
    stopped.cancel()
    return membership.registered.is_set()


def _write_ready(settings: ServiceSettings, wiring: ServiceWiring, serving: Serving) -> None:
    extra = wiring.ready_info(serving) if wiring.ready_info else {}
    if settings.ready_file is not None:
        write_ready_file(
            settings.ready_file,
            grpc=serving.address,
            metrics_port=serving.metrics_port,
            node_id=serving.node_id,
            instance_id=serving.instance_id,
            **extra,
        )
    logger.info("ready", extra={"ready": {"grpc": serving.address, "node_id": serving.node_id, **extra}})
