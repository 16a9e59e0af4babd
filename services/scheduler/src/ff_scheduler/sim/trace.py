"""Job traces: a CSV format and a synthetic generator (arrivals, sizes in nodes, durations, priorities, users).

CSV columns (header required): ``job_id,submit_s,num_nodes,duration_s,priority,user``; ``duration_s`` is
the work the job needs when it runs undisturbed; ``priority`` is a level (0..50).
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ff_scheduler.core import priority

COLUMNS = ("job_id", "submit_s", "num_nodes", "duration_s", "priority", "user")


@dataclass(frozen=True, kw_only=True)
class Job:
    """One job of a trace: when it is submitted (seconds), how many nodes for how long, at which priority."""

    job_id: int
    submit_s: float
    num_nodes: int
    duration_s: float
    priority: int
    user: str


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the line."""


def read_csv(path: Path) -> list[Job]:
    """The jobs of a CSV trace, by submit time; TraceError naming the line for a bad row or missing column."""
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = set(COLUMNS) - set(reader.fieldnames or ())
        if missing:
            raise TraceError(f"{path}: missing columns {', '.join(sorted(missing))}")
        jobs = [_parse_row(path, i + 2, row) for i, row in enumerate(reader)]
    return sorted(jobs, key=lambda j: (j.submit_s, j.job_id))


def _parse_row(path: Path, line: int, row: dict[str, str]) -> Job:
    try:
        job = Job(
            job_id=int(row["job_id"]),
            submit_s=float(row["submit_s"]),
            num_nodes=int(row["num_nodes"]),
            duration_s=float(row["duration_s"]),
            priority=int(row["priority"]),
            user=row["user"].strip(),
        )
    except (TypeError, ValueError) as exc:
        raise TraceError(f"{path}:{line}: {exc}") from None
    if job.num_nodes < 1 or job.duration_s <= 0 or job.submit_s < 0 or not job.user:
        raise TraceError(f"{path}:{line}: need num_nodes >= 1, duration_s > 0, submit_s >= 0 and a user")
    if not priority.is_level(job.priority):
        raise TraceError(f"{path}:{line}: priority {job.priority} is not a level ({priority.describe_levels()})")
    return job


def write_csv(path: Path, jobs: Iterable[Job]) -> None:
    """Write ``jobs`` as a CSV trace that ``read_csv`` reads back."""
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        for j in jobs:
            writer.writerow([j.job_id, f"{j.submit_s:.3f}", j.num_nodes, f"{j.duration_s:.3f}", j.priority, j.user])


@dataclass(frozen=True, kw_only=True)
class SyntheticTrace:
    """A workload like HAI's: many small jobs, some big ones, a few urgent high-priority ones.

    Attributes:
        num_jobs: how many jobs.
        num_nodes: cluster size (sizes are capped to it).
        load: offered load, node-time asked / node-time available over the arrival period (>1 means
            the queue grows: time-sharing matters most there).
        sizes, size_weights: job sizes in nodes and how often each comes.
        mean_duration_s: mean of the log-normal durations; ``duration_sigma`` its shape.
        priorities, priority_weights: levels and how often each comes.
        num_users: users; jobs are spread over them uniformly.
    """

    num_jobs: int = 1000
    num_nodes: int = 64
    load: float = 1.1
    sizes: Sequence[int] = (1, 2, 4, 8, 16)
    size_weights: Sequence[float] = (0.35, 0.25, 0.2, 0.12, 0.08)
    mean_duration_s: float = 3600.0
    duration_sigma: float = 1.0
    priorities: Sequence[int] = (priority.LOW, priority.NORMAL, priority.HIGH, priority.EXTREME_HIGH)
    priority_weights: Sequence[float] = (0.3, 0.5, 0.15, 0.05)
    num_users: int = 8
    users: list[str] = field(default_factory=list)

    def generate(self, seed: int) -> list[Job]:
        """The trace's jobs, the same for the same ``seed``."""
        rng = random.Random(seed)
        sizes = [min(s, self.num_nodes) for s in self.sizes]
        mean_size = sum(s * w for s, w in zip(sizes, self.size_weights, strict=True)) / sum(self.size_weights)
        # Poisson arrivals at the rate that gives the asked load.
        rate = self.load * self.num_nodes / (mean_size * self.mean_duration_s)
        mu = math.log(self.mean_duration_s) - self.duration_sigma**2 / 2
        users = self.users or [f"user{i}" for i in range(self.num_users)]
        jobs, t = [], 0.0
        for job_id in range(1, self.num_jobs + 1):
            t += rng.expovariate(rate)
            jobs.append(
                Job(
                    job_id=job_id,
                    submit_s=t,
                    num_nodes=rng.choices(sizes, self.size_weights)[0],
                    duration_s=max(60.0, rng.lognormvariate(mu, self.duration_sigma)),
                    priority=rng.choices(list(self.priorities), self.priority_weights)[0],
                    user=rng.choice(users),
                )
            )
        return jobs
