"""The tick's SQL: load the snapshot, apply the plan, and list the orders the agents should have.

The snapshot is the beater's; the plan is applied guarded by the states it was decided from; the orders are
what active runs want of each node.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, fields
from typing import Any

from sqlalchemy import CursorResult, and_, insert, select, update
from sqlalchemy.orm import Session

from ff_scheduler.core.lifecycle import RunChange
from ff_scheduler.core.model import (
    EndReason,
    Failure,
    FailureClass,
    NodePhase,
    NodeRunReport,
    NodeState,
    NodeView,
    QueueReason,
    RunSnap,
    RunState,
    Snapshot,
    SuspendStage,
    TaskSnap,
    TaskState,
)
from ff_scheduler.core.tick import TaskChange, TickPlan
from ff_scheduler.store.schema import nodes, quotas, run_nodes, runs, tasks

UNFINISHED = (int(TaskState.QUEUED), int(TaskState.RUNNING), int(TaskState.SUSPENDED))
ACTIVE = (int(RunState.STARTING), int(RunState.RUNNING), int(RunState.SUSPENDING), int(RunState.STOPPING))


def node_state(row: Any) -> NodeState:
    """A node row's state: offline without a lease, err when disabled or failing, else ready."""
    if not row.online:
        return NodeState.OFFLINE
    if row.disabled_reason or row.err_reason:
        return NodeState.ERR
    return NodeState.READY


_FAILURE_FIELDS = frozenset(f.name for f in fields(Failure))


def failure_from_json(data: dict[str, Any] | None) -> Failure | None:
    """A stored failure; keys of a newer version are ignored, missing ones (an older row) take their default."""
    if not data:
        return None
    known = {k: v for k, v in data.items() if k in _FAILURE_FIELDS}
    stored_class = data.get("failure_class", 0)
    failure_class = FailureClass(stored_class) if stored_class in iter(FailureClass) else FailureClass.UNSPECIFIED
    return Failure(**{**known, "failure_class": failure_class})


def failure_to_json(failure: Failure | None) -> dict[str, Any] | None:
    """A failure as stored in a JSON column (None stays None)."""
    if failure is None:
        return None
    return {
        "failure_class": int(failure.failure_class),
        "node_id": failure.node_id,
        "node_rank": failure.node_rank,
        "local_rank": failure.local_rank,
        "exit_code": failure.exit_code,
        "signal": failure.signal,
        "failed_at": failure.failed_at,
        "message": failure.message,
        "hang": failure.hang,
    }


def load_snapshot(s: Session, now: float) -> Snapshot:
    """Everything one tick decides from, read in the tick's transaction."""
    views = {
        r.node_id: NodeView(
            node_id=r.node_id, group=r.node_group, zone=r.zone, state=node_state(r), num_failures=r.num_failures
        )
        for r in s.execute(
            select(
                nodes.c.node_id,
                nodes.c.node_group,
                nodes.c.zone,
                nodes.c.online,
                nodes.c.disabled_reason,
                nodes.c.err_reason,
                nodes.c.num_failures,
            )
        )
    }
    reports: dict[int, dict[int, NodeRunReport]] = defaultdict(dict)
    active_runs = select(runs.c.run_id).where(runs.c.state.in_(ACTIVE))
    for r in s.execute(select(run_nodes).where(run_nodes.c.run_id.in_(active_runs))):
        reports[r.run_id][r.node_id] = NodeRunReport(
            phase=NodePhase(r.phase), last_output_at=r.last_output_at, failure=failure_from_json(r.failure)
        )
    run_by_task = {
        r.task_id: _run_snap(r, reports[r.run_id]) for r in s.execute(select(runs).where(runs.c.state.in_(ACTIVE)))
    }
    cols = (
        tasks.c.task_id,
        tasks.c.user_name,
        tasks.c.node_group,
        tasks.c.num_nodes,
        tasks.c.priority,
        tasks.c.asked_priority,
        tasks.c.state,
        tasks.c.queue_reason,
        tasks.c.watchdog_time_s,
        tasks.c.max_restarts,
        tasks.c.num_restarts,
        tasks.c.suspend_grace_s,
    )
    snaps = [
        TaskSnap(
            task_id=r.task_id,
            user=r.user_name,
            group=r.node_group,
            num_nodes=r.num_nodes,
            priority=r.priority,
            asked_priority=r.asked_priority,
            state=TaskState(r.state),
            fcfs=r.task_id,
            queue_reason=QueueReason(r.queue_reason),
            watchdog_time_s=r.watchdog_time_s,
            max_restarts=r.max_restarts,
            num_restarts=r.num_restarts,
            suspend_grace_s=r.suspend_grace_s,
            run=run_by_task.get(r.task_id),
        )
        for r in s.execute(select(*cols).where(tasks.c.state.in_(UNFINISHED)))
    ]
    quota_map = {(r.user_name, r.priority, r.node_group): r.max_nodes for r in s.execute(select(quotas))}
    return Snapshot(now=now, nodes=views, tasks=snaps, quotas=quota_map)


def _run_snap(r: Any, reports: dict[int, NodeRunReport]) -> RunSnap:
    return RunSnap(
        run_id=r.run_id,
        task_id=r.task_id,
        state=RunState(r.state),
        priority=r.priority,
        node_ids=tuple(r.node_ids),
        created_at=r.created_at,
        started_at=r.started_at,
        suspend_stage=SuspendStage(r.suspend_stage),
        suspend_requested_at=r.suspend_requested_at,
        suspend_received_at=r.suspend_received_at,
        stop_requested_at=r.stop_requested_at,
        stop_reason=EndReason(r.stop_reason),
        stop_message=r.end_message,
        ack_window_s=r.ack_window_s,
        grace_s=r.grace_s,
        checkpoint_committed_at=float((r.checkpoint or {}).get("committed_at", 0.0)),
        checkpoint_taken_at=float((r.checkpoint or {}).get("taken_at", 0.0)),
        reports=reports,
        failure=failure_from_json(r.failure),
    )


def apply_run_change(s: Session, change: RunChange, now: float) -> bool:
    """One guarded run transition; False when the run is no longer in the state it was decided from."""
    values: dict[str, Any] = {}
    if change.priority is not None:
        values["priority"] = change.priority
    if change.state is not change.expect:
        values["state"] = int(change.state)
    if change.state is RunState.RUNNING and change.expect is RunState.STARTING:
        values["started_at"] = now
    elif change.state is RunState.SUSPENDING:
        values.update(
            suspend_stage=int(SuspendStage.SENT),
            suspend_requested_at=now,
            stop_reason=int(change.reason),
            ack_window_s=change.ack_window_s,
            grace_s=change.grace_s,
            end_message=change.message,
        )
    elif change.state is RunState.STOPPING:
        values.update(stop_requested_at=now, stop_reason=int(change.reason), end_message=change.message)
        if change.failure is not None:
            values["failure"] = failure_to_json(change.failure)
    elif not change.state.active:
        values.update(ended_at=now, end_reason=int(change.reason), end_message=change.message)
        if change.failure is not None:
            values["failure"] = failure_to_json(change.failure)
    guard = and_(runs.c.run_id == change.run_id, runs.c.state == int(change.expect))
    result: CursorResult[Any] = s.execute(update(runs).where(guard).values(**values))  # type: ignore[assignment]
    return bool(result.rowcount)


def _apply_task_change(s: Session, change: TaskChange, now: float) -> None:
    """Store one task's change from the plan."""
    values: dict[str, Any] = {}
    if change.state is not None:
        values["state"] = int(change.state)
        if change.state.finished:
            values["finished_at"] = now
    if change.priority is not None:
        values["priority"] = change.priority
    if change.queue_reason is not None:
        values["queue_reason"] = int(change.queue_reason)
    if change.num_restarts is not None:
        values["num_restarts"] = change.num_restarts
    if change.end_reason is not None:
        values["end_reason"] = int(change.end_reason)
    if change.end_message is not None:
        values["end_message"] = change.end_message[:1024]
    if values:
        s.execute(update(tasks).where(tasks.c.task_id == change.task_id).values(**values))


@dataclass
class Applied:
    """What ``apply_plan`` stored; ``skipped``: tasks whose run changed since the snapshot (decided next tick)."""

    num_started: int = 0
    num_run_changes: int = 0
    skipped: list[int] = field(default_factory=list)


def apply_plan(s: Session, plan: TickPlan, now: float, master_port: int) -> Applied:
    """Store a tick's plan; a run change whose run moved on since the snapshot is skipped with its task's changes."""
    applied = Applied()
    for change in plan.run_changes:
        if apply_run_change(s, change, now):
            applied.num_run_changes += 1
        else:
            applied.skipped.append(change.task_id)
    skipped = set(applied.skipped)
    for tc in plan.task_changes:
        if tc.task_id not in skipped:
            _apply_task_change(s, tc, now)
    for verdict in plan.node_verdicts:
        values: dict[str, Any] = {"num_failures": verdict.num_failures}
        if verdict.err_reason:
            values["err_reason"] = verdict.err_reason[:512]
        s.execute(update(nodes).where(nodes.c.node_id == verdict.node_id).values(**values))
    for start in plan.starts:
        if _start_run(s, start.task_id, start.node_ids, start.priority, now, master_port):
            applied.num_started += 1
    return applied


def _start_run(s: Session, task_id: int, node_ids: tuple[int, ...], level: int, now: float, master_port: int) -> bool:
    task = s.execute(
        select(tasks.c.state, tasks.c.num_runs, tasks.c.whole_life_state, tasks.c.first_started_at).where(
            tasks.c.task_id == task_id
        )
    ).one()
    if task.state not in (int(TaskState.QUEUED), int(TaskState.RUNNING), int(TaskState.SUSPENDED)):
        return False
    master_ip = s.execute(select(nodes.c.master_ip).where(nodes.c.node_id == node_ids[0])).scalar_one()
    inserted: CursorResult[Any] = s.execute(
        insert(runs).values(
            task_id=task_id,
            run_index=task.num_runs,
            state=int(RunState.STARTING),
            priority=level,
            node_ids=list(node_ids),
            master_address=f"{master_ip}:{master_port}",
            start_whole_life_state=task.whole_life_state,
            suspend_stage=int(SuspendStage.NONE),
            suspend_requested_at=0.0,
            suspend_received_at=0.0,
            stop_requested_at=0.0,
            stop_reason=0,
            ack_window_s=0.0,
            grace_s=0.0,
            created_at=now,
            started_at=0.0,
            ended_at=0.0,
            end_reason=0,
            end_message="",
            failure=None,
            checkpoint=None,
        )
    )  # type: ignore[assignment]
    run_id = inserted.inserted_primary_key[0]  # type: ignore[index]
    s.execute(
        insert(run_nodes),
        [
            {
                "run_id": run_id,
                "node_id": n,
                "node_rank": rank,
                "phase": int(NodePhase.UNKNOWN),
                "last_output_at": 0.0,
                "reported_at": 0.0,
                "failure": None,
            }
            for rank, n in enumerate(node_ids)
        ],
    )
    s.execute(
        update(tasks)
        .where(tasks.c.task_id == task_id)
        .values(
            state=int(TaskState.RUNNING),
            num_runs=task.num_runs + 1,
            priority=level,
            first_started_at=task.first_started_at or now,
            queue_reason=int(QueueReason.NONE),
        )
    )
    return True


@dataclass(frozen=True)
class NodeOrder:
    """What one node of an active run should be doing, and how to reach its agent."""

    run_id: int
    task_id: int
    run_state: RunState
    node_id: int
    node_rank: int
    phase: NodePhase
    agent_address: str
    online: bool


def wanted_orders(s: Session) -> list[NodeOrder]:
    """Every node of every active run with what the run wants of it, for the driver's reconciliation."""
    query = (
        select(
            runs.c.run_id,
            runs.c.task_id,
            runs.c.state,
            run_nodes.c.node_id,
            run_nodes.c.node_rank,
            run_nodes.c.phase,
            nodes.c.agent_address,
            nodes.c.online,
        )
        .join(run_nodes, run_nodes.c.run_id == runs.c.run_id)
        .join(nodes, nodes.c.node_id == run_nodes.c.node_id)
        .where(runs.c.state.in_(ACTIVE))
    )
    return [
        NodeOrder(
            r.run_id,
            r.task_id,
            RunState(r.state),
            r.node_id,
            r.node_rank,
            NodePhase(r.phase),
            r.agent_address,
            r.online,
        )
        for r in s.execute(query)
    ]
