"""The faults of the full ``fireflyer demo``: a storage service, an agent and a rank stopped while the GPT trains.

A storage service is SIGKILLed and restarted, an agent is SIGKILLed (and restarted), and one rank is stopped with
SIGSTOP.

The demo's own clock only says when it sent each signal. Everything else is read back: when mgmtd declared the
storage service dead and when its targets served again (routing info), how the scheduler ended the run hit and
why (its failure: node, rank, time), which node it cordoned and why (ListNodes), where and from which step the
task resumed (its runs, the loss series in telemetry).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ff_appliance import lifecycle
from ff_appliance.lifecycle import UpOptions
from ff_appliance.scheduler_user import SchedulerUser
from ff_appliance.services import AGENT, STORAGE
from ff_appliance.state import InstancePlan, StateDir, load_plan
from ff_appliance.supervisor import running_pid
from ff_cluster import MgmtdClient
from fireflyer.mgmtd.v1 import mgmtd_pb2
from fireflyer.scheduler.v1 import scheduler_pb2 as pb

# The faults, in the order the demo injects them (``fireflyer demo --faults`` picks some).
FAULT_KINDS = ("storage", "agent", "hang")
FAULT_AFTER_STEPS = 20  # each fault comes once the run it hits has trained this many steps
WATCH_POLL_S = 0.25  # how often the services are asked while a fault is under way
FAULT_WAIT_S = 300.0
STORAGE_DOWN_S = 1.0  # how long the killed storage service stays down before it is restarted
UP_TIMEOUT_S = 120.0
VALIDATIONS = 3  # a cordoned node is validated at most this many times before the demo gives up on it
# The rank the hang fault stops: global rank 3 (node rank 1, local rank 1), on the node that is not the master's.
HUNG_NODE_RANK, HUNG_LOCAL_RANK = 1, 1


class FaultError(Exception):
    """A fault did not have the effect the services should show."""


@dataclass(frozen=True)
class ClusterHandle:
    """What the faults need beyond the services' addresses to restart a service as ``up`` started it.

    The appliance's state folder (plan, pid files) and the environment ``up`` starts processes with.
    """

    state: StateDir
    env: Mapping[str, str]


@dataclass
class FaultRecord:
    """One injected fault and what the services said about it.

    ``detected_at`` and ``recovered_at`` are read back (or, for the storage service, the first poll of mgmtd that
    showed it): for the agent and the rank, the scheduler's failure time; the first step after the fault comes from
    telemetry when the summary is made.
    """

    kind: str  # one of FAULT_KINDS
    event: str
    signalled_at: float
    at_step: int
    run_id: int
    node_id: int
    detected_at: float = 0.0
    detected_by: str = ""
    recovered_at: float = 0.0
    recovered_by: str = ""
    facts: list[str] = field(default_factory=list)


# The follower the faults print progress through while they wait (TrainDemo.poll, bound to the task), and the
# newest step it printed of a run (by run id; 0 before its first).
Poll = Callable[[], Awaitable[pb.Task]]
Progress = Callable[[int], int]


class Faults:
    """Injects the three faults into the training task and follows what the services say."""

    def __init__(
        self,
        cluster: ClusterHandle,
        mgmtd: MgmtdClient,
        admin: SchedulerUser,
        poll: Poll,
        progress: Progress,
        step: Callable[[str], None],
        say: Callable[[str], None],
    ) -> None:
        self.cluster, self.mgmtd, self.admin, self.poll, self.progress = cluster, mgmtd, admin, poll, progress
        self.step, self.say = step, say

    # ---- waiting while the terminal follows the training ----

    async def until(self, check: Callable[[pb.Task], Awaitable[Any]], why: str, *, task_may_end: bool = False) -> Any:
        """Follow the task until ``check(task)`` answers something truthy; that answer.

        Raises:
            FaultError: the wait took over FAULT_WAIT_S, or the task ended first (unless ``task_may_end``: a wait
                for something that does not need the task, such as a node's validation).
        """
        deadline = time.monotonic() + FAULT_WAIT_S
        last_poll = 0.0
        task = await self.poll()
        while True:
            if time.monotonic() - last_poll >= 1.0:
                task, last_poll = await self.poll(), time.monotonic()
            found = await check(task)
            if found:
                return found
            if task.state >= pb.TASK_STATE_SUCCEEDED and not task_may_end:
                raise FaultError(f"the training task ended ({task.current_run.end_message}) before {why}")
            if time.monotonic() > deadline:
                raise FaultError(f"{why} did not happen within {FAULT_WAIT_S:g} s")
            await asyncio.sleep(WATCH_POLL_S)

    async def trained(self, steps: int) -> tuple[pb.Task, int]:
        """Follow until the current run has trained ``steps`` steps past the newest one shown now.

        The task and the newest step then.
        """
        task = await self.poll()
        start = self.progress(task.current_run.run_id)

        async def check(task: pb.Task) -> pb.Task | None:
            run = task.current_run
            return task if run.state == pb.RUN_STATE_RUNNING and self.progress(run.run_id) >= start + steps else None

        found: pb.Task = await self.until(check, f"{steps} more steps")
        return found, self.progress(found.current_run.run_id)

    async def checkpointed(self) -> tuple[pb.Task, int]:
        """Follow until the current run has a checkpoint of its own that the scheduler counted.

        A fault that ends the run then resumes from it, not from a checkpoint the run is still writing. The task and the
        newest step shown then.
        """

        async def check(task: pb.Task) -> pb.Task | None:
            run = task.current_run
            return task if run.state == pb.RUN_STATE_RUNNING and run.last_checkpoint.step > 0 else None

        found: pb.Task = await self.until(check, "a checkpoint of the current run")
        return found, self.progress(found.current_run.run_id)

    async def _routing(self) -> mgmtd_pb2.RoutingInfo:
        resp = await self.mgmtd.mgmtd.get_routing_info(mgmtd_pb2.GetRoutingInfoRequest())
        info: mgmtd_pb2.RoutingInfo = resp.routing_info
        return info

    async def restart(self, what: str) -> None:
        """``fireflyer up`` again: it starts what is not running (``what``) and waits until it is registered."""
        options = UpOptions(env=dict(self.cluster.env), counts={}, timeout_s=UP_TIMEOUT_S)
        out = io.StringIO()
        await lifecycle.up(self.cluster.state, options, out)
        started = [line for line in out.getvalue().splitlines() if ": started" in line]
        self.say(f"restarted with `fireflyer up`: {'; '.join(started) or what + ' (already running)'}")

    def _instance(self, service: str, node_id: int | None = None) -> InstancePlan:
        """The plan's last instance of ``service`` (on ``node_id`` if given).

        Raises:
            FaultError: the state folder has no plan, or no such instance.
        """
        plan = load_plan(self.cluster.state)
        if plan is None:
            raise FaultError(f"no cluster plan in {self.cluster.state.root}")
        instances = plan.of_service(service)
        chosen = [i for i in instances if node_id is None or i.node_id == node_id]
        if not chosen:
            raise FaultError(f"no {service} instance of node {node_id} in the plan")
        return chosen[-1]

    def _kill(self, instance: InstancePlan) -> int:
        """SIGKILL the instance's process; its pid.

        Raises:
            FaultError: it is not running.
        """
        state = self.cluster.state
        pid = running_pid(state.pid_file(instance.name), state.process_marker(instance.name))
        if pid is None:
            raise FaultError(f"{instance.name} is not running")
        os.kill(pid, signal.SIGKILL)
        return pid

    # ---- a storage service ----

    async def storage(self, task: pb.Task, at_step: int) -> FaultRecord:
        """SIGKILL a storage service mid-training, restart it at once, and record mgmtd taking it out and back.

        It is restarted at once, as its supervisor would. The restarted service reports its targets offline until
        mgmtd stops routing to them, then they come back through syncing (3FS's recovery after a restart); the run
        must go on throughout, on the other replicas. The fault's length does not depend on mgmtd's heartbeat
        timeout, so a fast trainer cannot outrun it.

        Raises:
            FaultError: mgmtd did not take its targets out or they did not serve again in time, or the run ended.
        """
        self.step("a storage service is SIGKILLed while the trainer trains, then restarted")
        instance = self._instance(STORAGE)
        before = await self._routing()
        targets = {t.target_id for c in before.chains for t in c.targets if t.node_id == instance.node_id}
        versions = {c.chain_id: c.version for c in before.chains if targets & {t.target_id for t in c.targets}}
        run_id = task.current_run.run_id
        pid = self._kill(instance)
        rec = FaultRecord(
            kind="storage",
            event=f"{instance.name} SIGKILLed",
            signalled_at=time.time(),
            at_step=at_step,
            run_id=run_id,
            node_id=instance.node_id,
        )
        self.say(
            f"{instance.name} (node {instance.node_id}, pid {pid}, {len(targets)} targets) SIGKILLed after step "
            f"{at_step} of run {task.current_run.run_index}"
        )
        # Watched from the kill on, while the service restarts: its targets' chains get a new version once mgmtd
        # takes them out of serving (the node declared dead, or the restarted service reporting them offline).
        watch = asyncio.create_task(self._chains_moved(versions, targets))
        try:
            await asyncio.sleep(STORAGE_DOWN_S)
            await self.restart(instance.name)
            rec.detected_at, seen = await self.until(
                lambda _: _done(watch), f"mgmtd taking {instance.name}'s targets out of their chains"
            )
        finally:
            watch.cancel()
        rec.detected_by = f"mgmtd: its targets {', '.join(sorted(seen))}"
        self.say(
            f"mgmtd took node {instance.node_id}'s targets out of serving {rec.detected_at - rec.signalled_at:.1f} s "
            f"after the kill ({', '.join(sorted(seen))}); they come back through syncing"
        )

        async def serving(_: pb.Task) -> bool:
            info = await self._routing()
            mine = [t for c in info.chains for t in c.targets if t.target_id in targets]
            alive = any(n.node_id == instance.node_id and n.status == mgmtd_pb2.NODE_STATUS_ALIVE for n in info.nodes)
            return (
                alive
                and len(mine) == len(targets)
                and all(t.public_state == mgmtd_pb2.PUBLIC_TARGET_STATE_SERVING for t in mine)
            )

        await self.until(serving, f"{instance.name}'s targets serving again")
        rec.recovered_at = time.time()
        rec.recovered_by = f"mgmtd: node {instance.node_id} alive, its {len(targets)} targets resynced and serving"
        after = await self.poll()
        if after.current_run.run_id != run_id or after.current_run.state != pb.RUN_STATE_RUNNING:
            raise FaultError(
                f"the training run did not go on through the storage fault: run "
                f"{after.current_run.run_index} is {pb.RunState.Name(after.current_run.state)} "
                f"({after.current_run.end_message})"
            )
        self.say(
            f"its targets serve again {rec.recovered_at - rec.signalled_at:.1f} s after the kill; run "
            f"{after.current_run.run_index} kept running throughout (the scheduler: "
            f"{pb.RunState.Name(after.current_run.state).removeprefix('RUN_STATE_').lower()})"
        )
        return rec

    async def _chains_moved(self, versions: Mapping[int, int], targets: set[int]) -> tuple[float, set[str]]:
        """When a chain in ``versions`` first had a newer version, and the public states of ``targets`` then."""
        while True:
            info = await self._routing()
            moved = [c for c in info.chains if c.chain_id in versions and c.version > versions[c.chain_id]]
            if moved:
                states = {t.public_state for c in moved for t in c.targets if t.target_id in targets}
                return time.time(), {_state_name(s) for s in states}
            await asyncio.sleep(WATCH_POLL_S / 2)

    # ---- an agent ----

    async def agent(self, task: pb.Task, at_step: int) -> FaultRecord:
        """SIGKILL the agent of one of the trainer's nodes, restart it, and record the task's resume in a new run.

        Raises:
            FaultError: the run did not end NODE_LOST on that node, or the task did not resume in time.
        """
        self.step("the agent of one of the trainer's nodes is SIGKILLed; then restarted")
        run = task.current_run
        node_id = next(n.node_id for n in run.nodes if n.node_rank == HUNG_NODE_RANK)
        instance = self._instance(AGENT, node_id)
        pid = self._kill(instance)
        rec = FaultRecord(
            kind="agent",
            event=f"{instance.name} SIGKILLed",
            signalled_at=time.time(),
            at_step=at_step,
            run_id=run.run_id,
            node_id=node_id,
        )
        self.say(
            f"{instance.name} (node {node_id}, node rank {HUNG_NODE_RANK} of run {run.run_index}, pid {pid}) "
            f"SIGKILLed after step {at_step}"
        )
        ended = await self.until(_run_ended(run.run_id), f"run {run.run_index} ending")
        failure = ended.failure
        if ended.end_reason != pb.RUN_END_REASON_NODE_LOST or failure.node_id != node_id:
            raise FaultError(
                f"run {run.run_index} ended {pb.RunEndReason.Name(ended.end_reason)} on node "
                f"{failure.node_id}, not NODE_LOST on node {node_id}: {ended.end_message}"
            )
        rec.detected_at = failure.failed_at or ended.ended_at
        rec.detected_by = f"scheduler: run {run.run_index} NODE_LOST, {failure.message or ended.end_message}"
        self.say(
            f"the scheduler ended run {run.run_index} NODE_LOST {rec.detected_at - rec.signalled_at:.1f} s "
            f"after the kill: {failure.message or ended.end_message} (checkpoint step "
            f"{ended.last_checkpoint.step})"
        )
        await self.restart(instance.name)
        await self._node_ready(node_id)
        resumed = await self.until(self._next_run_stepping(run.run_id), "the task resuming")
        rec.recovered_by = f"scheduler: run {resumed.run_index} running on nodes {_node_ids(resumed)}"
        self.say(f"task re-queued and resumed: run {resumed.run_index} on nodes {_node_ids(resumed)}")
        return rec

    def _next_run_stepping(self, run_id: int) -> Callable[[pb.Task], Awaitable[pb.Run | None]]:
        """The run after ``run_id`` once its first step has shown in the log (it may have ended since, done)."""

        async def check(task: pb.Task) -> pb.Run | None:
            later = [r for r in task.runs if r.run_id > run_id and self.progress(r.run_id) > 0]
            return later[0] if later else None

        return check

    async def _node(self, node_id: int) -> pb.Node | None:
        """The scheduler's view of the node, if it knows it."""
        nodes = (await self.admin.scheduler.list_nodes(pb.ListNodesRequest())).nodes
        return next((n for n in nodes if n.node_id == node_id), None)

    async def _node_ready(self, node_id: int, *, task_may_end: bool = False) -> pb.Node:
        async def ready(_: pb.Task) -> pb.Node | None:
            node = await self._node(node_id)
            return node if node is not None and node.state == pb.NODE_STATE_READY else None

        found: pb.Node = await self.until(ready, f"node {node_id} ready", task_may_end=task_may_end)
        return found

    async def _node_validated(self, node_id: int, asked: float) -> pb.Node:
        """The node once it is ready, or once a validation finished since ``asked`` failed."""

        async def settled(_: pb.Task) -> pb.Node | None:
            node = await self._node(node_id)
            if node is None or node.state == pb.NODE_STATE_READY:
                return node
            failed = node.last_validation.finished_at >= asked and not node.last_validation.passed
            return node if failed else None

        found: pb.Node = await self.until(settled, f"node {node_id} validated", task_may_end=True)
        return found

    # ---- a rank stopped ----

    async def hang(self, task: pb.Task, at_step: int) -> FaultRecord:
        """SIGSTOP one rank of the trainer and record that its agent names it and the scheduler cordons its node.

        Raises:
            FaultError: the rank's process is not on this machine, the run did not end HANG_DETECTED naming it, its
                node was not cordoned, or the task did not resume in time.
        """
        self.step(f"one rank is stopped (SIGSTOP): rank {2 * HUNG_NODE_RANK + HUNG_LOCAL_RANK} of the trainer")
        run = task.current_run
        node_id = next(n.node_id for n in run.nodes if n.node_rank == HUNG_NODE_RANK)
        pids = rank_pids(run.run_id, HUNG_NODE_RANK, HUNG_LOCAL_RANK)
        if not pids:
            raise FaultError(
                f"no process of node rank {HUNG_NODE_RANK}, local rank {HUNG_LOCAL_RANK} of run "
                f"{run.run_id} on this machine"
            )
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        rec = FaultRecord(
            kind="hang",
            event="a rank SIGSTOPped",
            signalled_at=time.time(),
            at_step=at_step,
            run_id=run.run_id,
            node_id=node_id,
        )
        self.say(
            f"SIGSTOP to pid {', '.join(map(str, pids))} (node {node_id}, node rank {HUNG_NODE_RANK}, local rank "
            f"{HUNG_LOCAL_RANK}) after step {at_step}"
        )
        ended = await self.until(_run_ended(run.run_id), f"run {run.run_index} ending")
        failure = ended.failure
        named = (
            failure.hang
            and failure.node_id == node_id
            and failure.node_rank == HUNG_NODE_RANK
            and failure.local_rank == HUNG_LOCAL_RANK
        )
        if ended.end_reason != pb.RUN_END_REASON_HANG_DETECTED or not named:
            raise FaultError(
                f"run {run.run_index} ended {pb.RunEndReason.Name(ended.end_reason)}, the stopped rank "
                f"not named: {failure.message or ended.end_message}"
            )
        rec.detected_at = failure.failed_at
        rec.detected_by = f"agent of node {node_id}: {failure.message}"
        self.say(f"hang detected {rec.detected_at - rec.signalled_at:.1f} s after the SIGSTOP: {failure.message}")
        cordoned = await self._node(node_id)
        if cordoned is None:
            raise FaultError(f"node {node_id} is no longer known to the scheduler")
        if cordoned.state != pb.NODE_STATE_ERR:
            raise FaultError(f"node {node_id} was not cordoned: {pb.NodeState.Name(cordoned.state)}")
        rec.facts.append(f"node {node_id} in err_nodes: {cordoned.state_reason}")
        self.say(f"node {node_id} cordoned (`hfai nodes`: err, {cordoned.state_reason})")
        resumed = await self.until(self._next_run_stepping(run.run_id), "the task resuming")
        if node_id in _node_ids(resumed):
            raise FaultError(f"run {resumed.run_index} was placed on the cordoned node {node_id}")
        rec.recovered_by = f"scheduler: run {resumed.run_index} running on nodes {_node_ids(resumed)}"
        self.say(f"task re-queued and resumed on the other nodes: run {resumed.run_index} on {_node_ids(resumed)}")
        return rec

    async def return_node(self, node_id: int) -> str:
        """A validation of the cordoned node; once it passes, the scheduler returns the node (read back).

        A validation that fails is shown with its failed checks and asked for again, ``VALIDATIONS`` times at most
        (as an operator would: a check of the cluster's storage may fail while the machine is loaded).

        Raises:
            FaultError: every validation failed.
        """
        started = time.time()
        for attempt in range(1, VALIDATIONS + 1):
            asked = time.time()
            await self.admin.scheduler.validate_nodes(pb.ValidateNodesRequest(node_ids=[node_id]))
            node = await self._node_validated(node_id, asked)
            if node.state == pb.NODE_STATE_READY:
                break
            failed = "; ".join(f"{c.name}: {c.message}" for c in node.last_validation.checks if not c.passed)
            self.say(f"validation {attempt} of node {node_id} failed ({failed})")
        else:
            raise FaultError(f"node {node_id} failed {VALIDATIONS} validations; the last: {failed}")
        checks = ", ".join(c.name for c in node.last_validation.checks)
        return (
            f"node {node_id} validated ({checks}: "
            f"{'passed' if node.last_validation.passed else 'failed'}) and back in scheduling after "
            f"{time.time() - started:.1f} s"
        )


def _state_name(state: int) -> str:
    return mgmtd_pb2.PublicTargetState.Name(state).removeprefix("PUBLIC_TARGET_STATE_").lower()  # type: ignore[arg-type]


async def _done(task: asyncio.Task[Any]) -> Any:
    """The task's result once it is done, else None (for ``Faults.until``)."""
    return task.result() if task.done() else None


def _node_ids(run: pb.Run) -> list[int]:
    return [n.node_id for n in sorted(run.nodes, key=lambda n: n.node_rank)]


def _run_ended(run_id: int) -> Callable[[pb.Task], Awaitable[pb.Run | None]]:
    async def check(task: pb.Task) -> pb.Run | None:
        return next((r for r in task.runs if r.run_id == run_id and r.ended_at > 0), None)

    return check


def rank_pids(run_id: int, node_rank: int, local_rank: int, proc: Path = Path("/proc")) -> list[int]:
    """The processes of one rank of a run on this machine, found by the environment the agent gave them."""
    wanted = {
        b"MARSV2_RUN_ID": str(run_id).encode(),
        b"RANK": str(node_rank).encode(),
        b"LOCAL_RANK": str(local_rank).encode(),
    }
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            env = dict(item.split(b"=", 1) for item in (entry / "environ").read_bytes().split(b"\0") if b"=" in item)
            if all(env.get(k) == v for k, v in wanted.items()):
                found.append(int(entry.name))
    return sorted(found)


# ---- the summary's rows ----

Series = dict[int, list[tuple[int, float, float]]]  # run id -> [(step, loss, at)] from telemetry


def fault_rows(task: pb.Task, series: Series, faults: list[FaultRecord]) -> list[tuple[str, str]]:
    """One row per fault: detection, recovery, steps lost, from the records and what the services kept.

    Raises:
        FaultError: the facts contradict the fault's story (a storage fault that ended the run, a resume at
            another step than the failed run's newest checkpoint).
    """
    runs = sorted(task.runs, key=lambda r: r.run_id)
    rows = []
    for rec in faults:
        hit = next((r for r in runs if r.run_id == rec.run_id), None)
        if hit is None:
            raise FaultError(f"{rec.event}: the scheduler has no run {rec.run_id} of task {task.task_id}")
        detect = f"detected after {rec.detected_at - rec.signalled_at:.1f} s ({rec.detected_by})"
        if rec.kind == "storage":
            if 0 < hit.ended_at < rec.recovered_at:
                raise FaultError(f"{rec.event}: run {hit.run_index} ended during the storage fault: {hit.end_message}")
            steps = [s for s, _, at in series.get(hit.run_id, []) if rec.signalled_at <= at <= rec.recovered_at]
            rows.append(
                (
                    rec.event,
                    f"after step {rec.at_step}; {detect}; recovered after "
                    f"{rec.recovered_at - rec.signalled_at:.1f} s ({rec.recovered_by}); steps lost 0: run "
                    f"{hit.run_index} trained {len(steps)} steps meanwhile and went on",
                )
            )
            continue
        after = next((r for r in runs if r.run_id > hit.run_id), None)
        before_steps = [s for s, _, _ in series.get(hit.run_id, [])]
        after_points = sorted(series.get(after.run_id, [])) if after is not None else []
        if after is None or not after_points:
            raise FaultError(f"{rec.event}: no run after run {hit.run_index} trained")
        ck = hit.last_checkpoint.step
        resumed_at = after_points[0][0] - 1
        if resumed_at != ck:
            raise FaultError(
                f"{rec.event}: run {after.run_index} resumed at step {resumed_at + 1}, but the newest "
                f"checkpoint of run {hit.run_index} is step {ck}"
            )
        back = min(at for _, _, at in after_points)
        lost = max(max(before_steps, default=0) - ck, 0)
        rows.append(
            (
                rec.event,
                f"after step {rec.at_step}; {detect}; training again after "
                f"{back - rec.signalled_at:.1f} s (run {after.run_index} on nodes {_node_ids(after)}, from "
                f"checkpoint {ck}); steps lost {lost}" + "".join(f"; {f}" for f in rec.facts),
            )
        )
    return rows
