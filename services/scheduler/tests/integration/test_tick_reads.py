"""The tick's driver-level reads (``store.ticks``) give the core exactly what SQLAlchemy's typed reads give.

The tick reads nodes, active runs, their reports, tasks and the wanted orders as driver rows (SQLite gives booleans
as 0/1 and JSON as text, psycopg decodes JSON itself). Random database states (nodes online or not, disabled or
failing; runs in every state with and without failures, checkpoints and reports; tasks in every state; quotas)
are read both ways on SQLite and PostgreSQL: the snapshots and orders must be equal, and so the plans made from them.
"""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import delete, insert, select
from sqlalchemy.orm import Session

from ff_scheduler.core import priority as p
from ff_scheduler.core.model import NodePhase, NodeRunReport, NodeView, RunState, Snapshot, TaskSnap
from ff_scheduler.core.policy import LifecyclePolicy, SchedulingPolicy
from ff_scheduler.core.tick import plan_tick
from ff_scheduler.server import MIGRATIONS
from ff_scheduler.store.schema import VERSION_TABLE, nodes, quotas, run_nodes, runs, tasks
from ff_scheduler.store.ticks import (
    ACTIVE,
    QUEUED_STATES,
    UNFINISHED,
    _run_snap,
    _task_snap,
    failure_from_json,
    load_snapshot,
    node_state,
    wanted_orders,
)
from ff_store import Store, open_store

pytestmark = pytest.mark.integration

NOW = 50_000.0
NUM_STATES = 12


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[Store]:
    store = await asyncio.to_thread(open_store, db_url, MIGRATIONS, VERSION_TABLE)
    yield store
    store.dispose()


def _failure(rng: random.Random) -> dict[str, Any] | None:
    if rng.random() < 0.6:
        return None
    return {"failure_class": rng.choice([0, 1, 2, 3, 9]), "node_id": rng.randint(1, 9), "message": "m", "hang": True}


def _fill(s: Session, rng: random.Random) -> None:
    """A random state: rows written through SQLAlchemy, as the service's ops write them."""
    for table in (run_nodes, runs, tasks, nodes, quotas):
        s.execute(delete(table))
    node_ids = list(range(1, rng.randint(2, 30)))
    s.execute(
        insert(nodes),
        [
            {
                "node_id": n,
                "hostname": f"n{n}",
                "agent_address": f"10.0.0.{n}:7000",
                "master_ip": "10.0.0.1",
                "node_group": rng.choice(["default", "a"]),
                "zone": rng.choice(["", "z1", "z2"]),
                "devices": [{"index": i} for i in range(rng.randint(0, 3))],
                "num_cpus": 4,
                "memory_bytes": 0,
                "online": rng.random() < 0.8,
                "disabled_reason": rng.choice(["", "", "admin"]),
                "err_reason": rng.choice(["", "", "failures"]),
                "num_failures": rng.randint(0, 3),
                "registered_at": 0.0,
                "last_report_at": 0.0,
                "validation": None,
            }
            for n in node_ids
        ],
    )
    for task_id in range(1, rng.randint(2, 40)):
        state = rng.randint(1, 6)
        s.execute(
            insert(tasks).values(
                task_id=task_id,
                user_name=rng.choice(["alice", "bob"]),
                uid=1000,
                request_id=None,
                name="t",
                spec={"argv": ["true"]},
                num_nodes=rng.randint(1, 4),
                asked_priority=rng.choice([None, p.LOW, p.HIGH]),
                priority=rng.choice([None, p.LOW, p.NORMAL, p.HIGH]),
                node_group="default",
                state=state,
                queue_reason=rng.randint(0, 3),
                whole_life_state=0,
                watchdog_time_s=rng.choice([60.0, 1800.0]),
                max_restarts=rng.randint(0, 2),
                suspend_grace_s=rng.choice([0.0, 30.0]),
                num_runs=1,
                num_restarts=rng.randint(0, 2),
                created_at=0.0,
                first_started_at=0.0,
                finished_at=0.0,
                end_reason=0,
                end_message="",
            )
        )
        if rng.random() < 0.5:
            continue
        on = rng.sample(node_ids, rng.randint(1, min(4, len(node_ids))))
        run_state = rng.randint(1, 8)
        checkpoint = rng.choice([None, {"committed_at": NOW - 10, "taken_at": NOW - 20}, {"committed_at": 5.0}])
        run_id = task_id + 100
        s.execute(
            insert(runs).values(
                run_id=run_id,
                task_id=task_id,
                run_index=0,
                state=run_state,
                priority=rng.choice([p.LOW, p.HIGH]),
                node_ids=on,
                master_address="10.0.0.1:2222",
                start_whole_life_state=0,
                suspend_stage=rng.randint(1, 4),
                suspend_requested_at=rng.choice([0.0, NOW - 100]),
                suspend_received_at=0.0,
                stop_requested_at=rng.choice([0.0, NOW - 50]),
                stop_reason=rng.randint(0, 10),
                ack_window_s=5.0,
                grace_s=60.0,
                created_at=NOW - 3000,
                started_at=rng.choice([0.0, NOW - 2000]),
                ended_at=0.0,
                end_reason=0,
                end_message=rng.choice(["", "asked"]),
                failure=_failure(rng),
                checkpoint=checkpoint,
            )
        )
        for rank, n in enumerate(on):
            if rng.random() < 0.9:
                s.execute(
                    insert(run_nodes).values(
                        run_id=run_id,
                        node_id=n,
                        node_rank=rank,
                        phase=rng.randint(0, 5),
                        last_output_at=rng.choice([0.0, NOW - 5]),
                        reported_at=0.0,
                        failure=_failure(rng),
                    )
                )
    for user in ("alice", "bob"):
        s.execute(
            insert(quotas).values(user_name=user, priority=p.LOW, node_group="default", max_nodes=rng.randint(0, 9))
        )


def _typed_snapshot(s: Session) -> Snapshot:
    """The snapshot through SQLAlchemy's typed reads (what the tick read before its driver-level reads)."""
    views = {
        r.node_id: NodeView(
            node_id=r.node_id, group=r.node_group, zone=r.zone, state=node_state(r), num_failures=r.num_failures
        )
        for r in s.execute(select(nodes))
    }
    reports: dict[int, dict[int, NodeRunReport]] = defaultdict(dict)
    # The same query as the tick's (the core meets a run's reports in this order: it breaks ties by it).
    active_runs = select(runs.c.run_id).where(runs.c.state.in_(ACTIVE))
    for r in s.execute(select(run_nodes).where(run_nodes.c.run_id.in_(active_runs))):
        reports[r.run_id][r.node_id] = NodeRunReport(
            phase=NodePhase(r.phase), last_output_at=r.last_output_at, failure=failure_from_json(r.failure)
        )
    run_by_task = {
        r.task_id: _run_snap(r, reports[r.run_id]) for r in s.execute(select(runs).where(runs.c.state.in_(ACTIVE)))
    }
    snaps: list[TaskSnap] = []
    for r in s.execute(select(tasks).where(tasks.c.state.in_(UNFINISHED)).order_by(tasks.c.task_id)):
        task = _task_snap(r)
        task.run = run_by_task.get(task.task_id)
        snaps.append(task)
    quota_map = {(r.user_name, r.priority, r.node_group): r.max_nodes for r in s.execute(select(quotas))}
    return Snapshot(now=NOW, nodes=views, tasks=snaps, quotas=quota_map)


def _typed_orders(s: Session) -> list[tuple[Any, ...]]:
    query = (
        select(runs.c.run_id, runs.c.task_id, runs.c.state, run_nodes.c.node_id, run_nodes.c.node_rank)
        .add_columns(run_nodes.c.phase, nodes.c.agent_address, nodes.c.online)
        .join(run_nodes, run_nodes.c.run_id == runs.c.run_id)
        .join(nodes, nodes.c.node_id == run_nodes.c.node_id)
        .where(runs.c.state.in_(ACTIVE))
    )
    return sorted(
        (r.run_id, r.task_id, RunState(r.state), r.node_id, r.node_rank, NodePhase(r.phase), r.agent_address, r.online)
        for r in s.execute(query)
    )


async def test_driver_reads_equal_typed_reads_on_random_states(store: Store) -> None:
    sched, life = SchedulingPolicy(min_run_time_s=60), LifecyclePolicy()
    kinds: set[str] = set()
    for seed in range(NUM_STATES):
        rng = random.Random(seed)
        await asyncio.to_thread(store.run, lambda s, rng=rng: _fill(s, rng))

        def both(s: Session) -> tuple[Snapshot, Snapshot, list[tuple[Any, ...]], list[tuple[Any, ...]]]:
            return load_snapshot(s, NOW), _typed_snapshot(s), sorted(wanted_orders(s)), _typed_orders(s)

        read, typed, orders, typed_orders = await asyncio.to_thread(store.run, both, read_only=True)
        assert read == typed, f"seed {seed}"
        assert orders == typed_orders, f"seed {seed}"
        assert plan_tick(read, sched, life) == plan_tick(typed, sched, life), f"seed {seed}"
        for task in read.tasks:
            kinds.add("queued" if task.state in QUEUED_STATES else "with run" if task.run else "other")
            if task.run is not None:
                kinds.update(k for k in ("failure", "checkpoint") if getattr(task.run, k, None))
                kinds.update("report failure" for r in task.run.reports.values() if r.failure)
                kinds.add("checkpoint" if task.run.checkpoint_committed_at else "no checkpoint")
        kinds.update(v.state.name for v in read.nodes.values())
    # The states compared cover what the decoding differs on.
    assert {"queued", "with run", "failure", "report failure", "checkpoint", "no checkpoint"} <= kinds
    assert {"READY", "ERR", "OFFLINE"} <= kinds
