"""Figures of a simulation, and the side-by-side table of several policies on one trace.

The figures: utilization, job completion time, queueing delay, suspends, node-time lost.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass

from ff_scheduler.core import priority
from ff_scheduler.core.policy import SchedulingPolicy
from ff_scheduler.core.victims import VictimChoice
from ff_scheduler.sim.engine import SimResult

# The policies compared; each is a setting of the same assigner and matcher. "hai-classic" is HAI's
# time-sharing as its matcher does it (any level preempts any lower one and another user's task of its own
# level, least important and latest first); "hai" preempts only for HIGH and above, only lower levels, the
# fewest victims, then those whose checkpoints are the freshest (``core.victims``), and resumes suspended
# tasks ahead of the levels that cannot preempt.
POLICIES: dict[str, SchedulingPolicy] = {
    "fifo": SchedulingPolicy(preemption=False, by_priority=False, head_of_line_blocking=True, enforce_quotas=False),
    "priority": SchedulingPolicy(preemption=False, enforce_quotas=False),
    "hai-classic": SchedulingPolicy(
        preemption=True,
        enforce_quotas=False,
        min_run_time_s=600.0,
        victim_choice=VictimChoice.LEAST_IMPORTANT_LATEST,
    ),
    "hai": SchedulingPolicy(
        preemption=True,
        enforce_quotas=False,
        min_run_time_s=600.0,
        victim_choice=VictimChoice.FEWEST_FRESHEST,
        preempt_same_level=False,
        preempt_from_level=priority.HIGH,
        resume_first=True,
    ),
}


@dataclass(frozen=True)
class Figures:
    """One policy's figures over one trace (times in hours, utilizations 0..1)."""

    policy: str
    num_jobs: int
    num_unfinished: int
    makespan_h: float
    utilization: float
    useful_utilization: float
    mean_jct_h: float
    p95_jct_h: float
    mean_queue_h: float
    high_mean_jct_h: float
    num_suspends: int
    preemption_lost_node_h: float
    num_failures: int
    failure_lost_node_h: float
    num_ticks: int

    def as_dict(self) -> dict[str, float | int | str]:
        """The figures by name, for JSON output."""
        return asdict(self)


def _p95(values: list[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def figures(result: SimResult) -> Figures:
    """The figures of one simulation."""
    done = [r for r in result.records if r.end_s is not None]
    jct = [r.end_s - r.job.submit_s for r in done if r.end_s is not None]
    high = [r.end_s - r.job.submit_s for r in done if r.end_s is not None and r.job.priority >= priority.HIGH]
    queue = [r.first_start_s - r.job.submit_s for r in result.records if r.first_start_s is not None]
    capacity = result.num_nodes * result.makespan_s or 1.0
    held = sum(r.held_node_s for r in result.records)
    useful = sum(r.job.duration_s * r.job.num_nodes for r in done)
    return Figures(
        policy=result.policy_name,
        num_jobs=len(result.records),
        num_unfinished=len(result.unfinished),
        makespan_h=result.makespan_s / 3600,
        utilization=held / capacity,
        useful_utilization=useful / capacity,
        mean_jct_h=statistics.fmean(jct) / 3600 if jct else 0.0,
        p95_jct_h=_p95(jct) / 3600,
        mean_queue_h=statistics.fmean(queue) / 3600 if queue else 0.0,
        high_mean_jct_h=statistics.fmean(high) / 3600 if high else 0.0,
        num_suspends=sum(r.num_suspends for r in result.records),
        preemption_lost_node_h=sum(r.lost_node_s for r in result.records) / 3600,
        num_failures=sum(r.num_failures for r in result.records),
        failure_lost_node_h=sum(r.failure_lost_node_s for r in result.records) / 3600,
        num_ticks=result.num_ticks,
    )


ROWS: tuple[tuple[str, Callable[[Figures], str]], ...] = (
    ("jobs finished", lambda f: f"{f.num_jobs - f.num_unfinished}/{f.num_jobs}"),
    ("makespan (h)", lambda f: f"{f.makespan_h:.1f}"),
    ("node utilization (held)", lambda f: f"{f.utilization:.1%}"),
    ("node utilization (useful work)", lambda f: f"{f.useful_utilization:.1%}"),
    ("mean JCT (h)", lambda f: f"{f.mean_jct_h:.3f}"),
    ("p95 JCT (h)", lambda f: f"{f.p95_jct_h:.2f}"),
    ("mean queueing delay (h)", lambda f: f"{f.mean_queue_h:.2f}"),
    ("mean JCT of HIGH+ jobs (h)", lambda f: f"{f.high_mean_jct_h:.3f}"),
    ("suspends", lambda f: f"{f.num_suspends}"),
    ("node-time lost to preemption (node-h)", lambda f: f"{f.preemption_lost_node_h:.1f}"),
    ("runs ended by failures", lambda f: f"{f.num_failures}"),
    ("node-time lost to failures (node-h)", lambda f: f"{f.failure_lost_node_h:.1f}"),
    ("ticks planned", lambda f: f"{f.num_ticks}"),
)


def render(all_figures: list[Figures]) -> str:
    """A table, one column per policy, then time-sharing ("hai") against each other policy that ran."""
    width = max(len(r[0]) for r in ROWS) + 2
    cols = [f.policy for f in all_figures]
    lines = ["".ljust(width) + "".join(c.rjust(12) for c in cols)]
    for label, fmt in ROWS:
        lines.append(label.ljust(width) + "".join(fmt(f).rjust(12) for f in all_figures))
    by = {f.policy: f for f in all_figures}
    hai = by.get("hai")
    if hai is None:
        return "\n".join(lines)
    lines.append("")
    for name, label in (("priority", "priority without preemption"), ("fifo", "FIFO"), ("hai-classic", "HAI classic")):
        other = by.get(name)
        if other is None or not other.mean_jct_h:
            continue
        line = f"time-sharing / {label}: mean JCT {hai.mean_jct_h / other.mean_jct_h:.3f}"
        if other.high_mean_jct_h:
            line += f", HIGH+ JCT {hai.high_mean_jct_h / other.high_mean_jct_h:.3f}"
        lines.append(f"{line}, utilization {hai.utilization:.1%} vs {other.utilization:.1%}")
    return "\n".join(lines)
