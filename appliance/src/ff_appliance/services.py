"""The services the appliance runs, in start order, and the command line that starts each instance.

Adding a service is one entry in ``SERVICES``. Every service process follows one convention, so the
appliance can start, find and check it the same way:

- it is ``python -m <module>`` and takes the common flags of :func:`common_args` (gRPC and metrics
  address, node id, instance id, cluster token file, ready file, log level);
- it writes the ready file (``ff_rpc.write_ready_file``) once it serves, and stops cleanly on SIGTERM;
- it serves the standard gRPC health service, and registers with mgmtd under the given node id.

Anything else a service needs (mgmtd's addresses, its data folder, ...) comes from the spec's ``args``.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ff_appliance import containers, scheduler_setup, storage_setup, telemetry_setup
from ff_appliance.hosts import exec_prefix
from ff_appliance.state import ClusterPlan, InstancePlan, StateDir
from ff_cluster import MgmtdClient
from ff_config.ports import free_port
from fireflyer.common.v1 import common_pb2

MGMTD = "mgmtd"
STORAGE = "storage"
META = "meta"
SCHEDULER = "scheduler"
TELEMETRY = "telemetry"
AGENT = "agent"


@dataclass(frozen=True, kw_only=True)
class LaunchContext:
    """What a service's flags may depend on: the state folder, the whole plan and the log level."""

    state: StateDir
    plan: ClusterPlan
    log_level: str = "INFO"
    database_urls: Mapping[str, str] = field(default_factory=dict)  # service -> its PostgreSQL URL (``database``)
    remote_mgmtd: tuple[str, ...] = ()  # ``join``: the mgmtd of a cluster whose plan is on another machine

    @property
    def mgmtd_addresses(self) -> list[str]:
        """The gRPC addresses of every mgmtd instance (clients find the primary among them)."""
        return list(self.remote_mgmtd) or [i.grpc_address for i in self.plan.of_service(MGMTD)]


ArgsBuilder = Callable[[LaunchContext, InstancePlan], list[str]]
# After every instance is up and registered: set the service up in the cluster (e.g. storage chains) and
# wait until it is ready for clients. Gets the mgmtd client (cluster token); returns a line to print.
ClusterStep = Callable[[MgmtdClient, str], Awaitable[str]]


def _no_args(ctx: LaunchContext, instance: InstancePlan) -> list[str]:
    return []


@dataclass(frozen=True, kw_only=True)
class ServiceSpec:
    """How the appliance runs one service.

    Attributes:
        name: the service; instances are ``<name>-1``, ``<name>-2``...; its data folder is ``<state>/<name>``.
        module: started as ``python -m <module>``.
        node_type: the type its instances register with mgmtd as (``common_pb2.NODE_TYPE_*``).
        default_count: instances in a new cluster.
        scalable: whether ``fireflyer up --<name> N`` chooses the number of instances.
        args: service-specific flags, after the common ones.
        configure: run at every ``up`` once all instances are registered (idempotent).
        overlaps_next: start the next service without waiting for this one to serve (the next needs
            nothing from it); both are waited for together.
        keeps_database: it keeps its state in a database: when the cluster is on PostgreSQL, its URL goes in
            ``database_env``.
    """

    name: str
    module: str
    node_type: common_pb2.NodeType.ValueType
    default_count: int = 1
    scalable: bool = False
    args: ArgsBuilder = _no_args
    configure: ClusterStep | None = None
    overlaps_next: bool = False
    keeps_database: bool = False

    @property
    def database_env(self) -> str:
        """The setting its database URL goes in (each service's settings read ``FF_<SERVICE>_*``)."""
        return f"FF_{self.name.upper()}_DATABASE_URL"

    @property
    def node_type_name(self) -> str:
        """The node type without its prefix (``STORAGE``), as ``status`` shows it."""
        return common_pb2.NodeType.Name(self.node_type).removeprefix("NODE_TYPE_")


def common_args(ctx: LaunchContext, instance: InstancePlan) -> list[str]:
    """The flags every fireflyer service takes (each is a setting of its config model)."""
    return [
        "--listen-address", instance.grpc_address,
        "--metrics-address", instance.metrics_address,
        "--node-id", str(instance.node_id),
        "--instance-id", instance.name,
        "--cluster-token-file", str(ctx.state.cluster_token_file),
        "--ready-file", str(ctx.state.ready_file(instance.name)),
        "--log-level", ctx.log_level,
    ]  # fmt: skip


def _mgmtd_args(ctx: LaunchContext, instance: InstancePlan) -> list[str]:
    # Every instance uses the same SQLite file: one of them wins the lease and is primary.
    return ["--state-dir", str(ctx.state.data_dir(MGMTD))]


def _storage_args(ctx: LaunchContext, instance: InstancePlan) -> list[str]:
    # Each storage service keeps its targets in its own folder (its "disk"); the bulk data path takes a
    # free port at every start and is found through mgmtd's routing info (endpoint "data").
    return [
        "--mgmtd-addresses", ",".join(ctx.mgmtd_addresses),
        "--state-dir", str(ctx.state.data_dir(STORAGE) / instance.name),
        "--data-listen-address", f"{instance.host}:0",
    ]  # fmt: skip


def _meta_args(ctx: LaunchContext, instance: InstancePlan) -> list[str]:
    # Every meta instance serves the same store (stateless services over one store): one SQLite file, or the
    # cluster's PostgreSQL database (its URL in the environment, see ``database``).
    args = ["--mgmtd-addresses", ",".join(ctx.mgmtd_addresses)]
    if META not in ctx.database_urls:
        args += ["--database-url", f"sqlite:///{ctx.state.data_dir(META) / 'meta.db'}"]
    return args


def _scheduler_args(ctx: LaunchContext, instance: InstancePlan) -> list[str]:
    # A run may be preempted after 10 s (the service's default is 60 s): on this one-machine cluster the demo's
    # preemption comes while its tiny model trains, not a minute later. Every agent here is 127.0.0.1: the ranks'
    # MASTER_PORT is one free at this start, not HAI's fixed 2222, which another cluster's trainer on this
    # machine may hold (a run that cannot bind it fails and is started again).
    return [
        "--mgmtd-addresses", ",".join(ctx.mgmtd_addresses),
        "--state-dir", str(ctx.state.data_dir(SCHEDULER)),
        "--min-run-time-s", "10",
        "--master-port", str(free_port(instance.host)),
    ]  # fmt: skip


def _telemetry_args(ctx: LaunchContext, instance: InstancePlan) -> list[str]:
    # Its HTTP side (/federate, later the dashboard) takes a free port at every start; `up` prints it
    # (found through mgmtd's routing info, endpoint "http").
    return [
        "--mgmtd-addresses", ",".join(ctx.mgmtd_addresses),
        "--state-dir", str(ctx.state.data_dir(TELEMETRY)),
        "--http-address", f"{instance.host}:0",
    ]  # fmt: skip


def _agent_args(ctx: LaunchContext, instance: InstancePlan) -> list[str]:
    # Each agent is one "node" with 2 CPU device slots; it finds the scheduler through mgmtd, and its run
    # folders (logs, work, run-control) live under its own folder.
    return [
        # Ranks run as their task's user when this runs as root with folders open to every user (else
        # every rank runs as the user who ran `fireflyer up`; the agent says so in its log).
        "--ranks-run-as", "auto",
        "--mgmtd-addresses", ",".join(ctx.mgmtd_addresses),
        "--state-dir", str(ctx.state.data_dir(AGENT) / instance.name),
        "--master-ip", instance.host,
        "--num-device-slots", "2",
        "--term-grace-s", "5",
        # A rank behind its group's collective for 10 s is hung (the service's default is 60 s): the demo's
        # stopped rank is named, and its node cordoned, while the tiny model trains.
        "--hang-threshold-s", "10",
        "--hang-check-interval-s", "1",
        *_zone_args(ctx, instance),
    ]  # fmt: skip


def _zone_args(ctx: LaunchContext, instance: InstancePlan) -> list[str]:
    # ``up --hosts``: the agents of a host given a zone (``--host-zone``) register in it, so the scheduler keeps
    # tasks in one zone when it can and hfreduce's trees cross the zones' link once.
    network = ctx.plan.network
    zone = network.host(instance.host_name).zone if network is not None and instance.host_name else ""
    return ["--zone", zone] if zone else []


SERVICES: tuple[ServiceSpec, ...] = (
    ServiceSpec(
        name=MGMTD,
        module="ff_mgmtd",
        node_type=common_pb2.NODE_TYPE_MGMTD,
        scalable=True,
        args=_mgmtd_args,
        keeps_database=True,
    ),
    ServiceSpec(
        name=STORAGE,
        module="ff_storage",
        node_type=common_pb2.NODE_TYPE_STORAGE,
        default_count=3,
        scalable=True,
        args=_storage_args,
        configure=storage_setup.ensure_chains,
    ),
    ServiceSpec(
        name=META,
        module="ff_meta",
        node_type=common_pb2.NODE_TYPE_META,
        scalable=True,
        args=_meta_args,
        keeps_database=True,
    ),
    ServiceSpec(
        name=SCHEDULER,
        module="ff_scheduler",
        node_type=common_pb2.NODE_TYPE_SCHEDULER,
        args=_scheduler_args,
        configure=scheduler_setup.ensure_hfai_user,
        keeps_database=True,
    ),
    ServiceSpec(
        name=TELEMETRY,
        module="ff_telemetry",
        node_type=common_pb2.NODE_TYPE_TELEMETRY,
        args=_telemetry_args,
        configure=telemetry_setup.describe,
        keeps_database=True,
        # Agents push to it through mgmtd and retry until it is there: its start overlaps theirs.
        overlaps_next=True,
    ),
    ServiceSpec(
        name=AGENT,
        module="ff_agent",
        node_type=common_pb2.NODE_TYPE_AGENT,
        default_count=2,
        scalable=True,
        args=_agent_args,
    ),
)


def command(spec: ServiceSpec, ctx: LaunchContext, instance: InstancePlan) -> list[str]:
    """The full argv of one instance, run by this interpreter (in its host's network namespace, if it has one).

    In a container cluster (``up --containers``), ``podman run`` of the same flags in the service's image.
    """
    flags = [*common_args(ctx, instance), *spec.args(ctx, instance)]
    if ctx.plan.containers is not None:
        env_names = [spec.database_env] if spec.name in ctx.database_urls else []
        inside = ["python", "-m", spec.module, *flags]  # the image's virtualenv is first on its PATH
        return containers.run_argv(
            ctx.plan.containers, instance=instance.name, service=spec.name, argv=inside, env_names=env_names
        )
    argv = [sys.executable, "-m", spec.module, *flags]
    if instance.host_name and ctx.plan.network is not None:
        return [*exec_prefix(ctx.plan.network, instance.host_name), *argv]
    return argv


def spec_for(instance: InstancePlan, services: Sequence[ServiceSpec] = SERVICES) -> ServiceSpec:
    """The spec of the service ``instance`` is of.

    Raises:
        KeyError: the appliance runs no such service (a plan written by another version).
    """
    for spec in services:
        if spec.name == instance.service:
            return spec
    raise KeyError(f"{instance.name}: service {instance.service!r} is not one the appliance runs")


def default_counts(services: Sequence[ServiceSpec] = SERVICES) -> dict[str, int]:
    """Every service in start order with its number of instances in a new cluster."""
    return {spec.name: spec.default_count for spec in services}
