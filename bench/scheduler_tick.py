"""Tick time of the scheduler at HAI scale (issue 24: 10,000 nodes, 100,000 queued tasks, every tick <= 1 s).

Usage: python bench/scheduler_tick.py [--nodes 1250] [--queued 10000] [--ticks 5] [--db sqlite|none]
       [--aged-ticks 2]

Times the pure pipeline (beater -> assigner -> matcher, ``core.tick.plan_tick``) on a full cluster
(every node busy, so every queued task is checked for quota, free nodes and preemption victims) and
on an empty one (the first tick places as many tasks as fit). With ``--db sqlite`` (issue 24's bar:
10,000 nodes, 100,000 queued tasks, every service tick <= 1 s) it times what the service runs on a
SQLite file holding that many tasks: a full read of the snapshot; a ``Scheduler`` started on it (its
load of the tasks at start, then each ``Scheduler.tick``: load what changed, plan, apply, the agents'
orders, which agents that accept at once receive); and a second ``Scheduler`` started on the state the
first left (a restart or failover), whose last ticks (``--aged-ticks``) come after every run reported running
and ran past the minimum run time, so that each may be preempted. Prints each tick's time and the max against
1 s; never fails on time.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ff_scheduler.agents import AgentPool
from ff_scheduler.app import DriverOptions, Scheduler
from ff_scheduler.core import priority as p
from ff_scheduler.core.builders import nodes, queued, running, snapshot
from ff_scheduler.core.model import Snapshot, TaskSnap
from ff_scheduler.core.policy import LifecyclePolicy, SchedulingPolicy
from ff_scheduler.core.tick import plan_tick
from ff_scheduler.txn import Transactions
from fireflyer.agent.v1 import agent_pb2

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


def fill_db(store: Any, snap: Snapshot) -> None:
    """Store ``snap``'s nodes, tasks (all queued, never run) and quotas as the service's tables."""
    from sqlalchemy import insert

    from ff_scheduler.store.schema import nodes as nodes_table
    from ff_scheduler.store.schema import quotas as quotas_table
    from ff_scheduler.store.schema import tasks as tasks_table

    def fill(s: Any) -> None:
        s.execute(
            insert(nodes_table),
            [
                {
                    "node_id": n.node_id,
                    "hostname": f"n{n.node_id}",
                    "agent_address": f"n{n.node_id}:1",
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


@dataclass
class ServiceRun:
    """One scheduler process on the database: its load of the tasks at start, then each tick (seconds)."""

    load: float
    ticks: list[float]
    placed: int
    # CPU seconds of the process (every thread) during each tick: what the tick costs whatever else runs.
    cpu: list[float] = field(default_factory=list)
    # Ticks (and their CPU) after every run reported running and ran past the minimum run time (preemptible).
    aged: list[float] = field(default_factory=list)
    aged_cpu: list[float] = field(default_factory=list)


class _Agents(AgentPool):
    """Agents that accept every order at once (the bench times the scheduler, not the network)."""

    def __init__(self) -> None:
        super().__init__("", 1.0)
        self.orders = 0

    async def start_run(self, address: str, request: agent_pb2.StartRunRequest) -> agent_pb2.StartRunResponse:
        self.orders += 1
        return agent_pb2.StartRunResponse()

    async def suspend_run(self, address: str, request: agent_pb2.SuspendRunRequest) -> agent_pb2.SuspendRunResponse:
        self.orders += 1
        return agent_pb2.SuspendRunResponse()

    async def stop_run(self, address: str, request: agent_pb2.StopRunRequest) -> agent_pb2.StopRunResponse:
        self.orders += 1
        return agent_pb2.StopRunResponse()


MIN_RUN_TIME_S = 600.0


class _Clock:
    """The schedulers' clock: epoch 100,000 s plus the time since the bench began, plus what ``skip`` added."""

    def __init__(self) -> None:
        self._t0 = time.perf_counter()
        self._skipped = 0.0

    def __call__(self) -> float:
        return 100_000.0 + time.perf_counter() - self._t0 + self._skipped

    def skip(self, seconds: float) -> None:
        self._skipped += seconds


async def _timed_tick(scheduler: Scheduler, times: list[float], cpu: list[float]) -> int:
    cpu0 = time.process_time()
    stats = await scheduler.tick()
    cpu.append(time.process_time() - cpu0)
    times.append(stats.duration_s)
    await asyncio.sleep(0.05)  # the orders of the tick go out (one read, then a call per node) between ticks
    return stats.num_started


def _report_all_running(s: Any, now: float) -> None:
    """What the agents' reports would store: every node of every run running, with output just now."""
    from sqlalchemy import update

    from ff_scheduler.store.schema import run_nodes

    s.execute(update(run_nodes).values(phase=2, last_output_at=now, reported_at=now))


async def _service_run(store: Any, ticks: int, clock: _Clock, aged_ticks: int = 0) -> ServiceRun:
    """A scheduler started on ``store``: ``Scheduler.load`` (what ``run`` does first), then ``ticks`` ticks.

    With ``aged_ticks``, then every run's nodes report running, one tick marks the runs running, the clock skips
    past the minimum run time (every run may now be preempted) and ``aged_ticks`` more ticks are timed.
    """
    txns = Transactions(store)
    options = DriverOptions(tick_interval_s=1.0, master_port=2222, order_resend_interval_s=30.0)
    agents = _Agents()
    policy = SchedulingPolicy(min_run_time_s=MIN_RUN_TIME_S)
    scheduler = Scheduler(txns, policy, LifecyclePolicy(), options, agents, clock=clock)
    t0 = time.perf_counter()
    await scheduler.load()
    run = ServiceRun(time.perf_counter() - t0, [], 0)
    for _ in range(ticks):
        run.placed += await _timed_tick(scheduler, run.ticks, run.cpu)
    if aged_ticks:
        await txns.arun(lambda s: _report_all_running(s, clock()))
        await _timed_tick(scheduler, [], [])
        clock.skip(MIN_RUN_TIME_S + 1.0)
        for _ in range(aged_ticks):
            await _timed_tick(scheduler, run.aged, run.aged_cpu)
    await txns.drain(timeout_s=600.0)
    await agents.close()
    txns.dispose()
    return run


def time_service(
    num_nodes: int, num_queued: int, ticks: int, aged_ticks: int
) -> tuple[list[float], ServiceRun, ServiceRun, int]:
    """The service on a SQLite file: 100,000 queued tasks, every node idle; then a restart (failover) on that state.

    The restarted scheduler then times ``aged_ticks`` ticks after every run reported running and ran past the
    minimum run time (``_service_run``).

    Returns the full snapshot read's times, the first scheduler, the restarted one, and the nodes given runs.
    """
    from sqlalchemy import func, select

    from ff_scheduler.server import MIGRATIONS
    from ff_scheduler.store.schema import VERSION_TABLE, run_nodes
    from ff_scheduler.store.ticks import load_snapshot
    from ff_store import open_store

    snap = build(num_nodes, num_queued, busy=False)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        store = open_store(url, MIGRATIONS, VERSION_TABLE)
        fill_db(store, snap)
        del snap  # the service process holds only what it reads
        loads = []
        for _ in range(ticks):
            t0 = time.perf_counter()
            store.run(lambda s: load_snapshot(s, 100_000.0), read_only=True)
            loads.append(time.perf_counter() - t0)
        clock = _Clock()
        first = asyncio.run(_service_run(store, ticks, clock))
        # Failover: a new scheduler process opens the same database and goes on from what is stored.
        store = open_store(url, MIGRATIONS, VERSION_TABLE)
        busy = store.run(lambda s: s.execute(select(func.count()).select_from(run_nodes)).scalar_one())
        restarted = asyncio.run(_service_run(store, ticks, clock, aged_ticks))
    return loads, first, restarted, busy


def _ms(times: list[float]) -> str:
    return ", ".join(f"{t * 1000:.0f}" for t in times)


def _bar(times: list[float]) -> str:
    return f"max {max(times) * 1000:.0f} ms {'<=' if max(times) <= 1.0 else '>'} 1 s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1250)
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--ticks", type=int, default=5)
    parser.add_argument("--db", choices=["sqlite", "none"], default="sqlite")
    parser.add_argument(
        "--aged-ticks", type=int, default=2, help="restarted scheduler's ticks once every run may be preempted"
    )
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
        loads, first, restarted, num_busy = time_service(args.nodes, args.queued, args.ticks, args.aged_ticks)
        print(
            f"  every unfinished task read from SQLite (load_snapshot): median {statistics.median(loads) * 1000:.0f} ms"
        )
        print(f"  service (Scheduler on SQLite, all nodes idle): load at start {first.load * 1000:.0f} ms")
        print(
            f"    each tick (Scheduler.tick; {first.placed} tasks placed on {num_busy} nodes): {_ms(first.ticks)} ms; "
            f"{_bar(first.ticks)}; CPU: {_ms(first.cpu)} ms"
        )
        print(f"  restart (failover) on that state: load at start {restarted.load * 1000:.0f} ms")
        print(f"    each tick: {_ms(restarted.ticks)} ms; {_bar(restarted.ticks)}; CPU: {_ms(restarted.cpu)} ms")
        if restarted.aged:
            print(
                f"  every run running past the minimum run time ({MIN_RUN_TIME_S:g} s; all may be preempted): "
                f"{_ms(restarted.aged)} ms; {_bar(restarted.aged)}; CPU: {_ms(restarted.aged_cpu)} ms"
            )


if __name__ == "__main__":
    main()
