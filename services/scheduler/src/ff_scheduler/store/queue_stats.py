"""Counts of the queue for telemetry: tasks, runs and suspends.

Unfinished tasks by state, reason and group, active runs by state, and suspends requested so far.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ff_scheduler.core.model import QueueReason, RunState, TaskState
from ff_scheduler.store.schema import runs, tasks


@dataclass(frozen=True)
class QueueCounts:
    """The queue's counts at one moment."""

    # (task state, queue reason, node group) -> tasks; finished tasks are left out.
    tasks: dict[tuple[TaskState, QueueReason, str], int]
    # active run state -> runs
    runs: dict[RunState, int]
    num_suspends: int


def queue_counts(s: Session) -> QueueCounts:
    """The queue's counts, read in one transaction."""
    unfinished = [int(t) for t in TaskState if not t.finished]
    by_task = s.execute(
        select(tasks.c.state, tasks.c.queue_reason, tasks.c.node_group, func.count())
        .where(tasks.c.state.in_(unfinished))
        .group_by(tasks.c.state, tasks.c.queue_reason, tasks.c.node_group)
    )
    active = [int(r) for r in RunState if r.active]
    by_run = s.execute(select(runs.c.state, func.count()).where(runs.c.state.in_(active)).group_by(runs.c.state))
    suspends = s.execute(select(func.count()).where(runs.c.suspend_requested_at > 0)).scalar_one()
    return QueueCounts(
        tasks={(TaskState(st), QueueReason(r), g): int(n) for st, r, g, n in by_task},
        runs={RunState(st): int(n) for st, n in by_run},
        num_suspends=int(suspends),
    )
