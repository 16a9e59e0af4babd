"""One scheduling tick as pure code: beater (run lifecycle, demotion) -> assigner -> matcher -> plan.

``plan_tick(snapshot)`` answers what to change; the service's driver applies the plan in one
transaction (each change guarded by the state it was decided from) and then sends the agents their
orders; the simulator applies it to its own model. Nodes of runs that end in this tick are only free
for the next one.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ff_scheduler.core import priority
from ff_scheduler.core.assigner import Verdict, assign
from ff_scheduler.core.lifecycle import NodeVerdict, RunChange, request_suspend, step_run, task_outcome
from ff_scheduler.core.matcher import MatchResult, Start, match
from ff_scheduler.core.model import EndReason, QueueReason, RunState, Snapshot, TaskSnap, TaskState
from ff_scheduler.core.policy import LifecyclePolicy, SchedulingPolicy


@dataclass(kw_only=True, slots=True)
class TaskChange:
    """New values for a task (None: unchanged); not frozen: the first tick makes one per queued task."""

    task_id: int
    state: TaskState | None = None
    priority: int | None = None
    queue_reason: QueueReason | None = None
    num_restarts: int | None = None
    end_reason: EndReason | None = None
    end_message: str | None = None


@dataclass
class TickPlan:
    """Everything one tick decided, for the driver to store and carry out."""

    run_changes: list[RunChange] = field(default_factory=list)
    task_changes: list[TaskChange] = field(default_factory=list)
    starts: list[Start] = field(default_factory=list)
    node_verdicts: list[NodeVerdict] = field(default_factory=list)
    match: MatchResult | None = None

    @property
    def empty(self) -> bool:
        """Nothing to store or do."""
        return not (self.run_changes or self.task_changes or self.starts or self.node_verdicts)


def plan_tick(snap: Snapshot, sched: SchedulingPolicy, life: LifecyclePolicy) -> TickPlan:
    """One scheduling tick, pure: advance every run's lifecycle, then match queued tasks to free nodes.

    The service's driver (``app.Scheduler.tick``) loads the snapshot, plans and applies the plan in one
    transaction; the simulator (``sim.engine``) runs the same function.
    """
    plan = TickPlan()
    schedulable: list[TaskSnap] = []
    for task in snap.tasks:
        if task.state in _FINISHED:
            continue
        schedulable.append(_beat_run(task, snap, life, sched, plan) if task.run is not None else task)
    verdicts = assign(schedulable, snap.quotas, enforce=sched.enforce_quotas)
    result = match(schedulable, verdicts, snap.nodes, sched, snap.now)
    plan.match = result
    plan.starts = result.starts
    by_id = {t.task_id: t for t in schedulable} if result.preemptions else {}
    for pre in result.preemptions:
        victim = by_id[pre.task_id]
        assert victim.run is not None
        change = request_suspend(victim.run, EndReason.PREEMPTED, life, victim.suspend_grace_s)
        if change is not None:
            plan.run_changes.append(replace(change, message=f"preempted for task {pre.for_task_id}"))
    _queue_changes(schedulable, result, verdicts, plan)
    return plan


_FINISHED = frozenset(s for s in TaskState if s.finished)


def _beat_run(
    task: TaskSnap, snap: Snapshot, life: LifecyclePolicy, sched: SchedulingPolicy, plan: TickPlan
) -> TaskSnap:
    """Advance the task's run; returns the task as the assigner and matcher should see it."""
    run = task.run
    assert run is not None
    step = step_run(task, snap.nodes, snap.now, life)
    plan.node_verdicts += step.node_verdicts
    change = step.change
    if change is None and run.state is RunState.RUNNING:
        level = priority.demoted(run.priority, snap.now - run.started_at, sched.demote_after_s)
        if level != run.priority:
            message = f"{priority.name(run.priority)} demoted to {priority.name(level)}"
            plan.run_changes.append(
                RunChange(
                    run_id=run.run_id,
                    task_id=task.task_id,
                    expect=run.state,
                    state=run.state,
                    priority=level,
                    message=message,
                )
            )
            plan.task_changes.append(TaskChange(task_id=task.task_id, priority=level))
            return replace(task, priority=level, run=replace(run, priority=level))
        return task
    if change is None:
        return task
    plan.run_changes.append(change)
    if change.state.active:
        return replace(task, run=replace(run, state=change.state))
    outcome = task_outcome(task, change.reason)
    plan.task_changes.append(
        TaskChange(
            task_id=task.task_id,
            state=outcome.state,
            num_restarts=outcome.num_restarts,
            end_reason=change.reason,
            end_message=_join(outcome.message, change.message),
            queue_reason=QueueReason.NONE,
        )
    )
    # Its nodes free up for the next tick; this tick they count as being freed.
    return replace(task, state=outcome.state, run=replace(run, state=RunState.STOPPING))


def _queue_changes(tasks: list[TaskSnap], result: MatchResult, verdicts: dict[int, Verdict], plan: TickPlan) -> None:
    """The changes of the queued tasks: started, or why they wait and (AUTO) at which level.

    One pass over what may be 100,000 tasks, so the loop keeps to locals.
    """
    started = {s.task_id: s for s in result.starts}
    waiting = result.waiting
    changes = plan.task_changes
    for task in tasks:
        if task.run is not None:
            continue
        task_id = task.task_id
        start = started.get(task_id)
        if start is not None:
            changes.append(
                TaskChange(
                    task_id=task_id, state=TaskState.RUNNING, priority=start.priority, queue_reason=QueueReason.NONE
                )
            )
            continue
        reason = waiting.get(task_id) or QueueReason.WAITING_FOR_NODES
        new_priority = None
        if task.asked_priority is None:  # AUTO: the level the assigner picked
            level = verdicts[task_id].priority
            if level is not None and level != task.priority:
                new_priority = level
        if reason != task.queue_reason or new_priority is not None:
            changes.append(TaskChange(task_id=task_id, queue_reason=reason, priority=new_priority))


def _join(*parts: str) -> str:
    return ": ".join(p for p in parts if p)
