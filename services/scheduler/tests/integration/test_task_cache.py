"""The tick's in-memory queued tasks (``TaskCache``) against the database, which stays the truth.

A real store (SQLite, PostgreSQL) and a real ``Scheduler`` (its agents' address refuses: the orders fail and are
retried, as with agents that are down). After every tick and every change made the way the RPCs make it, the
snapshot the next tick would plan from equals a full read of the database; a restarted scheduler reads the same.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from ff_scheduler.agents import AgentPool
from ff_scheduler.app import DriverOptions, Scheduler
from ff_scheduler.core import priority as p
from ff_scheduler.core.model import Snapshot, TaskState
from ff_scheduler.core.policy import LifecyclePolicy, SchedulingPolicy
from ff_scheduler.core.validation import CheckedTask
from ff_scheduler.server import MIGRATIONS
from ff_scheduler.store import ops
from ff_scheduler.store.schema import VERSION_TABLE
from ff_scheduler.store.ticks import load_snapshot
from ff_scheduler.txn import Transactions
from ff_store import Store, open_store

pytestmark = pytest.mark.integration

NOW = 1_000.0


def _task(num_nodes: int, level: int | None) -> CheckedTask:
    return CheckedTask(
        name="t",
        spec={"argv": ["true"]},
        num_nodes=num_nodes,
        asked_priority=level,
        node_group="default",
        watchdog_time_s=1800.0,
        max_restarts=1,
        suspend_grace_s=0.0,
        whole_life_state=0,
    )


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[Store]:
    store = await asyncio.to_thread(open_store, db_url, MIGRATIONS, VERSION_TABLE)
    for node_id in range(1, 5):
        values = {
            "node_id": node_id,
            "hostname": f"n{node_id}",
            "agent_address": "127.0.0.1:1",
            "master_ip": "127.0.0.1",
            "node_group": "default",
            "zone": "",
            "devices": [],
            "num_cpus": 1,
            "memory_bytes": 0,
        }
        store.run(lambda s, v=values: ops.register_node(s, v, [], NOW))  # type: ignore[misc]
    yield store
    store.dispose()


def _scheduler(store: Store) -> tuple[Scheduler, Transactions]:
    txns = Transactions(store)
    options = DriverOptions(tick_interval_s=1.0, master_port=2222, order_resend_interval_s=60.0)
    agents = AgentPool("", timeout_s=1.0)
    return Scheduler(txns, SchedulingPolicy(), LifecyclePolicy(), options, agents, clock=lambda: NOW), txns


async def _stop(scheduler: Scheduler, txns: Transactions) -> None:
    """Let the orders in flight fail and the transactions end, then close the agents' channels."""
    while scheduler._inflight:
        await asyncio.gather(*scheduler._inflight, return_exceptions=True)
    await txns.drain(timeout_s=10.0)
    await scheduler.agents.close()


def _next(txns: Transactions) -> Snapshot:
    """What the next tick plans from (the cache with what was marked changed), and a full read: they must agree."""
    cached = txns.store.run(lambda s: txns.tasks.load(s, NOW)[0], read_only=True)
    full = txns.store.run(lambda s: load_snapshot(s, NOW), read_only=True)
    assert cached == full
    return cached


async def test_the_kept_tasks_follow_every_change_and_a_restart_reads_the_same(store: Store) -> None:
    scheduler, txns = _scheduler(store)
    for user in ("alice", "bob"):
        for level in (p.LOW, p.NORMAL, p.HIGH):
            await txns.arun(lambda s, u=user, lvl=level: ops.set_quota(s, u, lvl, "default", 4))  # type: ignore[misc]
    ids = [
        await txns.arun(lambda s, n=n, lvl=lvl: ops.submit_task(s, "alice", 1000, _task(n, lvl), "", NOW, "default"))  # type: ignore[misc]
        for n, lvl in [(2, p.NORMAL), (2, p.LOW), (4, None), (1, p.HIGH), (3, p.NORMAL)]
    ]
    await scheduler.load()
    _next(txns)
    await scheduler.tick()  # the AUTO task takes HIGH (alice's first quota that fits) and every node
    snap = _next(txns)
    states = {t.task_id: t.state for t in snap.tasks}
    assert states[ids[2]] is TaskState.RUNNING
    assert all(t.queue_reason for t in snap.tasks if t.run is None)

    # Changes the RPCs make: a new task, a queued task's priority, a queued task stopped, a quota.
    new = await txns.arun(lambda s: ops.submit_task(s, "bob", 1001, _task(1, p.HIGH), "", NOW, "default"))
    await txns.arun(lambda s: ops.set_task_priority(s, ids[1], None, p.HIGH))
    await txns.arun(lambda s: ops.stop_task(s, ids[4], None, "alice", NOW))
    await txns.arun(lambda s: ops.set_quota(s, "alice", p.LOW, "default", 0))
    snap = _next(txns)
    by_id = {t.task_id: t for t in snap.tasks}
    assert new in by_id and ids[4] not in by_id and by_id[ids[1]].asked_priority == p.HIGH
    await scheduler.tick()
    _next(txns)
    await scheduler.tick()
    before = _next(txns)
    await _stop(scheduler, txns)

    # A restarted scheduler (a new process: nothing kept) reads the same state.
    restarted, txns2 = _scheduler(store)
    await restarted.load()
    assert _next(txns2) == before
    await restarted.tick()
    _next(txns2)
    await _stop(restarted, txns2)
