"""The assigner: which tasks are within their (user, priority, group) node quota (HAI FIFOAssigner).

Running tasks are charged first, in FCFS order, so a queued task of a user never pushes that user's
running task out of quota; then queued tasks in FCFS order. A task with a fixed priority is in quota
when the remaining quota at its key covers its nodes; otherwise it is QUOTA_EXCEEDED when the quota
itself is smaller than its nodes (it can never run there) and OUT_OF_QUOTA when other tasks use it. An
AUTO task takes the highest level at which the remaining quota covers it.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

from ff_scheduler.core import priority
from ff_scheduler.core.model import QueueReason, QuotaKey, TaskSnap

_FCFS = attrgetter("fcfs")


@dataclass(frozen=True, slots=True)
class Verdict:
    """The assigner's answer for one task: in quota or why not, and the priority it runs at."""

    in_quota: bool
    priority: int | None
    reason: QueueReason = QueueReason.NONE


def assign(tasks: list[TaskSnap], quotas: dict[QuotaKey, int], *, enforce: bool = True) -> dict[int, Verdict]:
    """A verdict per task id (running tasks are always in quota at their run's priority)."""
    remaining = dict(quotas)
    verdicts: dict[int, Verdict] = {}
    running: list[TaskSnap] = []
    queued: list[TaskSnap] = []
    for task in tasks:
        (queued if task.run is None else running).append(task)
    running.sort(key=_FCFS)
    queued.sort(key=_FCFS)
    for task in running:
        assert task.run is not None
        level = task.run.priority
        key = (task.user, level, task.group)
        remaining[key] = remaining.get(key, 0) - task.num_nodes
        verdicts[task.task_id] = Verdict(True, level)
    # Verdicts of tasks refused so far by (user, asked priority, group, nodes): the remaining quota only
    # shrinks, so a later task asking the same is refused the same way (this spares a long queue's walk).
    refused: dict[tuple[str, int | None, str, int], Verdict] = {}
    for task in queued:
        if not enforce:
            verdicts[task.task_id] = _unlimited(task)
            continue
        asks = (task.user, task.asked_priority, task.group, task.num_nodes)
        verdict = refused.get(asks) or _charge(task, quotas, remaining)
        if not verdict.in_quota:
            refused[asks] = verdict
        verdicts[task.task_id] = verdict
    return verdicts


def _unlimited(task: TaskSnap) -> Verdict:
    return Verdict(True, task.asked_priority if task.asked_priority is not None else priority.LEVELS[0])


def _charge(task: TaskSnap, quotas: dict[QuotaKey, int], remaining: dict[QuotaKey, int]) -> Verdict:
    levels = priority.LEVELS if task.asked_priority is None else (task.asked_priority,)
    for level in levels:
        key = (task.user, level, task.group)
        if remaining.get(key, 0) >= task.num_nodes:
            remaining[key] -= task.num_nodes
            return Verdict(True, level)
    if all(quotas.get((task.user, level, task.group), 0) < task.num_nodes for level in levels):
        reason = QueueReason.QUOTA_EXCEEDED
    else:
        reason = QueueReason.OUT_OF_QUOTA
    return Verdict(False, task.asked_priority, reason)
