"""``join`` and ``leave``: this machine's agent and/or storage in a cluster whose control plane runs elsewhere.

``join`` keeps a state folder of its own (plan.json with the joined instances, their ports and node ids;
joined.json with the cluster's mgmtd addresses and the storage disks; secrets/cluster_token), so a second ``join``
restarts the same nodes. A joined storage node takes its fair share of the chains' replicas (``replicas``).

``leave`` drains, then stops and removes: the agent's node is disabled in the scheduler (no new task is placed
on it, and its runs are suspended: they checkpoint and queue again for other nodes) until no run is left on it;
the storage node's replicas move to the other nodes and sync there; then the services stop, their nodes are
disabled in mgmtd and, once mgmtd declared them dead (their lease ran out), removed from it (``RemoveNode``: the
scheduler forgets the agent's node; the ids are never given to another node).
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

import grpc

from ff_appliance import replicas
from ff_appliance.health import Health, wait_serving
from ff_appliance.scheduler_setup import scheduler_address
from ff_appliance.scheduler_user import SchedulerUser
from ff_appliance.services import AGENT, SERVICES, STORAGE, LaunchContext, command, spec_for
from ff_appliance.state import (
    ClusterPlan,
    InstancePlan,
    StateDir,
    load_plan,
    read_secret,
    remove_files,
    save_plan,
    write_secret,
)
from ff_appliance.supervisor import (
    Started,
    SupervisorError,
    exclusive_lock,
    reap,
    running_pid,
    start_detached,
    terminate,
    wait_ready_file,
)
from ff_cluster import MgmtdClient
from ff_config.ports import pick_free_ports
from ff_rpc import RpcError
from fireflyer.mgmtd.v1 import mgmtd_pb2
from fireflyer.scheduler.v1 import scheduler_pb2 as spb

CPU_DEVICE_SLOTS = 2
DRAIN_POLL_S = 0.5
# How long past mgmtd's node lease a stopped node may take to be declared dead (mgmtd checks every T/20, <= 0.5 s).
DEAD_MARGIN_S = 5.0
READY_POLL_S = 0.2
LEAVING = "leaving the cluster (fireflyer leave)"


class JoinError(Exception):
    """``join`` or ``leave`` cannot do what was asked; the message says why."""


@dataclass(frozen=True, kw_only=True)
class JoinOptions:
    """What ``join`` was asked for.

    Attributes:
        mgmtd: the cluster's mgmtd addresses.
        token: the cluster token (``<state>/secrets/cluster_token`` of the cluster's machine).
        agent: run an agent here.
        storage_disks: run a storage service here with its targets in these folders (none: no storage).
        address: the address this machine's services listen on (empty: the one that reaches mgmtd).
        env: environment of the started processes.
        timeout_s: how long the whole join may take (moved replicas syncing included).
    """

    mgmtd: tuple[str, ...]
    token: str
    agent: bool
    storage_disks: tuple[Path, ...]
    address: str = ""
    env: Mapping[str, str]
    timeout_s: float = 120.0


@dataclass(frozen=True, kw_only=True)
class Devices:
    """What the agent will offer: GPUs found through NVML, else CPU device slots."""

    num_gpus: int
    how: str  # what was found, for the user

    @property
    def num_slots(self) -> int:
        """Device slots the agent offers: one per GPU, else CPU_DEVICE_SLOTS."""
        return self.num_gpus or CPU_DEVICE_SLOTS


def find_devices() -> Devices:
    """GPUs through NVML (the driver's libnvidia-ml), without importing torch.

    The agent itself asks torch when it starts (``detect_gpus``) and uses those.
    """
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return Devices(
            num_gpus=0,
            how=f"no GPU (no NVIDIA driver: libnvidia-ml.so.1 not found); {CPU_DEVICE_SLOTS} CPU device slots",
        )
    count = ctypes.c_uint(0)
    if nvml.nvmlInit_v2() != 0 or nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
        return Devices(num_gpus=0, how=f"no GPU (NVML did not initialise); {CPU_DEVICE_SLOTS} CPU device slots")
    nvml.nvmlShutdown()
    if count.value == 0:
        return Devices(num_gpus=0, how=f"no GPU (NVML sees none); {CPU_DEVICE_SLOTS} CPU device slots")
    return Devices(num_gpus=count.value, how=f"{count.value} GPU(s) through NVML")


def local_address_towards(address: str) -> str:
    """The address of this machine's interface that reaches ``address`` (host:port); no packet is sent."""
    host, _, port = address.rpartition(":")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((host.strip("[]"), int(port)))
        local: str = sock.getsockname()[0]
    return local


def joined_file(state: StateDir) -> Path:
    """``joined.json`` of a join's state folder: the cluster's mgmtd addresses and the storage disks."""
    return state.root / "joined.json"


async def join(state: StateDir, options: JoinOptions, out: TextIO) -> ClusterPlan:
    """Start this machine's agent and/or storage service into the cluster; storage then takes its share of replicas.

    A ``state`` that has joined before starts the same nodes again.

    Raises:
        JoinError: nothing to run, mgmtd unreachable or the token refused, a service did not start or register.
    """
    if not options.agent and not options.storage_disks:
        raise JoinError("give --agent, --storage PATH, or both")
    if state.plan_file.exists() and not joined_file(state).exists():
        raise JoinError(f"{state.root} holds a cluster brought up here: give join a state folder of its own")
    options = replace(options, storage_disks=_storage_disks(state, options.storage_disks))
    state.create_dirs()
    with exclusive_lock(state.lock_file):
        client = MgmtdClient(list(options.mgmtd), token=options.token, timeout_s=5.0)
        try:
            info = await _cluster_info(client)
            address = options.address or _address_towards(options.mgmtd[0])
            devices = find_devices()
            print(f"cluster {info.cluster_id}; this machine joins as {address}; devices: {devices.how}", file=out)
            write_secret(state.cluster_token_file, options.token)
            _write_joined(state, options)
            plan = _join_plan(state, options, address)
            ctx = LaunchContext(state=state, plan=plan, remote_mgmtd=options.mgmtd)
            deadline = time.monotonic() + options.timeout_s
            plan = await _start(ctx, options, devices, deadline, out)
            for instance in plan.of_service(AGENT):
                await _wait_schedulable(client, options.token, instance.node_id, deadline, out)
            for instance in plan.of_service(STORAGE):
                await _take_share(client, options.token, instance.node_id, deadline, out)
        finally:
            await client.close()
    return plan


def _storage_disks(state: StateDir, given: tuple[Path, ...]) -> tuple[Path, ...]:
    """The storage disks of this join: those of an earlier join, or ``given`` the first time.

    A storage node keeps its targets on its disks, so they cannot change between joins.

    Raises:
        JoinError: other disks than before are given.
    """
    if not joined_file(state).exists():
        return given
    before = tuple(Path(p) for p in read_joined(state).get("storage_disks", []))
    if before and given and given != before:
        raise JoinError(
            f"this machine's storage keeps its targets in {', '.join(map(str, before))}: join again "
            "with those (or none), or `fireflyer leave` first"
        )
    return before or given


def _address_towards(mgmtd: str) -> str:
    try:
        return local_address_towards(mgmtd)
    except (OSError, ValueError) as err:
        raise JoinError(f"cannot find this machine's address towards mgmtd {mgmtd}: {err}") from None


async def _cluster_info(client: MgmtdClient) -> mgmtd_pb2.RoutingInfo:
    try:
        info: mgmtd_pb2.RoutingInfo = (
            await client.mgmtd.get_routing_info(mgmtd_pb2.GetRoutingInfoRequest())
        ).routing_info
    except RpcError as err:
        raise JoinError(f"mgmtd at {client.current_address} answered {err.code.name}: {err.details}") from None
    return info


def _write_joined(state: StateDir, options: JoinOptions) -> None:
    doc = {"mgmtd": list(options.mgmtd), "storage_disks": [str(p) for p in options.storage_disks]}
    joined_file(state).write_text(json.dumps(doc, indent=2) + "\n")


def read_joined(state: StateDir) -> dict[str, Any]:
    """Raises: JoinError: ``state`` has not joined a cluster."""
    try:
        doc: dict[str, Any] = json.loads(joined_file(state).read_text())
    except FileNotFoundError:
        raise JoinError(f"{state.root} has not joined a cluster (run `fireflyer join` first)") from None
    return doc


def _join_plan(state: StateDir, options: JoinOptions, address: str) -> ClusterPlan:
    """The joined instances: those of an earlier join (same ports and node ids), plus those asked for now."""
    existing = load_plan(state)
    instances = list(existing.instances) if existing else []
    have = {i.service for i in instances}
    wanted = ([AGENT] if options.agent else []) + ([STORAGE] if options.storage_disks else [])
    used = {p for i in instances for p in (i.grpc_port, i.metrics_port)}
    for service in wanted:
        if service in have:
            continue
        grpc_port, metrics_port = pick_free_ports(2, used, host=address)
        used |= {grpc_port, metrics_port}
        # node id 0: mgmtd assigns one at the first registration; it is kept here for every later start.
        instances.append(
            InstancePlan(
                name=f"{service}-1",
                service=service,
                node_id=0,
                grpc_port=grpc_port,
                metrics_port=metrics_port,
                host=address,
            )
        )
    plan = ClusterPlan(instances=tuple(instances), created_at=existing.created_at if existing else time.time())
    save_plan(state, plan)
    return plan


async def _start(
    ctx: LaunchContext, options: JoinOptions, devices: Devices, deadline: float, out: TextIO
) -> ClusterPlan:
    """Start the instances not running (together) and wait until each serves; the plan with their node ids.

    On a failure, what this call started is stopped again.
    """
    started: list[tuple[Started, InstancePlan]] = []
    for instance in ctx.plan.instances:
        pid = running_pid(ctx.state.pid_file(instance.name), ctx.state.process_marker(instance.name))
        if pid is not None:
            print(f"{instance.name}: already running (pid {pid}), node {instance.node_id}", file=out)
        else:
            started.append((_launch(ctx, options, devices, instance), instance))
    try:
        node_ids = {i.name: await _wait_up(ctx, launched, i, deadline) for launched, i in started}
    except BaseException:
        terminate({launched.name: launched.pid for launched, _ in started}, timeout_s=10.0)
        for launched, _ in started:
            reap(launched)
        raise
    plan = replace(
        ctx.plan, instances=tuple(replace(i, node_id=node_ids.get(i.name, i.node_id)) for i in ctx.plan.instances)
    )
    if plan != ctx.plan:
        save_plan(ctx.state, plan)
    for launched, instance in started:
        print(f"{instance.name}: started (pid {launched.pid}), registered as node {node_ids[instance.name]}", file=out)
    return plan


def _launch(ctx: LaunchContext, options: JoinOptions, devices: Devices, instance: InstancePlan) -> Started:
    spec = spec_for(instance, SERVICES)
    argv = command(spec, ctx, instance)
    if spec.name == AGENT:
        argv += ["--num-device-slots", str(devices.num_slots)]  # the last value of a flag wins
    elif spec.name == STORAGE:
        argv += ["--disks", ",".join(str(p) for p in options.storage_disks)]
    ctx.state.data_dir(spec.name).mkdir(mode=0o700, parents=True, exist_ok=True)
    remove_files([ctx.state.ready_file(instance.name)])
    env = {**options.env, "PYTHONUNBUFFERED": "1"}
    return start_detached(
        instance.name,
        argv,
        log_file=ctx.state.log_file(instance.name),
        pid_file=ctx.state.pid_file(instance.name),
        env=env,
    )


async def _wait_up(ctx: LaunchContext, launched: Started, instance: InstancePlan, deadline: float) -> int:
    """Wait until ``launched`` is ready and serving; the node id mgmtd gave it."""
    try:
        ready = await wait_ready_file(launched, ctx.state.ready_file(instance.name), deadline)
    except SupervisorError as err:
        raise JoinError(str(err)) from None
    if await wait_serving(instance.grpc_address, deadline) is not Health.SERVING:
        raise JoinError(f"{instance.name} is not serving at {instance.grpc_address}")
    return int(ready.get("node_id", 0))


async def _wait_schedulable(client: MgmtdClient, token: str, node_id: int, deadline: float, out: TextIO) -> None:
    """Wait until the scheduler has the agent's node ready (the agent registers there after mgmtd)."""
    user = SchedulerUser(await scheduler_address(client), token)
    try:
        while True:
            nodes = (await user.scheduler.list_nodes(spb.ListNodesRequest())).nodes
            found = [n for n in nodes if n.node_id == node_id]
            if found and found[0].state == spb.NODE_STATE_READY:
                print(f"node {node_id}: ready in the scheduler ({len(found[0].devices)} devices)", file=out)
                return
            if time.monotonic() > deadline:
                state = spb.NodeState.Name(found[0].state) if found else "not registered"
                raise JoinError(f"node {node_id} is not ready in the scheduler in time: {state}")
            await asyncio.sleep(READY_POLL_S)
    finally:
        await user.close()


async def _take_share(client: MgmtdClient, token: str, node_id: int, deadline: float, out: TextIO) -> None:
    info = await replicas.routing(client)
    moves = replicas.moves_onto(replicas.chain_nodes(info), node_id, replicas.alive_storage_nodes(info))
    await _do_moves(client, token, moves, deadline, out)


async def _do_moves(
    client: MgmtdClient, token: str, moves: Sequence[replicas.Move], deadline: float, out: TextIO
) -> None:
    new_targets: list[int] = []
    for move in moves:
        try:
            target_id = await replicas.apply_move(client, token, move, max(1.0, deadline - time.monotonic()))
        except replicas.ReplicaError as err:
            raise JoinError(str(err)) from None
        new_targets.append(target_id)
        where = f"to node {move.to_node} (target {target_id})" if move.to_node else "dropped (no other node)"
        print(f"chain {move.chain_id}: replica of node {move.from_node} {where}", file=out)
    try:
        await replicas.wait_serving(client, new_targets, max(1.0, deadline - time.monotonic()))
    except replicas.ReplicaError as err:
        raise JoinError(str(err)) from None
    if new_targets:
        print(f"{len([t for t in new_targets if t])} moved replica(s) synced and serving", file=out)


async def leave(state: StateDir, drain_timeout_s: float, out: TextIO) -> None:
    """Drain this machine's joined nodes, then stop them and remove them from the cluster (see the module docstring).

    Raises:
        JoinError: not joined; a task still runs after ``drain_timeout_s``; a replica cannot move; mgmtd
            refuses to remove a node.
    """
    joined, plan, token = read_joined(state), load_plan(state), read_secret(state.cluster_token_file)
    if plan is None or token is None:
        raise JoinError(f"{state.root} has no joined nodes")
    deadline = time.monotonic() + drain_timeout_s
    with exclusive_lock(state.lock_file):
        client = MgmtdClient(list(joined["mgmtd"]), token=token, timeout_s=5.0)
        leaving = [i.node_id for i in plan.of_service(STORAGE)]
        try:
            # Every replica must have somewhere to go before anything changes (an agent disabled, a replica moved).
            info = await replicas.routing(client)
            try:
                replicas.moves_off_all(replicas.chain_nodes(info), leaving, replicas.alive_storage_nodes(info))
            except replicas.ReplicaError as err:
                raise JoinError(f"{err}; nothing was changed") from None
            for instance in plan.of_service(AGENT):
                await _drain_agent(client, token, instance.node_id, deadline, out)
            for node_id in leaving:
                info = await replicas.routing(client)
                staying = [n for n in replicas.alive_storage_nodes(info) if n not in leaving]
                try:
                    moves = replicas.moves_off(replicas.chain_nodes(info), node_id, staying)
                except replicas.ReplicaError as err:
                    raise JoinError(str(err)) from None
                await _do_moves(client, token, moves, deadline, out)
            _stop(state, plan, out)
            await _remove_nodes(client, token, plan, out)
        finally:
            await client.close()
    joined_file(state).unlink()
    state.plan_file.unlink()


async def _drain_agent(client: MgmtdClient, token: str, node_id: int, deadline: float, out: TextIO) -> None:
    user = SchedulerUser(await scheduler_address(client), token)
    try:
        try:
            await user.scheduler.set_node_enabled(
                spb.SetNodeEnabledRequest(node_id=node_id, enabled=False, reason=LEAVING)
            )
        except RpcError as err:
            if err.code is not grpc.StatusCode.NOT_FOUND:
                raise
            print(f"node {node_id}: not in the scheduler (an earlier leave removed it)", file=out)
            return
        print(
            f"node {node_id}: disabled in the scheduler: no new task goes there, and the runs on it are suspended "
            "(they checkpoint and queue again for other nodes); waiting until none is left",
            file=out,
        )
        while True:
            nodes = (await user.scheduler.list_nodes(spb.ListNodesRequest())).nodes
            tasks = [list(n.task_ids) for n in nodes if n.node_id == node_id]
            if not tasks or not tasks[0]:
                print(f"node {node_id}: drained (no run on it)", file=out)
                return
            if time.monotonic() > deadline:
                raise JoinError(
                    f"node {node_id} still has runs of tasks {tasks[0]} (stop them, or give a longer "
                    "--drain-timeout-s); it stays disabled in the scheduler"
                )
            await asyncio.sleep(DRAIN_POLL_S)
    finally:
        await user.close()


async def _remove_nodes(client: MgmtdClient, token: str, plan: ClusterPlan, out: TextIO) -> None:
    """Disable the stopped nodes in mgmtd, wait until it declares them dead, then remove them.

    mgmtd removes only a dead node (a live one would register again). A service that stopped cleanly told mgmtd
    with its last heartbeat, and is dead already; one that did not (killed, mgmtd unreachable) is declared dead
    when the lease of its last heartbeat runs out, up to mgmtd's T after the stop. A node an earlier leave removed
    is skipped.
    """
    info = await replicas.routing(client)
    registered = {n.node_id for n in info.nodes}
    leaving = {i.node_id: i.name for i in plan.instances if i.node_id in registered}
    for node_id, name in leaving.items():
        disable = mgmtd_pb2.SetNodeEnabledRequest(node_id=node_id, enabled=False)
        await client.mgmtd.set_node_enabled(disable)
        print(f"node {node_id} ({name}): disabled in mgmtd", file=out)
    if not leaving:
        return
    lease_s = (await client.mgmtd.get_cluster_info(mgmtd_pb2.GetClusterInfoRequest())).lease_duration_s
    print(
        f"waiting for mgmtd to declare node(s) {sorted(leaving)} dead (at once for a service that stopped cleanly, "
        f"else when its lease runs out: {lease_s:g}s)",
        file=out,
    )
    started = time.monotonic()
    await _wait_dead(client, set(leaving), started + lease_s + DEAD_MARGIN_S)
    print(f"node(s) {sorted(leaving)}: dead in mgmtd after {time.monotonic() - started:.1f}s", file=out)
    for node_id, name in leaving.items():
        try:
            await client.mgmtd.remove_node(mgmtd_pb2.RemoveNodeRequest(node_id=node_id))
        except RpcError as err:
            raise JoinError(f"mgmtd did not remove node {node_id} ({name}): {err.details}") from None
        print(f"node {node_id} ({name}): removed from mgmtd (its id is not given to another node)", file=out)
    for instance in plan.of_service(AGENT):
        if instance.node_id in leaving:
            await _wait_forgotten(client, token, instance.node_id, time.monotonic() + DEAD_MARGIN_S, out)


async def _wait_dead(client: MgmtdClient, node_ids: set[int], deadline: float) -> None:
    while True:
        info = await replicas.routing(client)
        alive = sorted(
            n.node_id for n in info.nodes if n.node_id in node_ids and n.status != mgmtd_pb2.NODE_STATUS_DEAD
        )
        if not alive:
            return
        if time.monotonic() > deadline:
            raise JoinError(f"mgmtd still has node(s) {alive} alive after their services stopped: is one running?")
        await asyncio.sleep(DRAIN_POLL_S)


async def _wait_forgotten(client: MgmtdClient, token: str, node_id: int, deadline: float, out: TextIO) -> None:
    """Wait until the scheduler no longer lists the removed agent's node (it follows mgmtd's routing)."""
    user = SchedulerUser(await scheduler_address(client), token)
    try:
        while node_id in {n.node_id for n in (await user.scheduler.list_nodes(spb.ListNodesRequest())).nodes}:
            if time.monotonic() > deadline:
                print(f"node {node_id}: the scheduler still lists it; it forgets it when it next hears mgmtd", file=out)
                return
            await asyncio.sleep(READY_POLL_S)
        print(f"node {node_id}: gone from the scheduler's nodes", file=out)
    finally:
        await user.close()


def _stop(state: StateDir, plan: ClusterPlan, out: TextIO) -> None:
    running = {}
    for instance in plan.instances:
        pid = running_pid(state.pid_file(instance.name), state.process_marker(instance.name))
        if pid is not None:
            running[instance.name] = pid
    killed = terminate(running, timeout_s=20.0)
    for name, pid in running.items():
        print(f"{name}: {'killed' if name in killed else 'stopped'} (pid {pid})", file=out)
    remove_files(p for i in plan.instances for p in (state.pid_file(i.name), state.ready_file(i.name)))
