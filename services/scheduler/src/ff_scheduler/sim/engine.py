"""The discrete-event engine: jobs of a trace through ``core.tick.plan_tick`` (the service's own code).

The engine plays the agents and the tasks: a started run reports RUNNING on every node at once; a run whose
work is done reports EXITED. A task checkpoints every ``checkpoint_interval_s`` of its run's progress (in
the background, as the paper's checkpoint manager does: no cost to training) and the checkpoint reaches the
scheduler as ``ReportCheckpoint`` would (``RunSnap.checkpoint_taken_at``). A suspended task acknowledges the
flag at once; then, when its last checkpoint is fresher than a save takes (``suspend_overhead_s``), it calls
go_suspend() at once and drops the steps since, else it saves in ``suspend_overhead_s`` and calls
go_suspend() (its work so far is kept). A run stopped or failed otherwise (a forced stop, a node or link
failure) goes back to its last durable checkpoint. A resumed or restarted run spends ``restart_overhead_s``
reloading before it progresses again. Optionally nodes and links fail as on Fire-Flyer 2 (``failures``).
Between events no decision can change, so the engine jumps from event to event and, at each, plans ticks
until nothing changes.

Node-time lost, per job and cause (preemption, failure): the work rolled back to the last checkpoint, the
time nodes are held while the task saves, and the reload of the next run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from ff_scheduler.core import priority
from ff_scheduler.core.model import (
    EndReason,
    Failure,
    FailureClass,
    NodePhase,
    NodeRunReport,
    NodeState,
    NodeView,
    RunSnap,
    RunState,
    Snapshot,
    SuspendStage,
    TaskSnap,
    TaskState,
)
from ff_scheduler.core.policy import LifecyclePolicy, SchedulingPolicy
from ff_scheduler.core.tick import TaskChange, TickPlan, plan_tick
from ff_scheduler.sim.failures import FailureArrivals, FailureKind, FailureModel
from ff_scheduler.sim.trace import Job

MAX_TICKS_PER_EVENT = 50


@dataclass(frozen=True, kw_only=True)
class SimConfig:
    """The simulated cluster and what suspending and resuming cost a job (seconds)."""

    num_nodes: int = 64
    num_zones: int = 1
    group: str = "default"
    suspend_overhead_s: float = 30.0
    restart_overhead_s: float = 60.0
    # A task's run checkpoints every this much progress (the paper: every 5 minutes); 0 = never.
    checkpoint_interval_s: float = 300.0
    # Node and link failures (None: none), drawn from ``failure_seed``.
    failures: FailureModel | None = None
    failure_seed: int = 1


@dataclass
class JobRecord:
    """What happened to one job."""

    job: Job
    # Work banked: what the current run started from (its durable state), or kept when it stopped.
    work_done_s: float = 0.0
    first_start_s: float | None = None
    end_s: float | None = None
    num_suspends: int = 0
    num_failures: int = 0
    held_node_s: float = 0.0
    lost_node_s: float = 0.0
    failure_lost_node_s: float = 0.0
    # The current run: when it began progressing (inf: it does not), when its suspend began (if it is
    # suspending), when its processes exit (if they are asked to), and the work it falls back to if its save
    # does not finish.
    progress_from_s: float = 0.0
    suspend_at_s: float | None = None
    exit_at_s: float | None = None
    fallback_work_s: float = 0.0
    # What the current run spends reloading before it progresses.
    reload_s: float = 0.0
    # Why the last run ended (what the next run's reload is charged to).
    last_end: EndReason = EndReason.NONE

    @property
    def remaining_s(self) -> float:
        """The job's work still to do, in seconds."""
        return max(0.0, self.job.duration_s - self.work_done_s)


@dataclass
class SimResult:
    """One policy's run over a trace: every job's record, the makespan (seconds) and what never finished."""

    policy_name: str
    num_nodes: int
    records: list[JobRecord]
    makespan_s: float
    num_ticks: int = 0
    unfinished: list[int] = field(default_factory=list)


class Simulation:
    """One policy over one trace."""

    def __init__(
        self, jobs: list[Job], sched: SchedulingPolicy, life: LifecyclePolicy, config: SimConfig, name: str = ""
    ) -> None:
        self.sched, self.life, self.config, self.name = sched, life, config, name
        self.jobs = sorted(jobs, key=lambda j: (j.submit_s, j.job_id))
        self.nodes = {
            i: NodeView(node_id=i, group=config.group, zone=f"z{i % config.num_zones}")
            for i in range(1, config.num_nodes + 1)
        }
        self.records = {j.job_id: JobRecord(j) for j in self.jobs}
        self.tasks: dict[int, TaskSnap] = {}
        self.now = 0.0
        self.num_ticks = 0
        self._next_arrival = 0
        self._run_ids = 0
        self._failures: FailureArrivals | None = None
        if config.failures is not None:
            self._failures = config.failures.arrivals(config.num_nodes, config.failure_seed)
        self._repairs: dict[int, float] = {}  # node id -> when it is back

    def run(self) -> SimResult:
        """Simulate the trace to its end: every job finished, or no event left that could change anything."""
        while True:
            self._admit()
            self._settle()
            upcoming = self._next_event()
            if upcoming is None:
                break
            self.now = upcoming
            self._fail_and_repair()
            self._agents()
        makespan = max((r.end_s or 0.0) for r in self.records.values()) if self.records else 0.0
        unfinished = [r.job.job_id for r in self.records.values() if r.end_s is None]
        return SimResult(
            self.name, self.config.num_nodes, list(self.records.values()), makespan, self.num_ticks, unfinished
        )

    # ---- events ----

    def _admit(self) -> None:
        while self._next_arrival < len(self.jobs) and self.jobs[self._next_arrival].submit_s <= self.now:
            job = self.jobs[self._next_arrival]
            self._next_arrival += 1
            self.tasks[job.job_id] = TaskSnap(
                task_id=job.job_id,
                user=job.user,
                group=self.config.group,
                num_nodes=job.num_nodes,
                priority=job.priority,
                asked_priority=job.priority,
                state=TaskState.QUEUED,
                fcfs=job.job_id,
                watchdog_time_s=0.0,
                # Failures restart the task from its checkpoint however often they come.
                max_restarts=1_000_000 if self._failures is not None else 0,
            )

    def _next_event(self) -> float | None:
        times: list[float] = []
        if self._next_arrival < len(self.jobs):
            times.append(self.jobs[self._next_arrival].submit_s)
        queued = any(t.run is None for t in self.tasks.values())
        for task in self.tasks.values():
            run, rec = task.run, self.records[task.task_id]
            if run is None:
                continue
            if rec.exit_at_s is not None:
                times.append(rec.exit_at_s)
            elif run.state in (RunState.STARTING, RunState.RUNNING):
                times.append(rec.progress_from_s + rec.remaining_s)
                if queued:
                    times.append(run.started_at + self.sched.min_run_time_s)
                if run.priority == priority.ABOVE_NORMAL:
                    times.append(run.started_at + self.sched.demote_after_s)
            if run.state is RunState.SUSPENDING:
                times += [run.suspend_requested_at + run.ack_window_s, run.suspend_received_at + run.grace_s]
        if self.tasks or self._next_arrival < len(self.jobs):
            times += self._repairs.values()
            if self._failures is not None and self._failures.next is not None:
                times.append(self._failures.next.at_s)
        future = [t for t in times if t > self.now + 1e-9]
        return min(future) if future else None

    def _fail_and_repair(self) -> None:
        """Nodes repaired by ``now`` come back; failures due by ``now`` happen."""
        for node_id, back_at in list(self._repairs.items()):
            if back_at <= self.now + 1e-9:
                del self._repairs[node_id]
                self.nodes[node_id] = replace(self.nodes[node_id], state=NodeState.READY)
        failures = self._failures
        while failures is not None and failures.next is not None and failures.next.at_s <= self.now + 1e-9:
            event = failures.next
            failures.advance()
            if event.kind is FailureKind.HARDWARE and event.node_id not in self._repairs:
                assert self.config.failures is not None
                self._repairs[event.node_id] = self.now + self.config.failures.repair_s
                self.nodes[event.node_id] = replace(self.nodes[event.node_id], state=NodeState.OFFLINE)
            elif event.kind is FailureKind.LINK:
                self._link_failed(event.node_id)

    def _link_failed(self, node_id: int) -> None:
        """The ranks on ``node_id`` lost their peers: the run there reports a failure (not the task's fault)."""
        for task in self.tasks.values():
            run = task.run
            if run is not None and node_id in run.node_ids and run.state in (RunState.STARTING, RunState.RUNNING):
                failure = Failure(
                    failure_class=FailureClass.INFRASTRUCTURE,
                    node_id=node_id,
                    failed_at=self.now,
                    message=f"link of node {node_id} flapped",
                )
                reports = dict(run.reports)
                reports[node_id] = NodeRunReport(phase=NodePhase.EXITED, last_output_at=self.now, failure=failure)
                self.tasks[task.task_id] = replace(task, run=replace(run, reports=reports))
                return

    def _agents(self) -> None:
        """What the agents report at ``now``: work done, saves finished, processes exited."""
        for task in self.tasks.values():
            run, rec = task.run, self.records[task.task_id]
            if run is None:
                continue
            if rec.exit_at_s is not None and rec.exit_at_s <= self.now + 1e-9:
                rec.exit_at_s = None
                stage = SuspendStage.CAN_SUSPEND if run.state is RunState.SUSPENDING else run.suspend_stage
                if run.state is RunState.SUSPENDING:
                    rec.fallback_work_s = rec.work_done_s  # its save (if it made one) is durable
                self._report(task, NodePhase.EXITED, suspend_stage=stage)
            elif (
                run.state in (RunState.STARTING, RunState.RUNNING) and self._work_done(rec) >= rec.job.duration_s - 1e-6
            ):
                self._report(task, NodePhase.EXITED)

    def _work_done(self, rec: JobRecord) -> float:
        return rec.work_done_s + max(0.0, self.now - rec.progress_from_s)

    def _durable_work(self, rec: JobRecord) -> float:
        """The work of the run's last checkpoint (of what it started from, before its first)."""
        interval = self.config.checkpoint_interval_s
        if interval <= 0 or rec.progress_from_s == math.inf:
            return rec.work_done_s
        done_this_run = max(0.0, self.now - rec.progress_from_s)
        return rec.work_done_s + math.floor(done_this_run / interval + 1e-9) * interval

    def _report(self, task: TaskSnap, phase: NodePhase, **changes: object) -> None:
        assert task.run is not None
        reports = {n: NodeRunReport(phase=phase, last_output_at=self.now) for n in task.run.node_ids}
        self.tasks[task.task_id] = replace(task, run=replace(task.run, reports=reports, **changes))  # type: ignore[arg-type]

    # ---- ticks ----

    def _settle(self) -> None:
        for _ in range(MAX_TICKS_PER_EVENT):
            self._report_checkpoints()
            snap = Snapshot(now=self.now, nodes=self.nodes, tasks=list(self.tasks.values()), quotas={})
            plan = plan_tick(snap, self.sched, self.life)
            self.num_ticks += 1
            if plan.empty:
                return
            self._apply(plan)
            self._agents()  # what the agents answer at once (processes that exit now)

    def _report_checkpoints(self) -> None:
        """Each progressing run's last checkpoint, as ReportCheckpoint would have told the scheduler."""
        for task_id, task in self.tasks.items():
            run, rec = task.run, self.records[task_id]
            if run is None or run.state is not RunState.RUNNING or rec.progress_from_s == math.inf:
                continue
            durable = self._durable_work(rec)
            if durable > rec.work_done_s:
                taken_at = rec.progress_from_s + (durable - rec.work_done_s)
                if taken_at != run.checkpoint_taken_at:
                    run = replace(run, checkpoint_taken_at=taken_at, checkpoint_committed_at=taken_at)
                    self.tasks[task_id] = replace(task, run=run)

    def _apply(self, plan: TickPlan) -> None:
        for change in plan.run_changes:
            task = self.tasks[change.task_id]
            run, rec = task.run, self.records[change.task_id]
            assert run is not None and run.state is change.expect
            if change.priority is not None:
                run = replace(run, priority=change.priority)
            if change.state is RunState.RUNNING and run.state is RunState.STARTING:
                run = replace(run, state=RunState.RUNNING, started_at=self.now)
            elif change.state is RunState.SUSPENDING:
                self._suspend(rec, len(run.node_ids))
                run = replace(
                    run,
                    state=RunState.SUSPENDING,
                    suspend_requested_at=self.now,
                    stop_reason=change.reason,
                    ack_window_s=change.ack_window_s,
                    grace_s=change.grace_s,
                    suspend_stage=SuspendStage.RECEIVED,
                    suspend_received_at=self.now,
                )
            elif change.state is RunState.STOPPING:
                self._halt(rec, len(run.node_ids), change.reason)
                rec.exit_at_s = self.now
                run = replace(run, state=RunState.STOPPING, stop_requested_at=self.now, stop_reason=change.reason)
            elif not change.state.active:
                if change.reason is not EndReason.COMPLETED:
                    self._halt(rec, len(run.node_ids), change.reason)
                self._ended(rec, run, change.reason)
                run = None
            self.tasks[change.task_id] = replace(task, run=run)
        for tc in plan.task_changes:
            self._task_change(tc)
        for start in plan.starts:
            self._start(start.task_id, start.node_ids, start.priority)

    def _suspend(self, rec: JobRecord, num_nodes: int) -> None:
        """The task read the flag: it drops the steps since a fresh checkpoint and goes, or saves first."""
        done, durable = self._work_done(rec), self._durable_work(rec)
        rec.progress_from_s = math.inf
        rec.suspend_at_s = self.now
        rec.fallback_work_s = durable
        if done - durable <= self.config.suspend_overhead_s:
            rec.work_done_s = durable
            rec.lost_node_s += (done - durable) * num_nodes
            rec.exit_at_s = self.now
        else:
            rec.work_done_s = done
            rec.exit_at_s = self.now + self.config.suspend_overhead_s

    def _halt(self, rec: JobRecord, num_nodes: int, reason: EndReason) -> None:
        """The run stops without a save of its own: its work goes back to its last durable checkpoint."""
        if rec.progress_from_s == math.inf and rec.suspend_at_s is None:
            return  # already halted
        if rec.suspend_at_s is not None:  # a save in progress does not finish
            done, durable = rec.work_done_s, rec.fallback_work_s
        else:
            done, durable = self._work_done(rec), self._durable_work(rec)
        rec.work_done_s = durable
        rec.progress_from_s = math.inf
        lost = (done - durable) * num_nodes
        if reason.requeues:
            rec.lost_node_s += lost
        else:
            rec.failure_lost_node_s += lost

    def _task_change(self, change: TaskChange) -> None:
        task_id, task = change.task_id, self.tasks[change.task_id]
        if change.state is not None:
            task = replace(task, state=change.state)
        if change.priority is not None:
            task = replace(task, priority=change.priority)
        if change.queue_reason is not None:
            task = replace(task, queue_reason=change.queue_reason)
        if change.num_restarts is not None:
            task = replace(task, num_restarts=change.num_restarts)
        if task.state.finished:
            del self.tasks[task_id]
        else:
            self.tasks[task_id] = task

    def _start(self, task_id: int, node_ids: tuple[int, ...], level: int) -> None:
        self._run_ids += 1
        rec = self.records[task_id]
        resumed = rec.first_start_s is not None
        if rec.first_start_s is None:
            rec.first_start_s = self.now
        rec.reload_s = self.config.restart_overhead_s if resumed else 0.0
        rec.progress_from_s = self.now + rec.reload_s
        reports = {n: NodeRunReport(phase=NodePhase.RUNNING, last_output_at=self.now) for n in node_ids}
        run = RunSnap(
            run_id=self._run_ids,
            task_id=task_id,
            state=RunState.STARTING,
            priority=level,
            node_ids=node_ids,
            created_at=self.now,
            started_at=self.now,
            reports=reports,
        )
        self.tasks[task_id] = replace(self.tasks[task_id], run=run, state=TaskState.RUNNING, priority=level)

    def _ended(self, rec: JobRecord, run: RunSnap, reason: EndReason) -> None:
        held_s = self.now - run.created_at
        rec.held_node_s += held_s * len(run.node_ids)
        # The reload (as far as it got) is charged to what ended the run before.
        reload_node_s = min(rec.reload_s, held_s) * len(run.node_ids)
        if rec.last_end.requeues:
            rec.lost_node_s += reload_node_s
        else:
            rec.failure_lost_node_s += reload_node_s
        rec.last_end = reason
        if reason.requeues:
            rec.num_suspends += 1
            rec.lost_node_s += (self.now - (rec.suspend_at_s or self.now)) * len(run.node_ids)
        elif reason is EndReason.COMPLETED:
            rec.end_s = self.now
        else:
            rec.num_failures += 1
            if rec.suspend_at_s is not None:
                rec.failure_lost_node_s += (self.now - rec.suspend_at_s) * len(run.node_ids)
        rec.suspend_at_s = rec.exit_at_s = None
