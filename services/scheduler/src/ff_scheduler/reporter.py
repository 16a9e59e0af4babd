"""The scheduler's series for telemetry: task and run counts, suspends, and the tick's duration.

``ff_scheduler_tasks`` (unfinished tasks by ``state`` queued,
running or suspended, ``reason`` why a queued one waits, and ``node_group``), ``ff_scheduler_runs`` (active
runs by ``state``), ``ff_scheduler_suspends_total`` (suspends requested) and ``ff_scheduler_tick_seconds``
(the last tick's duration).
"""

from __future__ import annotations

from ff_scheduler.app import Scheduler
from ff_scheduler.core.model import QueueReason, RunState, TaskState
from ff_scheduler.store.queue_stats import QueueCounts, queue_counts
from ff_telemetry_client import Kind, SampleBuffer


class SchedulerReporter:
    """Collects the scheduler's series; a count that went to zero is pushed as 0, not left out.

    So a chart drops to 0 instead of keeping the last value it saw.
    """

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self._tasks_seen: set[tuple[TaskState, QueueReason, str]] = set()
        self._runs_seen: set[RunState] = set()

    async def collect(self, buffer: SampleBuffer) -> None:
        """Add one sample of every series to ``buffer`` (the counts from one read-only transaction)."""
        self.add_counts(buffer, await self.scheduler.store.arun(queue_counts, read_only=True))
        if self.scheduler.last_tick is not None:
            buffer.add("ff_scheduler_tick_seconds", self.scheduler.last_tick.duration_s)

    def add_counts(self, buffer: SampleBuffer, counts: QueueCounts) -> None:
        """Add the task, run and suspend counts, with a 0 for every label set seen before and gone now."""
        self._tasks_seen |= set(counts.tasks)
        self._runs_seen |= set(counts.runs)
        for state, reason, group in sorted(self._tasks_seen):
            labels = {"state": state.name.lower(), "reason": reason.name.lower(), "node_group": group}
            buffer.add("ff_scheduler_tasks", counts.tasks.get((state, reason, group), 0), labels)
        for run_state in sorted(self._runs_seen):
            buffer.add("ff_scheduler_runs", counts.runs.get(run_state, 0), {"state": run_state.name.lower()})
        buffer.add("ff_scheduler_suspends_total", counts.num_suspends, kind=Kind.COUNTER)
