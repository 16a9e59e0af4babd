"""``up`` and ``down``: start every planned instance, wait until healthy and registered; stop them all."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TextIO

from ff_appliance import admin, container_layout, database, host_layout
from ff_appliance.health import Health, wait_serving
from ff_appliance.hosts import HostsError, LinkShape, NetworkPlan
from ff_appliance.join import joined_file
from ff_appliance.services import (
    META,
    SCHEDULER,
    SERVICES,
    TELEMETRY,
    LaunchContext,
    ServiceSpec,
    command,
    default_counts,
)
from ff_appliance.state import (
    ClusterPlan,
    InstancePlan,
    StateDir,
    ensure_cluster_token,
    extend_plan,
    load_plan,
    remove_files,
    save_plan,
)
from ff_appliance.status import format_table
from ff_appliance.supervisor import (
    Started,
    SupervisorError,
    describe_log,
    exclusive_lock,
    reap,
    running_pid,
    start_detached,
    terminate,
    wait_ready_file,
)
from ff_cluster import MgmtdClient
from ff_config.ports import pick_free_ports, port_in_use
from ff_rpc import RpcError
from fireflyer.mgmtd.v1 import mgmtd_pb2

REGISTRATION_POLL_S = 0.1


class ApplianceError(Exception):
    """``up`` or ``down`` could not do what was asked; the message says why and where to look."""


@dataclass(frozen=True, kw_only=True)
class UpOptions:
    """How to bring the cluster up.

    Attributes:
        env: environment of the started processes (the CLI passes its own).
        counts: instances asked for per service (None: as planned, or the default of a new cluster).
        timeout_s: how long the whole bring-up may take.
        log_level: passed to every service.
        database_url: put the cluster's state on this PostgreSQL database (a new cluster only; ``database``).
    """

    env: Mapping[str, str]
    counts: Mapping[str, int | None] = field(default_factory=dict)
    timeout_s: float = 60.0
    log_level: str = "INFO"
    database_url: str | None = None  # a new cluster's PostgreSQL database (``database``); None: as chosen before
    hosts: int | None = None  # ``--hosts N``: storage and agents on N network namespaces (a new cluster only)
    link_shapes: tuple[tuple[str | None, LinkShape | None], ...] = ()  # ``--link-shape``: (host or all, shape)
    host_zones: tuple[tuple[str, str], ...] = ()  # ``--host-zone``: (host, zone of its agents)
    containers: bool = False  # ``--containers``: each instance in its own podman container (a new cluster only)
    container_dirs: tuple[str, ...] = ()  # more folders the containers see at the same path (the demo's example)
    trainer_image: str | None = None  # ``--trainer-image``: the agents' image of a new container cluster


@dataclass(frozen=True, kw_only=True)
class UpResult:
    """What ``up`` brought up: the plan as saved, the cluster's id, and each instance's pid by instance name."""

    plan: ClusterPlan
    cluster_id: str
    pids: dict[str, int]


async def up(state: StateDir, options: UpOptions, out: TextIO, services: Sequence[ServiceSpec] = SERVICES) -> UpResult:
    """Bring the cluster of ``state`` up; instances already running are left alone.

    Raises:
        ApplianceError: a port is taken, or an instance did not start, get healthy or register in time.
            Instances this call started are stopped again.
    """
    state.create_dirs()
    with exclusive_lock(state.lock_file):
        network = _hosts_network(state, options)
        in_containers = await asyncio.to_thread(_containers, state, options, network is not None)
        cluster_token = ensure_cluster_token(state)
        database_urls = await asyncio.to_thread(_database_urls, state, options.database_url, services, cluster_token)
        plan = _prepare_plan(state, options.counts, services)
        if in_containers is not None and plan.containers != in_containers:
            plan = replace(plan, containers=in_containers)
            save_plan(state, plan)
        if network is not None:
            plan = await asyncio.to_thread(_on_hosts, state, plan, network, out)
        ctx = LaunchContext(state=state, plan=plan, log_level=options.log_level, database_urls=database_urls)
        deadline = time.monotonic() + options.timeout_s
        started: list[Started] = []
        try:
            pids = await _start_all(ctx, services, options, deadline, started, out)
            cluster_id = await _wait_registered(ctx, cluster_token, deadline)
            if await admin.ensure_admin_token(state, ctx.mgmtd_addresses, cluster_token):
                print(f"created the admin token: {state.admin_token_file}", file=out)
            await _configure(ctx, services, cluster_token, out)
        except BaseException:
            await asyncio.to_thread(_stop_started, state, started, out)
            raise
    return UpResult(plan=plan, cluster_id=cluster_id, pids=pids)


async def _configure(ctx: LaunchContext, services: Sequence[ServiceSpec], cluster_token: str, out: TextIO) -> None:
    """Each service's cluster step (storage: chains of targets, all serving), in start order."""
    client = MgmtdClient(ctx.mgmtd_addresses, token=cluster_token)
    try:
        for spec in services:
            if spec.configure is not None and ctx.plan.of_service(spec.name):
                print(f"{spec.name}: {await spec.configure(client, cluster_token)}", file=out)
    except (RpcError, TimeoutError) as err:
        raise ApplianceError(f"setting up the cluster failed: {err}") from err
    finally:
        await client.close()


def _database_urls(
    state: StateDir, given: str | None, services: Sequence[ServiceSpec], cluster_token: str
) -> dict[str, str]:
    """The services' PostgreSQL URLs (schemas made), or none when the cluster is on SQLite files."""
    try:
        url = database.chosen_url(state, given)
        if url is None:
            return {}
        names = [spec.name for spec in services if spec.keeps_database]
        urls = dict(database.prepare(url, names, database.owner_of(cluster_token)))
        database.keep(state, url)
        return urls
    except database.DatabaseError as err:
        raise ApplianceError(str(err)) from None


def _hosts_network(state: StateDir, options: UpOptions) -> NetworkPlan | None:
    if joined_file(state).exists():
        raise ApplianceError(
            f"{state.root} holds nodes joined to a cluster run elsewhere (`fireflyer join`): give up "
            "a state folder of its own"
        )
    try:
        return host_layout.choose_network(state, options.hosts, options.link_shapes, options.host_zones)
    except HostsError as err:
        raise ApplianceError(str(err)) from None


def _containers(state: StateDir, options: UpOptions, on_hosts: bool) -> container_layout.ContainerPlan | None:
    try:
        return container_layout.choose(
            state, options.containers, on_hosts, options.container_dirs, options.env, options.trainer_image
        )
    except container_layout.ContainersError as err:
        raise ApplianceError(str(err)) from None


def _on_hosts(state: StateDir, plan: ClusterPlan, network: NetworkPlan, out: TextIO) -> ClusterPlan:
    try:
        return host_layout.apply_network(state, plan, network, out)
    except HostsError as err:
        raise ApplianceError(f"making the hosts' network failed: {err}") from None


def _prepare_plan(state: StateDir, counts: Mapping[str, int | None], services: Sequence[ServiceSpec]) -> ClusterPlan:
    existing = load_plan(state)
    known = {spec.name for spec in services}
    unknown = sorted({i.service for i in existing.instances} - known) if existing else []
    if unknown:
        raise ApplianceError(
            f"{state.plan_file} has instances of {', '.join(unknown)}, which this version does not run"
        )
    plan = extend_plan(existing, counts, default_counts(services), pick_free_ports)
    if plan is not existing:
        save_plan(state, plan)
    return plan


async def _start_all(
    ctx: LaunchContext,
    services: Sequence[ServiceSpec],
    options: UpOptions,
    deadline: float,
    started: list[Started],
    out: TextIO,
) -> dict[str, int]:
    """Start service after service (mgmtd first), each one's instances together, then wait for them.

    A service that ``overlaps_next`` is waited for together with the next one.
    """
    pids = _running_pids(ctx)
    for name, pid in pids.items():
        print(f"{name}: already running (pid {pid})", file=out)
    # An instance on a host binds in that host's own namespace, made for this cluster: nothing else is there.
    _check_ports_free(ctx, [i for i in ctx.plan.instances if i.name not in pids and not i.host_name])
    _clear_containers(ctx, [i.name for i in ctx.plan.instances if i.name not in pids], options.env)
    batch: list[tuple[Started, InstancePlan]] = []
    for spec in services:
        for instance in ctx.plan.of_service(spec.name):
            if instance.name in pids:
                continue
            launched = _launch(spec, ctx, instance, options.env)
            started.append(launched)
            batch.append((launched, instance))
            pids[instance.name] = launched.pid
            print(f"{instance.name}: started (pid {launched.pid})", file=out)
        if spec.overlaps_next:
            continue
        for launched, instance in batch:
            pids[instance.name] = await _wait_serving(ctx, launched, instance, options.env, deadline)
        batch = []
    for launched, instance in batch:
        pids[instance.name] = await _wait_serving(ctx, launched, instance, options.env, deadline)
    return pids


def _clear_containers(ctx: LaunchContext, names: Sequence[str], env: Mapping[str, str]) -> None:
    """Container clusters: remove stopped containers of the instances about to start (they would refuse them)."""
    try:
        container_layout.clear(ctx.plan, names, env)
    except container_layout.ContainersError as err:
        raise ApplianceError(str(err)) from None


def _running_pids(ctx: LaunchContext) -> dict[str, int]:
    pids: dict[str, int] = {}
    for instance in ctx.plan.instances:
        pid = running_pid(ctx.state.pid_file(instance.name), ctx.state.process_marker(instance.name))
        if pid is not None:
            pids[instance.name] = pid
    return pids


def _check_ports_free(ctx: LaunchContext, instances: Sequence[InstancePlan]) -> None:
    """Before starting anything: every port about to be bound must be free."""
    for instance in instances:
        for port, kind in ((instance.grpc_port, "gRPC"), (instance.metrics_port, "metrics")):
            if port_in_use(port, instance.host):
                raise ApplianceError(
                    f"{instance.name}: its {kind} port {instance.host}:{port} is in use by another process. The "
                    f"port is kept in {ctx.state.plan_file} so endpoints stay stable; stop that process, or remove "
                    "the plan file to choose new ports (the cluster keeps its data and node ids)"
                )


def _launch(spec: ServiceSpec, ctx: LaunchContext, instance: InstancePlan, env: Mapping[str, str]) -> Started:
    ctx.state.data_dir(spec.name).mkdir(mode=0o700, parents=True, exist_ok=True)
    remove_files([ctx.state.ready_file(instance.name)])  # a stale one would look ready at once
    child_env = {**env, "PYTHONUNBUFFERED": "1"}  # log lines reach the file as they happen
    if spec.name in ctx.database_urls:
        child_env[spec.database_env] = ctx.database_urls[spec.name]
    return start_detached(
        instance.name,
        command(spec, ctx, instance),
        log_file=ctx.state.log_file(instance.name),
        pid_file=ctx.state.pid_file(instance.name),
        env=child_env,
    )


async def _wait_serving(
    ctx: LaunchContext, launched: Started, instance: InstancePlan, env: Mapping[str, str], deadline: float
) -> int:
    """Wait until the instance is ready and its gRPC health is SERVING; the pid its pid file names."""
    state = ctx.state
    try:
        await wait_ready_file(launched, state.ready_file(instance.name), deadline)
    except SupervisorError as exc:
        raise ApplianceError(str(exc)) from None
    try:
        await asyncio.to_thread(container_layout.adopt_main_pid, ctx.plan, launched, state.pid_file(instance.name), env)
    except container_layout.ContainersError as err:
        raise ApplianceError(f"{err}\n{describe_log(launched.log_file)}") from None
    health = await wait_serving(instance.grpc_address, deadline)
    if health is not Health.SERVING:
        raise ApplianceError(
            f"{instance.name} wrote its ready file but its gRPC health at {instance.grpc_address} is {health}\n"
            f"{describe_log(launched.log_file)}"
        )
    return launched.pid


async def _wait_registered(ctx: LaunchContext, cluster_token: str, deadline: float) -> str:
    """Wait until every planned instance is a registered, alive node; the cluster id."""
    wanted = {i.node_id: i for i in ctx.plan.instances}
    client = MgmtdClient(ctx.mgmtd_addresses, token=cluster_token, timeout_s=2.0)
    missing: dict[int, InstancePlan] = dict(wanted)
    last_error = ""
    try:
        while True:
            try:
                resp = await client.mgmtd.get_routing_info(mgmtd_pb2.GetRoutingInfoRequest())
            except RpcError as err:
                last_error = f" (mgmtd answered {err.code.name}: {err.details})"
            else:
                alive = {n.node_id for n in resp.routing_info.nodes if n.status == mgmtd_pb2.NODE_STATUS_ALIVE}
                missing = {k: v for k, v in wanted.items() if k not in alive}
                if not missing:
                    return str(resp.routing_info.cluster_id)
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(REGISTRATION_POLL_S)
    finally:
        await client.close()
    logs = "\n".join(describe_log(ctx.state.log_file(i.name), lines=5) for i in missing.values())
    names = ", ".join(f"{i.name} (node {i.node_id})" for i in missing.values())
    raise ApplianceError(f"not registered and alive in mgmtd in time: {names}{last_error}\n{logs}")


def _stop_started(state: StateDir, started: Sequence[Started], out: TextIO) -> None:
    """After a failed ``up``: stop what this call started, so nothing half-up is left behind."""
    if not started:
        return
    print(f"stopping the {len(started)} instance(s) this up started", file=out)
    terminate({s.name: s.pid for s in started}, timeout_s=10.0)
    for launched in started:
        reap(launched)
        remove_files([state.pid_file(launched.name), state.ready_file(launched.name)])


def render_endpoints(state: StateDir, result: UpResult, stop_hint: str) -> str:
    """What ``up`` prints at the end: where every API is and how to go on."""
    rows = [[i.name, i.node_id, result.pids.get(i.name), i.grpc_address, i.metrics_url] for i in result.plan.instances]
    table = format_table(["instance", "node", "pid", "gRPC", "metrics"], rows)
    return (
        f"cluster {result.cluster_id} is up\n{table}\n"
        f"state folder: {state.root}  (plan.json, logs/, run/, secrets/)\n"
        f"admin token:  {state.admin_token_file}  (used by `fireflyer user|group|token|whoami`)\n"
        f"stop it with: {stop_hint}"
    )


def down(
    state: StateDir,
    timeout_s: float,
    out: TextIO,
    services: Sequence[ServiceSpec] = SERVICES,
    env: Mapping[str, str] | None = None,
) -> list[str]:
    """SIGTERM every instance (last-started service first), wait, SIGKILL what is left. Data stays.

    Returns:
        The instances that did not stop in ``timeout_s`` and were killed.
    """
    plan = load_plan(state)
    if plan is None:
        print(f"no cluster in {state.root}: nothing to stop", file=out)
        return []
    # Last started, first stopped; instances of services this version does not know go first.
    order = [s.name for s in reversed(services)]
    order = sorted({i.service for i in plan.instances} - set(order)) + order
    killed: list[str] = []
    with exclusive_lock(state.lock_file):
        for wave in stop_waves(order):
            killed += _stop_service(state, [i for service in wave for i in plan.of_service(service)], timeout_s, out)
        host_layout.remove_network(plan, out)
        container_layout.remove_leftovers(plan, env, out)
    return killed


# Services that need nothing of each other while they stop: stopped at once. The agents go before them (their
# ranks stop and report while the scheduler is still up), storage after meta, mgmtd last (the others leave it).
STOP_TOGETHER = frozenset({TELEMETRY, SCHEDULER, META})


def stop_waves(order: Sequence[str]) -> list[list[str]]:
    """``order`` cut into waves: neighbours both in ``STOP_TOGETHER`` share one."""
    waves: list[list[str]] = []
    for service in order:
        if waves and service in STOP_TOGETHER and waves[-1][-1] in STOP_TOGETHER:
            waves[-1].append(service)
        else:
            waves.append([service])
    return waves


def _stop_service(state: StateDir, instances: Sequence[InstancePlan], timeout_s: float, out: TextIO) -> list[str]:
    running: dict[str, int] = {}
    for instance in instances:
        pid = running_pid(state.pid_file(instance.name), state.process_marker(instance.name))
        if pid is None:
            print(f"{instance.name}: not running", file=out)
        else:
            running[instance.name] = pid
    killed = terminate(running, timeout_s)
    for name, pid in running.items():
        how = f"did not stop within {timeout_s:g}s: killed (SIGKILL)" if name in killed else "stopped"
        print(f"{name}: {how} (pid {pid})", file=out)
    remove_files(p for i in instances for p in (state.pid_file(i.name), state.ready_file(i.name)))
    return killed
