"""``fireflyer status``: the local services (process, health, primacy) and mgmtd's view of the nodes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ff_appliance.health import Health, check_health
from ff_appliance.services import MGMTD
from ff_appliance.state import ClusterPlan, InstancePlan, StateDir
from ff_appliance.supervisor import running_pid
from ff_cluster import MgmtdClient
from ff_rpc import RpcError
from ff_rpc.client import one_call
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2
from fireflyer.mgmtd.v1.mgmtd_client import MgmtdServiceClient

CALL_TIMEOUT_S = 2.0


@dataclass(frozen=True, kw_only=True)
class ServiceRow:
    """One planned instance as seen from this machine."""

    instance: str
    service: str
    node_id: int
    pid: int | None
    grpc_address: str
    metrics_url: str
    health: Health
    primary: bool | None  # None: not an mgmtd, or it did not answer
    host: str = ""  # ``up --hosts``: the host (network namespace) it runs on; "": this machine's own

    @property
    def running(self) -> bool:
        """Whether its recorded process still runs (the pid file names a live process of ours)."""
        return self.pid is not None


@dataclass(frozen=True, kw_only=True)
class NodeRow:
    """One node as the primary mgmtd knows it."""

    node_id: int
    node_type: str
    instance: str
    hostname: str
    status: str
    enabled: bool
    heartbeat_age_s: float | None


@dataclass(frozen=True, kw_only=True)
class ClusterStatus:
    """What ``fireflyer status`` reports: each planned instance as probed, and the nodes as the primary mgmtd sees them.

    ``routing_error`` is set when mgmtd could not be asked (then ``nodes`` is empty).
    """

    state_dir: str
    cluster_id: str
    routing_version: int
    services: tuple[ServiceRow, ...]
    nodes: tuple[NodeRow, ...]
    routing_error: str | None = None

    def problems(self) -> list[str]:
        """Everything that keeps the cluster from being healthy; empty when it is."""
        found = [f"{s.instance} is not running" for s in self.services if not s.running]
        found += [f"{s.instance} health is {s.health}" for s in self.services if s.running and s.health != "SERVING"]
        mgmtds = [s for s in self.services if s.service == MGMTD]
        num_primaries = sum(1 for s in mgmtds if s.primary)
        if mgmtds and num_primaries != 1:
            found.append(f"{num_primaries} mgmtd instances say they are primary (expected exactly 1)")
        if self.routing_error is not None:
            found.append(f"routing info unavailable: {self.routing_error}")
        else:
            by_id = {n.node_id: n for n in self.nodes}
            for s in self.services:
                node = by_id.get(s.node_id)
                if node is None or node.status != "ALIVE":
                    found.append(f"node {s.node_id} ({s.instance}) is {node.status if node else 'not registered'}")
        return found

    @property
    def healthy(self) -> bool:
        """No problems: every instance runs and serves, one mgmtd is primary, every node is alive."""
        return not self.problems()

    def to_dict(self) -> dict[str, Any]:
        """The status as JSON-ready data (``status --json``), with ``healthy`` and ``problems``."""
        return {**asdict(self), "healthy": self.healthy, "problems": self.problems()}


async def collect_status(
    state: StateDir, plan: ClusterPlan, cluster_token: str, mgmtd_addresses: Sequence[str] = ()
) -> ClusterStatus:
    """Probe every planned instance and ask mgmtd for the nodes; never raises on a down service.

    mgmtd is the plan's, or ``mgmtd_addresses`` (the cluster a ``join`` state folder joined).
    """
    rows = await asyncio.gather(*(_service_row(state, i) for i in plan.instances))
    addresses = list(mgmtd_addresses) or [i.grpc_address for i in plan.of_service(MGMTD)]
    names = {i.node_id: i.name for i in plan.instances}
    client = MgmtdClient(addresses, token=cluster_token, timeout_s=CALL_TIMEOUT_S)
    try:
        resp = await client.mgmtd.get_routing_info(mgmtd_pb2.GetRoutingInfoRequest())
    except RpcError as err:
        return ClusterStatus(
            state_dir=str(state.root),
            cluster_id="",
            routing_version=0,
            services=tuple(rows),
            nodes=(),
            routing_error=f"{err.code.name}: {err.details}",
        )
    finally:
        await client.close()
    info = resp.routing_info
    nodes = tuple(_node_row(n, names, time.time()) for n in info.nodes)
    return ClusterStatus(
        state_dir=str(state.root),
        cluster_id=info.cluster_id,
        routing_version=info.version,
        services=tuple(rows),
        nodes=nodes,
    )


async def _service_row(state: StateDir, instance: InstancePlan) -> ServiceRow:
    pid = running_pid(state.pid_file(instance.name), state.process_marker(instance.name))
    health = await check_health(instance.grpc_address)
    primary = await is_primary(instance.grpc_address) if instance.service == MGMTD else None
    return ServiceRow(
        instance=instance.name,
        service=instance.service,
        node_id=instance.node_id,
        pid=pid,
        grpc_address=instance.grpc_address,
        metrics_url=instance.metrics_url,
        health=health,
        primary=primary,
        host=instance.host_name,
    )


async def is_primary(address: str) -> bool | None:
    """Whether the mgmtd instance at ``address`` holds the lease; None if it does not answer."""
    try:
        resp = await one_call(
            address,
            MgmtdServiceClient,
            lambda c: c.get_primary(mgmtd_pb2.GetPrimaryRequest()),
            token="",
            timeout_s=CALL_TIMEOUT_S,
        )
    except RpcError:
        return None
    return bool(resp.is_primary)


def _node_row(node: mgmtd_pb2.Node, names: dict[int, str], now: float) -> NodeRow:
    return NodeRow(
        node_id=node.node_id,
        node_type=node_type_name(node.node_type),
        instance=names.get(node.node_id, "-"),
        hostname=node.hostname,
        status=mgmtd_pb2.NodeStatus.Name(node.status).removeprefix("NODE_STATUS_"),
        enabled=node.enabled,
        heartbeat_age_s=max(0.0, now - node.last_heartbeat_at) if node.last_heartbeat_at > 0 else None,
    )


def node_type_name(value: int) -> str:
    """A ``common_pb2.NodeType`` value without its prefix (``STORAGE``)."""
    return common_pb2.NodeType.Name(common_pb2.NodeType.ValueType(value)).removeprefix("NODE_TYPE_")


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain-text table: left-aligned columns two spaces apart, no trailing blanks."""
    cells = [[str(h) for h in headers], *[[_cell(v) for v in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def render_status(status: ClusterStatus) -> str:
    """The human view of ``fireflyer status``."""
    head = f"cluster {status.cluster_id or '?'}  routing version {status.routing_version}  state {status.state_dir}"
    on_hosts = any(s.host for s in status.services)
    services = format_table(
        ["instance", "pid", "running", "gRPC", "health", "primary", *(["host"] if on_hosts else [])],
        [
            [
                s.instance,
                s.pid,
                s.running,
                s.grpc_address,
                s.health,
                s.primary,
                *([s.host or "bridge"] if on_hosts else []),
            ]
            for s in status.services
        ],
    )
    nodes = format_table(
        ["node", "type", "instance", "hostname", "status", "enabled", "last heartbeat"],
        [
            [n.node_id, n.node_type, n.instance, n.hostname, n.status, n.enabled, _age(n.heartbeat_age_s)]
            for n in status.nodes
        ],
    )
    problems = status.problems()
    verdict = "healthy" if not problems else "NOT healthy:\n" + "\n".join(f"  - {p}" for p in problems)
    return f"{head}\n\nservices\n{services}\n\nnodes\n{nodes}\n\n{verdict}"


def _age(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds:.1f}s ago"
