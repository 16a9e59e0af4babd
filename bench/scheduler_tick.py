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
from typing import Any

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
            tasks.append(
                running(
                    task_id,
                    tuple(range(node_id, node_id + size)),
                    rng.choice(LEVELS),
                    user=rng.choice(users),
                    started_at=now - rng.uniform(0, 7200),
                )
            )
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


def time_db_tick(num_nodes: int, num_queued: int, ticks: int) -> tuple[list[float], list[float]]:
    """The service's tick transaction on a SQLite file: (load only, load + plan + apply) times."""
    from sqlalchemy import insert

    from ff_scheduler.server import MIGRATIONS
    from ff_scheduler.store.schema import VERSION_TABLE
    from ff_scheduler.store.schema import nodes as nodes_table
    from ff_scheduler.store.schema import quotas as quotas_table
    from ff_scheduler.store.schema import tasks as tasks_table
    from ff_scheduler.store.ticks import apply_plan, load_snapshot
    from ff_store import open_store

    snap = build(num_nodes, num_queued, busy=False)
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(f"sqlite:///{Path(tmp) / 'bench.db'}", MIGRATIONS, VERSION_TABLE)

        def fill(s: Any) -> None:
            s.execute(
                insert(nodes_table),
                [
                    {
                        "node_id": n.node_id,
                        "hostname": f"n{n.node_id}",
                        "agent_address": "127.0.0.1:1",
                        "master_ip": "127.0.0.1",
                        "node_group": n.group,
                        "zone": n.zone,
                        "devices": [],
                        "num_cpus": 8,
                        "memory_bytes": 0,
                        "online": True,
                        "disabled_reason": "",
                        "err_reason": "",
                        "num_failures": 0,
                        "registered_at": 0.0,
                        "last_report_at": 0.0,
                        "validation": None,
                    }
                    for n in snap.nodes.values()
                ],
            )
            s.execute(
                insert(tasks_table),
                [
                    {
                        "user_name": t.user,
                        "uid": 1000,
                        "request_id": None,
                        "name": "t",
                        "spec": {"argv": ["python"]},
                        "num_nodes": t.num_nodes,
                        "asked_priority": t.asked_priority,
                        "priority": t.priority,
                        "node_group": t.group,
                        "state": 1,
                        "queue_reason": 0,
                        "whole_life_state": 0,
                        "watchdog_time_s": 1800.0,
                        "max_restarts": 3,
                        "suspend_grace_s": 0.0,
                        "num_runs": 0,
                        "num_restarts": 0,
                        "created_at": 0.0,
                        "first_started_at": 0.0,
                        "finished_at": 0.0,
                        "end_reason": 0,
                        "end_message": "",
                    }
                    for t in snap.tasks
                ],
            )
            s.execute(
                insert(quotas_table),
                [
                    {"user_name": u, "priority": lvl, "node_group": g, "max_nodes": n}
                    for (u, lvl, g), n in snap.quotas.items()
                ],
            )

        store.run(fill)
        loads, full = [], []
        sched, life = SchedulingPolicy(min_run_time_s=600), LifecyclePolicy()
        for _ in range(ticks):
            t0 = time.perf_counter()
            store.run(lambda s: load_snapshot(s, 100_000.0), read_only=True)
            loads.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            store.run(lambda s: apply_plan(s, plan_tick(load_snapshot(s, 100_000.0), sched, life), 100_000.0, 2222))
            full.append(time.perf_counter() - t0)
        store.dispose()
    return loads, full


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1250)
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--ticks", type=int, default=5)
    parser.add_argument("--db", choices=["sqlite", "none"], default="sqlite")
    args = parser.parse_args()
    print(f"{args.nodes} nodes, {args.queued} queued tasks, {args.ticks} ticks each (goal <= 1 s per tick)")
    for label, busy in (("full cluster (all nodes busy)", True), ("empty cluster (first placement)", False)):
        times = time_ticks(build(args.nodes, args.queued, busy=busy), args.ticks)
        med = statistics.median(times)
        print(
            f"  plan_tick, {label}: median {med * 1000:.0f} ms, max {max(times) * 1000:.0f} ms "
            f"-> {1 / med:.1f} ticks/s, {med:.3f} of the 1 s budget"
        )
    if args.db == "sqlite":
        loads, full = time_db_tick(args.nodes, args.queued, args.ticks)
        print(f"  beater alone, snapshot from SQLite: median {statistics.median(loads) * 1000:.0f} ms")
        print(
            f"  service tick on SQLite (load + plan + apply, first tick places ~all nodes, later ones full): "
            f"median {statistics.median(full) * 1000:.0f} ms, max {max(full) * 1000:.0f} ms"
        )


if __name__ == "__main__":
    main()
