"""Tick time of the scheduler at HAI scale: 1,250 nodes, 10,000 queued tasks (goal: <= 1 s per tick).

Usage: python bench/scheduler_tick.py [--nodes 1250] [--queued 10000] [--ticks 5] [--db sqlite|none]

Times the pure pipeline (beater -> assigner -> matcher, ``core.tick.plan_tick``) on a full cluster
(every node busy, so every queued task is checked for quota, free nodes and preemption victims) and
on an empty one (the first tick places as many tasks as fit); with ``--db sqlite`` also the beater's
load of the snapshot from a SQLite file holding that many tasks. Prints figures; never fails on time.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from ff_scheduler.core import priority as p
from ff_scheduler.core.builders import nodes, queued, running, snapshot
from ff_scheduler.core.model import Snapshot, TaskSnap
from ff_scheduler.core.policy import LifecyclePolicy, SchedulingPolicy
from ff_scheduler.core.tick import plan_tick

LEVELS = [p.LOW, p.BELOW_NORMAL, p.NORMAL, p.ABOVE_NORMAL, p.HIGH, p.EXTREME_HIGH]


def build(num_nodes: int, num_queued: int, *, busy: bool, seed: int = 1) -> Snapshot:
    rng = random.Random(seed)
    all_nodes = nodes(num_nodes, zones=8)
    tasks: list[TaskSnap] = []
    users = [f"user{i}" for i in range(100)]
    now = 100_000.0
    task_id = 0
    if busy:
        node_id = 1
        while node_id <= num_nodes:
            size = min(rng.choice([1, 2, 4, 8]), num_nodes - node_id + 1)
            task_id += 1
            tasks.append(running(task_id, tuple(range(node_id, node_id + size)), rng.choice(LEVELS),
                                 user=rng.choice(users), started_at=now - rng.uniform(0, 7200)))  # fmt: skip
            node_id += size
    for _ in range(num_queued):
        task_id += 1
        tasks.append(
            queued(task_id, rng.choice([1, 2, 4, 8, 16, 32]), rng.choice([*LEVELS, None]), user=rng.choice(users))
        )
    quotas = {(u, lvl, "default"): rng.choice([8, 32, 128]) for u in users for lvl in LEVELS}
    return snapshot(now, all_nodes, tasks, quotas)


def time_ticks(snap: Snapshot, ticks: int) -> list[float]:
    sched, life = SchedulingPolicy(min_run_time_s=600), LifecyclePolicy()
    times = []
    for _ in range(ticks):
        t0 = time.perf_counter()
        plan_tick(snap, sched, life)
        times.append(time.perf_counter() - t0)
    return times


def time_db_load(num_nodes: int, num_queued: int, ticks: int) -> list[float]:
    from ff_scheduler.bench_support import fill_and_load  # the store's loader, on a real SQLite file

    with tempfile.TemporaryDirectory() as tmp:
        return fill_and_load(f"sqlite:///{Path(tmp) / 'bench.db'}", num_nodes, num_queued, ticks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1250)
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--ticks", type=int, default=5)
    parser.add_argument("--db", choices=["sqlite", "none"], default="none")
    args = parser.parse_args()
    print(f"{args.nodes} nodes, {args.queued} queued tasks, {args.ticks} ticks each (goal <= 1 s per tick)")
    for label, busy in (("full cluster (all nodes busy)", True), ("empty cluster (first placement)", False)):
        times = time_ticks(build(args.nodes, args.queued, busy=busy), args.ticks)
        med = statistics.median(times)
        print(f"  plan_tick, {label}: median {med * 1000:.0f} ms, max {max(times) * 1000:.0f} ms "
              f"-> {1 / med:.1f} ticks/s, {med:.3f} of the 1 s budget")  # fmt: skip
    if args.db == "sqlite":
        loads = time_db_load(args.nodes, args.queued, args.ticks)
        med = statistics.median(loads)
        print(f"  beater: load the snapshot from SQLite: median {med * 1000:.0f} ms, max {max(loads) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
