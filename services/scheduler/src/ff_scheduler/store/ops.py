"""The scheduler's state changes and reads for users, admins and agents: one function per transaction.

Each takes the session first and is safe to re-run (``ff_store.Store.run`` may retry it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import CursorResult, and_, delete, func, insert, select, update
from sqlalchemy.orm import Session

from ff_scheduler.core.errors import Conflict, InvalidRequest, NotFoundError
from ff_scheduler.core.lifecycle import request_stop, request_suspend
from ff_scheduler.core.model import EndReason, NodePhase, QueueReason, RunState, SuspendStage, TaskState
from ff_scheduler.core.policy import LifecyclePolicy
from ff_scheduler.core.validation import CheckedTask
from ff_scheduler.store.schema import nodes, quotas, run_nodes, runs, tasks
from ff_scheduler.store.ticks import ACTIVE, _run_snap, failure_to_json, node_state, note_changed


@dataclass(frozen=True)
class TaskView:
    """A task row with its current run (and optionally all runs)."""

    task: Any
    run: Any | None
    run_nodes: list[Any]
    runs: list[Any]


# ---- tasks ----


def _known_groups(s: Session, default_group: str) -> set[str]:
    """The default group and every group a registered node is in."""
    return {default_group, *s.execute(select(nodes.c.node_group).distinct()).scalars()}


def _check_fits(s: Session, checked: CheckedTask) -> None:
    """Conflict for a task that can never run: more nodes than its group has.

    Every registered node counts, offline or disabled ones too, as they may come back. A group with no node
    yet accepts any task, since its agents may not have registered yet.
    """
    in_group = select(func.count()).select_from(nodes).where(nodes.c.node_group == checked.node_group)
    num_known = int(s.execute(in_group).scalar_one())
    if 0 < num_known < checked.num_nodes:
        raise Conflict(
            f"the task asks for {checked.num_nodes} nodes, but node group {checked.node_group!r} has "
            f"{num_known}: it could never run"
        )


def submit_task(
    s: Session, user: str, uid: int, checked: CheckedTask, request_id: str, now: float, default_group: str
) -> int:
    """Store a checked task as queued; returns its id (a retry with the same ``request_id`` returns the first's).

    Raises:
        InvalidRequest: the node group is unknown.
        Conflict: the task asks for more nodes than its group has.
    """
    if request_id:
        existing = s.execute(
            select(tasks.c.task_id).where(and_(tasks.c.user_name == user, tasks.c.request_id == request_id))
        ).scalar()
        if existing is not None:
            return int(existing)
    if checked.node_group not in _known_groups(s, default_group):
        raise InvalidRequest(f"node group {checked.node_group!r} is unknown")
    _check_fits(s, checked)
    result: CursorResult[Any] = s.execute(
        insert(tasks).values(
            user_name=user,
            uid=uid,
            request_id=request_id or None,
            name=checked.name,
            spec=checked.spec,
            num_nodes=checked.num_nodes,
            asked_priority=checked.asked_priority,
            priority=checked.asked_priority,
            node_group=checked.node_group,
            state=int(TaskState.QUEUED),
            queue_reason=int(QueueReason.NONE),
            whole_life_state=checked.whole_life_state,
            watchdog_time_s=checked.watchdog_time_s,
            max_restarts=checked.max_restarts,
            suspend_grace_s=checked.suspend_grace_s,
            num_runs=0,
            num_restarts=0,
            created_at=now,
            first_started_at=0.0,
            finished_at=0.0,
            end_reason=0,
            end_message="",
        )
    )  # type: ignore[assignment]
    task_id = int(result.inserted_primary_key[0])  # type: ignore[index]
    note_changed(s, task_id)
    return task_id


def _task_row(s: Session, task_id: int, owner: str | None) -> Any:
    row = s.execute(select(tasks).where(tasks.c.task_id == task_id)).first()
    if row is None or (owner is not None and row.user_name != owner):
        raise NotFoundError(f"task {task_id} not found")
    return row


def _active_run(s: Session, task_id: int) -> Any | None:
    return s.execute(select(runs).where(and_(runs.c.task_id == task_id, runs.c.state.in_(ACTIVE)))).first()


def get_task(s: Session, task_id: int, owner: str | None, include_runs: bool = False) -> TaskView:
    """``owner`` None: any user's (admins)."""
    row = _task_row(s, task_id, owner)
    return _view(s, row, include_runs)


def _view(s: Session, row: Any, include_runs: bool) -> TaskView:
    run = s.execute(select(runs).where(runs.c.task_id == row.task_id).order_by(runs.c.run_id.desc()).limit(1)).first()
    nodes_of_run = list(s.execute(select(run_nodes).where(run_nodes.c.run_id == run.run_id))) if run else []
    all_runs = (
        list(s.execute(select(runs).where(runs.c.task_id == row.task_id).order_by(runs.c.run_id)))
        if include_runs
        else []
    )
    return TaskView(row, run, nodes_of_run, all_runs)


def list_tasks(
    s: Session, owner: str | None, states: Sequence[int], name_contains: str, limit: int, before_task_id: int
) -> list[TaskView]:
    """A page of tasks, newest first, below ``before_task_id`` (0: from the newest); ``owner`` None: anyone's."""
    query = select(tasks).order_by(tasks.c.task_id.desc()).limit(limit)
    if owner is not None:
        query = query.where(tasks.c.user_name == owner)
    if states:
        query = query.where(tasks.c.state.in_(list(states)))
    if name_contains:
        query = query.where(tasks.c.name.contains(name_contains, autoescape=True))
    if before_task_id:
        query = query.where(tasks.c.task_id < before_task_id)
    return [_view(s, row, False) for row in s.execute(query)]


def stop_task(s: Session, task_id: int, owner: str | None, caller: str, now: float) -> None:
    """Stop a task: a queued one ends now, a running one's run is asked to stop (a finished one: nothing).

    Raises:
        NotFoundError: no such task (of ``owner``, when given).
    """
    row = _task_row(s, task_id, owner)
    reason = EndReason.STOPPED_BY_USER if row.user_name == caller else EndReason.STOPPED_BY_ADMIN
    if TaskState(row.state).finished:
        return
    run = _active_run(s, task_id)
    if run is None:
        s.execute(
            update(tasks)
            .where(tasks.c.task_id == task_id)
            .values(
                state=int(TaskState.STOPPED),
                finished_at=now,
                end_reason=int(reason),
                end_message="stopped while queued",
                queue_reason=int(QueueReason.NONE),
            )
        )
        note_changed(s, task_id)
        return
    who = "its user" if reason is EndReason.STOPPED_BY_USER else f"admin {caller}"
    change = request_stop(_run_snap(run, {}), reason, f"stopped by {who}")
    if change is not None:
        s.execute(
            update(runs)
            .where(runs.c.run_id == run.run_id)
            .values(
                state=int(RunState.STOPPING), stop_requested_at=now, stop_reason=int(reason), end_message=change.message
            )
        )


def suspend_task(
    s: Session, task_id: int, owner: str | None, reason: EndReason, policy: LifecyclePolicy, now: float
) -> bool:
    """Start the suspend protocol on the task's run; False when it is not running."""
    row = _task_row(s, task_id, owner)
    run = _active_run(s, task_id)
    if run is None:
        return False
    change = request_suspend(_run_snap(run, {}), reason, policy, row.suspend_grace_s)
    if change is None:
        return False
    s.execute(
        update(runs)
        .where(runs.c.run_id == run.run_id)
        .values(
            state=int(RunState.SUSPENDING),
            suspend_stage=int(SuspendStage.SENT),
            suspend_requested_at=now,
            stop_reason=int(reason),
            ack_window_s=change.ack_window_s,
            grace_s=change.grace_s,
            end_message=change.message,
        )
    )
    return True


def set_task_priority(s: Session, task_id: int, owner: str | None, asked: int | None) -> None:
    """Change the priority a task asks for (None: AUTO); a running task's run keeps its level until it ends.

    Raises:
        NotFoundError: no such task (of ``owner``, when given).
        InvalidRequest: the task has finished.
    """
    row = _task_row(s, task_id, owner)
    if TaskState(row.state).finished:
        raise InvalidRequest(f"task {task_id} has finished")
    values: dict[str, Any] = {"asked_priority": asked}
    if row.state != int(TaskState.RUNNING):
        values["priority"] = asked
    s.execute(update(tasks).where(tasks.c.task_id == task_id).values(**values))
    note_changed(s, task_id)


def counts(s: Session, user: str) -> tuple[int, int]:
    """The user's numbers of running and of queued (or suspended) tasks."""

    def count(states: Sequence[int]) -> int:
        q = select(func.count()).select_from(tasks).where(and_(tasks.c.user_name == user, tasks.c.state.in_(states)))
        return int(s.execute(q).scalar_one())

    return count([int(TaskState.RUNNING)]), count([int(TaskState.QUEUED), int(TaskState.SUSPENDED)])


# ---- quotas ----


def set_quota(s: Session, user: str, level: int, group: str, max_nodes: int) -> None:
    """Set a user's node quota at a priority level in a group; 0 removes it."""
    key = and_(quotas.c.user_name == user, quotas.c.priority == level, quotas.c.node_group == group)
    s.execute(delete(quotas).where(key))
    if max_nodes > 0:
        s.execute(insert(quotas).values(user_name=user, priority=level, node_group=group, max_nodes=max_nodes))


def list_quotas(s: Session, user: str | None) -> list[tuple[Any, int]]:
    """Quota rows with the nodes the user's active runs hold at that (priority, group)."""
    q = select(quotas).order_by(quotas.c.user_name, quotas.c.node_group, quotas.c.priority.desc())
    if user:
        q = q.where(quotas.c.user_name == user)
    used: dict[tuple[str, int, str], int] = {}
    usage_q = (
        select(tasks.c.user_name, runs.c.priority, tasks.c.node_group, tasks.c.num_nodes)
        .join(runs, runs.c.task_id == tasks.c.task_id)
        .where(runs.c.state.in_(ACTIVE))
    )
    for r in s.execute(usage_q):
        key = (r.user_name, r.priority, r.node_group)
        used[key] = used.get(key, 0) + r.num_nodes
    return [(r, used.get((r.user_name, r.priority, r.node_group), 0)) for r in s.execute(q)]


# ---- nodes ----


def list_nodes(s: Session, group: str, states: Sequence[int]) -> list[tuple[Any, list[int]]]:
    """Node rows (of ``group``, in ``states``; empty: all) with the tasks whose active runs are on each."""
    on_node: dict[int, list[int]] = {}
    for r in s.execute(select(runs.c.task_id, runs.c.node_ids).where(runs.c.state.in_(ACTIVE))):
        for n in r.node_ids:
            on_node.setdefault(n, []).append(r.task_id)
    q = select(nodes).order_by(nodes.c.node_id)
    if group:
        q = q.where(nodes.c.node_group == group)
    rows = [r for r in s.execute(q) if not states or int(node_state(r)) in states]
    return [(r, on_node.get(r.node_id, [])) for r in rows]


def get_node(s: Session, node_id: int) -> tuple[Any, list[int]]:
    """One node's row and the tasks on it; NotFoundError when it never registered."""
    found = [n for n in list_nodes(s, "", []) if n[0].node_id == node_id]
    if not found:
        raise NotFoundError(f"node {node_id} is not registered with the scheduler")
    return found[0]


def set_node_enabled(s: Session, node_id: int, enabled: bool, reason: str, policy: LifecyclePolicy, now: float) -> None:
    """Disable: the node goes to err_nodes and its runs are suspended (they queue again elsewhere)."""
    get_node(s, node_id)
    values = (
        {"disabled_reason": "", "err_reason": "", "num_failures": 0}
        if enabled
        else {"disabled_reason": (reason or "disabled by an admin")[:512]}
    )
    s.execute(update(nodes).where(nodes.c.node_id == node_id).values(**values))
    if enabled:
        return
    for run in s.execute(select(runs).where(runs.c.state.in_(ACTIVE))).all():
        if node_id in run.node_ids:
            suspend_task(s, run.task_id, None, EndReason.PREEMPTED, policy, now)


def register_node(
    s: Session, values: dict[str, Any], reported: list[tuple[int, int]], now: float
) -> list[tuple[int, int]]:
    """Upsert the node (it is online again); the runs it reports that it should not have."""
    node_id = values["node_id"]
    exists = s.execute(select(nodes.c.node_id).where(nodes.c.node_id == node_id)).first() is not None
    if exists:
        s.execute(update(nodes).where(nodes.c.node_id == node_id).values(**values, online=True, last_report_at=now))
    else:
        s.execute(
            insert(nodes).values(
                **values,
                online=True,
                disabled_reason="",
                err_reason="",
                num_failures=0,
                registered_at=now,
                last_report_at=now,
                validation=None,
            )
        )
    return _unwanted_runs(s, node_id, reported)


def _unwanted_runs(s: Session, node_id: int, reported: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The reported ``(task_id, run_id)`` pairs that are not active runs on ``node_id``: the agent stops them."""
    if not reported:
        return []
    wanted = {
        r.run_id
        for r in s.execute(
            select(run_nodes.c.run_id)
            .join(runs, runs.c.run_id == run_nodes.c.run_id)
            .where(and_(run_nodes.c.node_id == node_id, runs.c.state.in_(ACTIVE)))
        )
    }
    return [(task_id, run_id) for task_id, run_id in reported if run_id not in wanted]


def set_online(s: Session, alive: set[int], dead: set[int]) -> list[int]:
    """Follow mgmtd's leases: nodes it declared dead go offline, alive ones come back. The changed ids."""
    changed = []
    for r in s.execute(select(nodes.c.node_id, nodes.c.online)):
        if r.online and r.node_id in dead:
            changed.append(r.node_id)
            s.execute(update(nodes).where(nodes.c.node_id == r.node_id).values(online=False))
        elif not r.online and r.node_id in alive:
            changed.append(r.node_id)
            s.execute(update(nodes).where(nodes.c.node_id == r.node_id).values(online=True))
    return changed


def node_ids_not_in(s: Session, node_ids: set[int]) -> list[int]:
    """The registered nodes whose ids are not in ``node_ids`` (those mgmtd's routing lists)."""
    return sorted(n for n in s.execute(select(nodes.c.node_id)).scalars() if n not in node_ids)


def forget_nodes(s: Session, node_ids: Sequence[int]) -> dict[int, list[int]]:
    """Forget nodes mgmtd removed: they are no longer listed nor placed on. Returns the tasks each had runs of.

    A run still on one sees its node gone at the next tick, as a node lost (``core.lifecycle``): it stops and
    queues again (``fireflyer leave`` drains a node before mgmtd removes it, so normally none is left).
    """
    had: dict[int, list[int]] = {}
    for node_id in node_ids:
        if s.execute(select(nodes.c.node_id).where(nodes.c.node_id == node_id)).first() is None:
            continue
        active = s.execute(select(runs.c.task_id, runs.c.node_ids).where(runs.c.state.in_(ACTIVE))).all()
        had[node_id] = sorted(r.task_id for r in active if node_id in r.node_ids)
        s.execute(delete(nodes).where(nodes.c.node_id == node_id))
    return had


# ---- agent reports ----


@dataclass(frozen=True, kw_only=True)
class NodeRunFacts:
    """What an agent reported of one run on its node (from ``wire.run_facts``)."""

    task_id: int
    run_id: int
    phase: NodePhase
    last_output_at: float
    failure: Any | None  # core.model.Failure


def report_runs(s: Session, node_id: int, facts: list[NodeRunFacts], now: float) -> list[tuple[int, int]]:
    """Store an agent's run reports (a phase never goes back); returns the reported runs it should not have."""
    s.execute(update(nodes).where(nodes.c.node_id == node_id).values(last_report_at=now))
    unwanted = set(_unwanted_runs(s, node_id, [(f.task_id, f.run_id) for f in facts]))
    for f in facts:
        if (f.task_id, f.run_id) in unwanted:
            continue
        key = and_(run_nodes.c.run_id == f.run_id, run_nodes.c.node_id == node_id)
        old = s.execute(select(run_nodes.c.phase, run_nodes.c.last_output_at, run_nodes.c.failure).where(key)).one()
        values: dict[str, Any] = {
            "phase": max(old.phase, int(f.phase)),
            "reported_at": now,
            "last_output_at": max(old.last_output_at, f.last_output_at),
        }
        if f.failure is not None and old.failure is None:
            values["failure"] = failure_to_json(f.failure)
        s.execute(update(run_nodes).where(key).values(**values))
    return sorted(unwanted)


def _run_of_node(s: Session, node_id: int, task_id: int, run_id: int) -> Any:
    run = s.execute(select(runs).where(and_(runs.c.run_id == run_id, runs.c.task_id == task_id))).first()
    if run is None or node_id not in run.node_ids:
        raise NotFoundError(f"run {run_id} of task {task_id} is not on node {node_id}")
    return run


def report_suspend_stage(
    s: Session, node_id: int, task_id: int, run_id: int, stage: SuspendStage, at: float, policy: LifecyclePolicy
) -> None:
    """Store how far a run's suspend got on a node; go_suspend() without a pending suspend suspends the task.

    Raises:
        NotFoundError: the run is not on ``node_id``.
    """
    run = _run_of_node(s, node_id, task_id, run_id)
    if not RunState(run.state).active:
        return
    if run.state in (int(RunState.STARTING), int(RunState.RUNNING)):
        if stage is not SuspendStage.CAN_SUSPEND:
            return  # an acknowledgement of no suspend: nothing to do
        # go_suspend() without a suspend pending: the task asks to be suspended (and queued again) now.
        suspend_task(s, task_id, None, EndReason.SUSPENDED_BY_USER, policy, at)
    values: dict[str, Any] = {"suspend_stage": int(stage)}
    if stage is SuspendStage.RECEIVED and not run.suspend_received_at:
        values["suspend_received_at"] = at
    s.execute(update(runs).where(and_(runs.c.run_id == run_id, runs.c.suspend_stage < int(stage))).values(**values))


def task_uid_of_run(s: Session, node_id: int, task_id: int, run_id: int) -> int:
    """The uid of the user whose task this run on ``node_id`` is."""
    _run_of_node(s, node_id, task_id, run_id)
    return int(s.execute(select(tasks.c.uid).where(tasks.c.task_id == task_id)).scalar_one())


def report_checkpoint(s: Session, node_id: int, task_id: int, run_id: int, checkpoint: dict[str, Any]) -> None:
    """Record the run's latest committed checkpoint; NotFoundError when the run is not on ``node_id``."""
    _run_of_node(s, node_id, task_id, run_id)
    s.execute(update(runs).where(runs.c.run_id == run_id).values(checkpoint=checkpoint))


def update_run(
    s: Session, node_id: int, task_id: int, run_id: int, whole_life_state: int | None, watchdog_time_s: float | None
) -> None:
    """Store what the task changed through the SDK (None: unchanged); NotFoundError if the run is not on the node."""
    _run_of_node(s, node_id, task_id, run_id)
    values: dict[str, Any] = {}
    if whole_life_state is not None:
        values["whole_life_state"] = whole_life_state
    if watchdog_time_s is not None:
        values["watchdog_time_s"] = watchdog_time_s
    if values:
        s.execute(update(tasks).where(tasks.c.task_id == task_id).values(**values))
        note_changed(s, task_id)


def report_node_health(s: Session, node_id: int, validation: dict[str, Any]) -> None:
    """Store a validation: a failed one puts the node in err_nodes; a passing one takes it out again.

    A passing one returns a node the scheduler put there (failures, a hang, a failed validation). An admin's
    disable stays until the admin enables it. NotFoundError when the node never registered.
    """
    get_node(s, node_id)
    values: dict[str, Any] = {"validation": validation}
    if not validation.get("passed", True):
        values["err_reason"] = "failed validation"
    else:
        values.update(err_reason="", num_failures=0)
    s.execute(update(nodes).where(nodes.c.node_id == node_id).values(**values))


def run_location(s: Session, task_id: int, owner: str | None, run_id: int, node_rank: int) -> tuple[Any, Any]:
    """The run (latest when 0) and the node holding ``node_rank`` in it."""
    _task_row(s, task_id, owner)
    q = select(runs).where(runs.c.task_id == task_id)
    q = q.where(runs.c.run_id == run_id) if run_id else q.order_by(runs.c.run_id.desc()).limit(1)
    run = s.execute(q).first()
    if run is None:
        raise NotFoundError(f"task {task_id} has no such run yet")
    if node_rank >= len(run.node_ids):
        raise InvalidRequest(f"node rank {node_rank} is out of range: the run has {len(run.node_ids)} nodes")
    node = s.execute(select(nodes).where(nodes.c.node_id == run.node_ids[node_rank])).first()
    if node is None:
        raise NotFoundError(f"node {run.node_ids[node_rank]} is gone")
    return run, node
