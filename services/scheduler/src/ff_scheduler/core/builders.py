"""Builders of tick inputs (nodes, queued and running tasks, snapshots) for tests and benchmarks."""

from __future__ import annotations

from typing import Any

from ff_scheduler.core.model import (
    NodePhase,
    NodeRunReport,
    NodeState,
    NodeView,
    RunSnap,
    RunState,
    Snapshot,
    TaskSnap,
    TaskState,
)

GROUP = "default"


def nodes(count: int, *, zones: int = 1, group: str = GROUP, start: int = 1) -> dict[int, NodeView]:
    """``count`` ready nodes numbered from ``start``, spread round-robin over ``zones`` zones ``z0``, ``z1``, ..."""
    return {i: NodeView(node_id=i, group=group, zone=f"z{(i - start) % zones}") for i in range(start, start + count)}


def with_state(all_nodes: dict[int, NodeView], node_id: int, state: NodeState) -> dict[int, NodeView]:
    """A copy of ``all_nodes`` with node ``node_id`` in ``state``."""
    n = all_nodes[node_id]
    return {**all_nodes, node_id: NodeView(node_id=n.node_id, group=n.group, zone=n.zone, state=state)}


def queued(
    task_id: int,
    num_nodes: int,
    level: int | None,
    *,
    user: str = "alice",
    fcfs: int | None = None,
    group: str = GROUP,
    **kw: Any,
) -> TaskSnap:
    """A queued task of ``num_nodes`` nodes at priority ``level`` (None: AUTO); ``kw`` sets more TaskSnap fields."""
    return TaskSnap(
        task_id=task_id,
        user=user,
        group=group,
        num_nodes=num_nodes,
        priority=level,
        asked_priority=level,
        state=TaskState.QUEUED,
        fcfs=task_id if fcfs is None else fcfs,
        **kw,
    )


def running(
    task_id: int,
    node_ids: tuple[int, ...],
    level: int,
    *,
    user: str = "alice",
    started_at: float = 0.0,
    fcfs: int | None = None,
    state: RunState = RunState.RUNNING,
    group: str = GROUP,
    phase: NodePhase = NodePhase.RUNNING,
    **kw: Any,
) -> TaskSnap:
    """A task running on ``node_ids`` at priority ``level``, every node reporting ``phase``; ``kw``: more fields."""
    run = RunSnap(
        run_id=1000 + task_id,
        task_id=task_id,
        state=state,
        priority=level,
        node_ids=node_ids,
        created_at=started_at,
        started_at=started_at,
        reports={n: NodeRunReport(phase=phase, last_output_at=started_at) for n in node_ids},
    )
    return TaskSnap(
        task_id=task_id,
        user=user,
        group=group,
        num_nodes=len(node_ids),
        priority=level,
        asked_priority=level,
        state=TaskState.RUNNING,
        fcfs=task_id if fcfs is None else fcfs,
        run=run,
        **{"watchdog_time_s": 0.0, **kw},
    )


def snapshot(
    now: float,
    all_nodes: dict[int, NodeView],
    tasks: list[TaskSnap],
    quotas: dict[tuple[str, int, str], int] | None = None,
) -> Snapshot:
    """A tick's input at ``now`` (no quotas unless given)."""
    return Snapshot(now=now, nodes=all_nodes, tasks=tasks, quotas=quotas or {})
