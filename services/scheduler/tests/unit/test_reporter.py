"""The scheduler's queue series for telemetry: a count that went to zero is pushed as 0."""

from __future__ import annotations

from typing import Any

from ff_scheduler.core.model import QueueReason, RunState, TaskState
from ff_scheduler.reporter import SchedulerReporter
from ff_scheduler.store.queue_stats import QueueCounts
from ff_telemetry_client import Kind, SampleBuffer


def _points(buffer: SampleBuffer) -> dict[tuple[str, tuple[tuple[str, str], ...]], Any]:
    return {(p.name, tuple(sorted(p.labels.items()))): p for p in buffer.take(100)}


def test_pending_by_reason_running_and_suspends_and_zeros_once_gone() -> None:
    reporter = SchedulerReporter(scheduler=None)  # type: ignore[arg-type]  # add_counts needs no scheduler
    buffer = SampleBuffer()
    waiting = (TaskState.QUEUED, QueueReason.WAITING_FOR_NODES, "default")
    quota = (TaskState.SUSPENDED, QueueReason.OUT_OF_QUOTA, "gpu")
    reporter.add_counts(buffer, QueueCounts({waiting: 3, quota: 1}, {RunState.RUNNING: 2}, num_suspends=4))
    got = _points(buffer)
    key = ("ff_scheduler_tasks", (("node_group", "default"), ("reason", "waiting_for_nodes"), ("state", "queued")))
    assert got[key].value == 3
    assert got[("ff_scheduler_runs", (("state", "running"),))].value == 2
    suspends = got[("ff_scheduler_suspends_total", ())]
    assert suspends.value == 4 and suspends.kind is Kind.COUNTER
    reporter.add_counts(buffer, QueueCounts({quota: 1}, {}, num_suspends=4))
    got = _points(buffer)
    assert got[key].value == 0  # the waiting tasks started: 0, not left out
    assert got[("ff_scheduler_runs", (("state", "running"),))].value == 0
