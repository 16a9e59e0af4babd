"""The tick's SQL: load the snapshot, apply the plan, and list the orders the agents should have.

The snapshot is the beater's; the plan is applied guarded by the states it was decided from; the orders are
what active runs want of each node.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields, replace
from operator import attrgetter
from typing import Any, NamedTuple

from sqlalchemy import CursorResult, TextClause, and_, select, text, update
from sqlalchemy.orm import Session

from ff_scheduler.core.lifecycle import RunChange
from ff_scheduler.core.matcher import Start
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
from ff_scheduler.store import bulk
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


_TASK_COLUMNS = (
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
_TASK_ID = attrgetter("task_id")
_TASK_COLUMN_NAMES = tuple(c.name for c in _TASK_COLUMNS)
_TASK_STATES = {int(v): v for v in TaskState}
_QUEUE_REASONS = {int(v): v for v in QueueReason}
QUEUED_STATES = frozenset((TaskState.QUEUED, TaskState.SUSPENDED))


def _task_snap(r: Any) -> TaskSnap:
    return TaskSnap(
        task_id=r.task_id,
        user=r.user_name,
        group=r.node_group,
        num_nodes=r.num_nodes,
        priority=r.priority,
        asked_priority=r.asked_priority,
        state=_TASK_STATES[r.state],
        fcfs=r.task_id,
        queue_reason=_QUEUE_REASONS[r.queue_reason],
        watchdog_time_s=r.watchdog_time_s,
        max_restarts=r.max_restarts,
        num_restarts=r.num_restarts,
        suspend_grace_s=r.suspend_grace_s,
    )


def _task_snaps(rows: list[Any]) -> list[TaskSnap]:
    """``_task_snap`` of each row of ``_TASK_COLUMNS`` (by position: a restart reads 100,000 of them)."""
    states, reasons = _TASK_STATES, _QUEUE_REASONS
    return [
        TaskSnap(
            task_id=task_id,
            user=user,
            group=group,
            num_nodes=num_nodes,
            priority=level,
            asked_priority=asked,
            state=states[state],
            fcfs=task_id,
            queue_reason=reasons[reason],
            watchdog_time_s=watchdog,
            max_restarts=restarts,
            num_restarts=n_restarts,
            suspend_grace_s=grace,
        )
        for task_id, user, group, num_nodes, level, asked, state, reason, watchdog, restarts, n_restarts, grace in rows
    ]


def load_snapshot(s: Session, now: float) -> Snapshot:
    """Everything one tick decides from, read in the tick's transaction (every unfinished task: see ``TaskCache``)."""
    snap, _ = _load(s, now, None, set())
    return snap


def _load(
    s: Session, now: float, queued: dict[int, TaskSnap] | None, dirty: set[int]
) -> tuple[Snapshot, dict[int, TaskSnap]]:
    """The snapshot, and its tasks waiting without a run (QUEUED or SUSPENDED) by id.

    ``queued`` None: every unfinished task is read. Else ``queued`` is what the last tick left of those, and only
    the running tasks and the tasks in ``dirty`` (changed since) are read.
    """
    views = _node_views(s)
    reports = _active_reports(s)
    load = bulk.json_loader(s)
    run_by_task = {r.task_id: _stored_run_snap(r, reports.get(r.run_id, {}), load) for r in _active_run_rows(s)}
    if queued is None:
        rows = _task_rows(s, f"state IN {_ints(UNFINISHED)}")
        waiting: dict[int, TaskSnap] = {}
    else:
        rows = _task_rows(s, f"state = {int(TaskState.RUNNING)}")
        # Updated in place (a copy of 100,000 tasks each tick cost ~15 ms): a failed tick drops the cache
        # (``TaskCache.invalidate``), and a retried transaction reads the same tasks again.
        waiting = queued
        for task_id in dirty:
            waiting.pop(task_id, None)
        for chunk in bulk.in_chunks(sorted(dirty)):
            rows += _task_rows(s, f"task_id IN {_ints(chunk)}")
    others: dict[int, TaskSnap] = {}
    for snap in _task_snaps(rows):
        if snap.state in QUEUED_STATES:
            waiting[snap.task_id] = snap
        elif not snap.state.finished:
            waiting.pop(snap.task_id, None)
            others[snap.task_id] = snap
    # Their active runs attached (``others`` and ``waiting`` are disjoint); a waiting task is shared with the cache,
    # so one with a run (not a state the ops leave: a queued task has no active run) is attached to a copy.
    attached: dict[int, TaskSnap] = {}
    for task_id, run in run_by_task.items():
        task = others.get(task_id)
        if task is not None:
            others[task_id] = replace(task, run=run)
        elif task_id in waiting:
            attached[task_id] = replace(waiting[task_id], run=run)
    listed = [attached.get(t.task_id, t) for t in waiting.values()] if attached else waiting.values()
    snaps = sorted([*listed, *others.values()], key=_TASK_ID)
    quota_map = {(r.user_name, r.priority, r.node_group): r.max_nodes for r in s.execute(select(quotas))}
    return Snapshot(now=now, nodes=views, tasks=snaps, quotas=quota_map), waiting


# The tick's reads below are driver-level statements (``bulk.select_rows``): SQLAlchemy's row processing (a JSON
# decode per run node, Boolean and enum conversions) took ~0.1 s of each tick's read of 10,000 nodes and run nodes.


def _ints(values: Iterable[int]) -> str:
    """An SQL list of integers, ``(1,2,3)``."""
    return f"({','.join(str(int(v)) for v in values)})"


_ACTIVE_SQL = f"state IN {_ints(ACTIVE)}"
_PHASES = {int(v): v for v in NodePhase}
_NODE_COLUMNS = ("node_id", "node_group", "zone", "online", "disabled_reason", "err_reason", "num_failures")
_RUN_SNAP_COLUMNS = (
    *("run_id", "task_id", "state", "priority", "node_ids", "created_at", "started_at", "suspend_stage"),
    *("suspend_requested_at", "suspend_received_at", "stop_requested_at", "stop_reason", "end_message"),
    *("ack_window_s", "grace_s", "checkpoint", "failure"),
)


def _node_views(s: Session) -> dict[int, NodeView]:
    ready, err, offline = NodeState.READY, NodeState.ERR, NodeState.OFFLINE
    return {
        node_id: NodeView(
            node_id=node_id,
            group=group,
            zone=zone,
            # node_state's rule, inline (10,000 rows)
            state=offline if not online else err if disabled_reason or err_reason else ready,
            num_failures=num_failures,
        )
        for node_id, group, zone, online, disabled_reason, err_reason, num_failures in bulk.select_rows(
            s, nodes, _NODE_COLUMNS
        )
    }


def _active_reports(s: Session) -> dict[int, dict[int, NodeRunReport]]:
    """What the agents last reported of each active run, per run id and node id."""
    load = bulk.json_loader(s)
    phases = _PHASES
    reports: dict[int, dict[int, NodeRunReport]] = defaultdict(dict)
    where = f"run_id IN (SELECT run_id FROM {runs.name} WHERE {_ACTIVE_SQL})"
    columns = ("run_id", "node_id", "phase", "last_output_at", "failure")
    for run_id, node_id, phase, last_output_at, failure in bulk.select_rows(s, run_nodes, columns, where):
        reports[run_id][node_id] = NodeRunReport(
            phase=phases[phase],
            last_output_at=last_output_at,
            failure=None if failure is None else failure_from_json(load(failure)),
        )
    return reports


def _active_run_rows(s: Session) -> list[Any]:
    return list(bulk.select_rows(s, runs, _RUN_SNAP_COLUMNS, _ACTIVE_SQL))


def _stored_run_snap(r: Any, reports: dict[int, NodeRunReport], load: Callable[[Any], Any]) -> RunSnap:
    """A run read by ``bulk.select_rows`` (JSON columns decoded by ``load``) as the tick sees it."""
    return _run_snap_of(r, reports, load(r.node_ids), load(r.checkpoint), load(r.failure))


def _task_rows(s: Session, where: str) -> list[Any]:
    return list(bulk.select_rows(s, tasks, _TASK_COLUMN_NAMES, where))


CHANGED_TASKS = "ff_scheduler.changed_tasks"


def note_changed(s: Session, task_id: int) -> None:
    """Tell the scheduler's ``TaskCache`` that this transaction changes (or adds) task ``task_id``."""
    s.info.setdefault(CHANGED_TASKS, set()).add(task_id)


class TaskCache:
    """The tasks waiting without a run (QUEUED, SUSPENDED) kept between ticks, so a tick does not read them all.

    The database stays the truth: the first tick (after a start, or after a tick failed) reads every unfinished
    task; later ones read the running tasks, nodes, runs and quotas as before, but of the waiting tasks only those
    a transaction marked changed (``note_changed``; ``Transactions`` passes them on before and after the commit),
    and apply the tick's own changes to the waiting tasks they keep.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queued: dict[int, TaskSnap] | None = None
        # Changed task id -> the marking's number (a task marked again while a tick ran stays marked).
        self._dirty: dict[int, int] = {}
        self._marks = 0

    def mark(self, task_ids: Iterable[int]) -> None:
        """These tasks changed in the database (thread-safe)."""
        with self._lock:
            for task_id in task_ids:
                self._marks += 1
                self._dirty[task_id] = self._marks

    def invalidate(self) -> None:
        """Read every task again at the next tick."""
        with self._lock:
            self._queued = None

    def load(self, s: Session, now: float) -> tuple[Snapshot, TaskCacheUpdate]:
        """The tick's snapshot, and what to keep once the tick's transaction has committed (``commit``)."""
        with self._lock:
            queued = self._queued
            dirty = dict(self._dirty)
        snap, waiting = _load(s, now, queued, set(dirty))
        return snap, TaskCacheUpdate(waiting, dirty)

    def commit(self, update: TaskCacheUpdate, plan: TickPlan | None = None, applied: Applied | None = None) -> None:
        """The tick committed: keep its waiting tasks with the plan's changes (``TaskCacheUpdate.apply``) applied.

        The marks it read are done unless marked again since.
        """
        if plan is not None and applied is not None:
            update.apply(plan, applied)
        with self._lock:
            self._queued = update.waiting
            for task_id, mark in update.dirty.items():
                if self._dirty.get(task_id) == mark:
                    del self._dirty[task_id]
            for task_id in update.reread:
                self._marks += 1
                self._dirty[task_id] = self._marks


@dataclass
class TaskCacheUpdate:
    """The waiting tasks after a tick, the marks it read, and the tasks to read again at the next tick."""

    waiting: dict[int, TaskSnap]
    dirty: dict[int, int]
    reread: set[int] = field(default_factory=set)

    def apply(self, plan: TickPlan, applied: Applied) -> None:
        """Carry the applied plan's changes of waiting tasks over; tasks it requeued, ended or skipped are read again.

        Changes the kept tasks in place: call it once the tick has committed (``TaskCache.commit``).
        """
        skipped = set(applied.skipped)
        # Started tasks are running now (or finished, when the start found them so): the running are read each tick.
        started = {st.task_id for st in plan.starts}
        for task_id in started:
            self.waiting.pop(task_id, None)
        for tc in plan.task_changes:
            if tc.task_id in started:
                continue
            task = self.waiting.get(tc.task_id)
            if task is None or tc.task_id in skipped or tc.state is not None or tc.num_restarts is not None:
                self.waiting.pop(tc.task_id, None)
                self.reread.add(tc.task_id)
                continue
            if tc.priority is not None:
                task.priority = tc.priority
            if tc.queue_reason is not None:
                task.queue_reason = tc.queue_reason
        self.reread.update(applied.skipped)


def _run_snap(r: Any, reports: dict[int, NodeRunReport]) -> RunSnap:
    """A run row read through SQLAlchemy (JSON columns decoded) as the tick sees it."""
    return _run_snap_of(r, reports, r.node_ids, r.checkpoint, r.failure)


def _run_snap_of(
    r: Any, reports: dict[int, NodeRunReport], node_ids: list[int], checkpoint: dict[str, Any] | None, failure: Any
) -> RunSnap:
    return RunSnap(
        run_id=r.run_id,
        task_id=r.task_id,
        state=RunState(r.state),
        priority=r.priority,
        node_ids=tuple(node_ids),
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
        checkpoint_committed_at=float((checkpoint or {}).get("committed_at", 0.0)),
        checkpoint_taken_at=float((checkpoint or {}).get("taken_at", 0.0)),
        reports=reports,
        failure=failure_from_json(failure),
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


def _task_values(change: TaskChange, now: float) -> dict[str, Any]:
    """The columns one task's change from the plan sets."""
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
    return values


def update_tasks(s: Session, groups: Iterable[tuple[dict[str, Any], list[int]]]) -> None:
    """Set columns of tasks: each group's values on its task ids, batched (a tick may change thousands of tasks).

    A group of several tasks is one UPDATE per range of consecutive ids and per 5,000 others (``bulk.update_ids``);
    the single ones are one executemany per set of columns.
    """
    singles: dict[tuple[str, ...], list[tuple[Any, ...]]] = defaultdict(list)
    for values, task_ids in groups:
        if not values:
            continue
        if len(task_ids) == 1:
            columns = tuple(sorted(values))
            singles[columns].append((*(values[c] for c in columns), task_ids[0]))
            continue
        bulk.update_ids(s, tasks, "task_id", values, task_ids)
    for columns, rows in singles.items():
        bulk.update_rows(s, tasks, "task_id", columns, rows)


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
    alike: dict[tuple[Any, ...], list[TaskChange]] = defaultdict(list)
    for tc in plan.task_changes:
        if tc.task_id not in skipped:
            alike[(tc.state, tc.priority, tc.queue_reason, tc.num_restarts, tc.end_reason, tc.end_message)].append(tc)
    update_tasks(s, [(_task_values(tcs[0], now), [tc.task_id for tc in tcs]) for tcs in alike.values()])
    for verdict in plan.node_verdicts:
        values: dict[str, Any] = {"num_failures": verdict.num_failures}
        if verdict.err_reason:
            values["err_reason"] = verdict.err_reason[:512]
        s.execute(update(nodes).where(nodes.c.node_id == verdict.node_id).values(**values))
    applied.num_started = _start_runs(s, plan.starts, now, master_port)
    return applied


# The columns of a new run, in the order ``_start_runs`` gives them.
_RUN_COLUMNS = (
    *("task_id", "run_index", "state", "priority", "node_ids", "master_address", "start_whole_life_state"),
    *("suspend_stage", "suspend_requested_at", "suspend_received_at", "stop_requested_at", "stop_reason"),
    *("ack_window_s", "grace_s", "created_at", "started_at", "ended_at", "end_reason", "end_message"),
    *("failure", "checkpoint"),
)


def _id_in(column: Any, ids: list[int]) -> TextClause:
    """``column IN (ids)`` with the ids (integers) written into the SQL.

    SQLAlchemy's bound IN list costs ~6 us per id (a parameter name each): 0.6 s of the first tick's 100,000.
    """
    return text(f"{column.table.name}.{column.name} IN ({','.join(str(int(i)) for i in ids)})")


def _start_runs(s: Session, starts: list[Start], now: float, master_port: int) -> int:
    """Insert a STARTING run for each start whose task is unfinished (batched statements); how many started."""
    if not starts:
        return 0
    cols = (tasks.c.task_id, tasks.c.state, tasks.c.num_runs, tasks.c.whole_life_state, tasks.c.first_started_at)
    task_rows = {}
    for chunk in bulk.in_chunks([st.task_id for st in starts]):
        task_rows.update({r.task_id: r for r in s.execute(select(*cols).where(_id_in(tasks.c.task_id, chunk)))})
    master_ips: dict[int, str] = {}
    for chunk in bulk.in_chunks(sorted({st.node_ids[0] for st in starts})):
        query = select(nodes.c.node_id, nodes.c.master_ip).where(_id_in(nodes.c.node_id, chunk))
        master_ips.update({r.node_id: r.master_ip for r in s.execute(query)})
    starting = [st for st in starts if task_rows[st.task_id].state in UNFINISHED]
    if not starting:
        return 0
    starting_state, no_stage, null = int(RunState.STARTING), int(SuspendStage.NONE), bulk.as_json(None)
    new_runs = [
        (
            st.task_id,
            task_rows[st.task_id].num_runs,
            starting_state,
            st.priority,
            bulk.as_json(list(st.node_ids)),
            f"{master_ips[st.node_ids[0]]}:{master_port}",
            task_rows[st.task_id].whole_life_state,
            no_stage,
            0.0,
            0.0,
            0.0,
            0,
            0.0,
            0.0,
            now,
            0.0,
            0.0,
            0,
            "",
            null,
            null,
        )
        for st in starting
    ]
    bulk.insert_rows(s, runs, _RUN_COLUMNS, new_runs)
    # A started task had no active run: its new run is the one of its index (read back: one executemany inserted them).
    run_of: dict[tuple[int, int], int] = {}
    for chunk in bulk.in_chunks([st.task_id for st in starting]):
        query = select(runs.c.run_id, runs.c.task_id, runs.c.run_index).where(_id_in(runs.c.task_id, chunk))
        run_of.update({(r.task_id, r.run_index): r.run_id for r in s.execute(query)})
    run_ids = [run_of[(st.task_id, task_rows[st.task_id].num_runs)] for st in starting]
    unknown = int(NodePhase.UNKNOWN)
    bulk.insert_rows(
        s,
        run_nodes,
        ("run_id", "node_id", "node_rank", "phase", "last_output_at", "reported_at", "failure"),
        [
            (run_id, n, rank, unknown, 0.0, 0.0, null)
            for st, run_id in zip(starting, run_ids, strict=True)
            for rank, n in enumerate(st.node_ids)
        ],
    )
    running, no_reason = int(TaskState.RUNNING), int(QueueReason.NONE)
    bulk.update_rows(
        s,
        tasks,
        "task_id",
        ("state", "num_runs", "priority", "first_started_at", "queue_reason"),
        [
            (
                running,
                task_rows[st.task_id].num_runs + 1,
                st.priority,
                task_rows[st.task_id].first_started_at or now,
                no_reason,
                st.task_id,
            )
            for st in starting
        ],
    )
    return len(starting)


class NodeOrder(NamedTuple):
    """What one node of an active run should be doing, and how to reach its agent (a tuple: 10,000 per tick)."""

    run_id: int
    task_id: int
    run_state: RunState
    node_id: int
    node_rank: int
    phase: NodePhase
    agent_address: str
    online: bool


_RUN_STATES = {int(v): v for v in RunState}


def wanted_orders(s: Session) -> list[NodeOrder]:
    """Every node of every active run with what the run wants of it, for the driver's reconciliation."""
    sql = (
        "SELECT r.run_id, r.task_id, r.state, rn.node_id, rn.node_rank, rn.phase, n.agent_address, n.online"
        f" FROM {runs.name} r JOIN {run_nodes.name} rn ON rn.run_id = r.run_id"
        f" JOIN {nodes.name} n ON n.node_id = rn.node_id WHERE r.{_ACTIVE_SQL}"
    )
    states, phases = _RUN_STATES, _PHASES
    return [
        NodeOrder(run_id, task_id, states[state], node_id, rank, phases[phase], address, bool(online))
        for run_id, task_id, state, node_id, rank, phase, address, online in s.connection().exec_driver_sql(sql)
    ]


@dataclass
class OrderRows:
    """The rows the orders to agents are made from, by id, and the device indices of the nodes to start on."""

    runs: dict[int, Any]
    tasks: dict[int, Any]
    device_indices: dict[int, list[int]]


def order_rows(s: Session, run_ids: set[int], task_ids: set[int], node_ids: set[int]) -> OrderRows:
    """The runs (every order), tasks and nodes (start orders) the due orders need, read at once."""

    def by_id(column: Any, ids: set[int], *columns: Any) -> dict[int, Any]:
        found: dict[int, Any] = {}
        for chunk in bulk.in_chunks(sorted(ids)):
            query = select(column, *columns).where(_id_in(column, chunk))
            found.update({getattr(r, column.name): r for r in s.execute(query)})
        return found

    r, t = runs.c, tasks.c
    return OrderRows(
        runs=by_id(
            r.run_id,
            run_ids,
            r.run_index,
            r.priority,
            r.node_ids,
            r.master_address,
            r.start_whole_life_state,
            r.ack_window_s,
            r.grace_s,
            r.stop_reason,
        ),
        tasks=by_id(t.task_id, task_ids, t.user_name, t.uid, t.spec),
        device_indices=_device_indices(s, node_ids),
    )


def _device_indices(s: Session, node_ids: set[int]) -> dict[int, list[int]]:
    """The indices of each node's devices (10,000 nodes' at the first tick: driver rows, JSON decoded here)."""
    load = bulk.json_loader(s)
    found: dict[int, list[int]] = {}
    for chunk in bulk.in_chunks(sorted(node_ids)):
        for node_id, devices in bulk.select_rows(s, nodes, ("node_id", "devices"), f"node_id IN {_ints(chunk)}"):
            found[node_id] = [int(d.get("index", i)) for i, d in enumerate(load(devices) or [])]
    return found
