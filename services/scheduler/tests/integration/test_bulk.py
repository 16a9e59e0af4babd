"""The tick's driver-level batched writes (``store.bulk``) on a real SQLite file and PostgreSQL database.

They must store what SQLAlchemy's own statements store (the same values, JSON as SQLAlchemy's JSON type writes
it) and touch exactly the rows named, whether named by ranges of consecutive ids or one by one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from ff_scheduler.core.validation import CheckedTask
from ff_scheduler.server import MIGRATIONS
from ff_scheduler.store import bulk, ops
from ff_scheduler.store.schema import VERSION_TABLE, run_nodes, tasks
from ff_store import Store, open_store

pytestmark = pytest.mark.integration


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[Store]:
    store = await asyncio.to_thread(open_store, db_url, MIGRATIONS, VERSION_TABLE)
    yield store
    store.dispose()


def _submit(s: Session, count: int) -> list[int]:
    """``count`` queued tasks, stored the way SubmitTask stores them; their ids."""
    checked = CheckedTask(
        name="t",
        spec={"argv": ["true"]},
        num_nodes=1,
        asked_priority=None,
        node_group="default",
        watchdog_time_s=1800.0,
        max_restarts=0,
        suspend_grace_s=0.0,
        whole_life_state=0,
    )
    return [ops.submit_task(s, "u", 1000, checked, "", 0.0, "default") for _ in range(count)]


async def test_update_ids_sets_exactly_the_rows_named(store: Store) -> None:
    all_ids = await asyncio.to_thread(store.run, lambda s: _submit(s, 200))
    assert all_ids == list(range(1, 201))
    # Runs of every length around MIN_RANGE, single ids, and gaps: the ids named and only those change.
    named = [i for i in all_ids if i % 17 not in (3, 4) and i % 29 != 0 and i not in (50, 52, 54)]

    def run(s: Session) -> list[tuple[int, int, int | None]]:
        bulk.update_ids(s, tasks, "task_id", {"queue_reason": 2, "priority": 30}, named)
        bulk.update_rows(s, tasks, "task_id", ("queue_reason", "end_message"), [(3, "x", 52), (1, "y'z", 54)])
        query = select(tasks.c.task_id, tasks.c.queue_reason, tasks.c.priority).order_by(tasks.c.task_id)
        return [(r.task_id, r.queue_reason, r.priority) for r in s.execute(query)]

    rows = await asyncio.to_thread(store.run, run)
    expected = [(i, 2, 30) if i in named else (i, 0, None) for i in all_ids]
    expected[51] = (52, 3, None)
    expected[53] = (54, 1, None)
    assert rows == expected
    messages = await asyncio.to_thread(
        store.run,
        lambda s: {
            r[0]: r[1] for r in s.execute(select(tasks.c.task_id, tasks.c.end_message).where(tasks.c.task_id > 51))
        },
    )
    assert (messages[52], messages[54], messages[53]) == ("x", "y'z", "")


async def test_insert_rows_store_what_sqlalchemy_stores(store: Store) -> None:
    failure = {"failure_class": 2, "node_id": 7, "message": "lost"}

    def run(s: Session) -> list[tuple[Any, ...]]:
        row = {"node_rank": 0, "phase": 0, "last_output_at": 1.5, "reported_at": 0.0}
        s.execute(insert(run_nodes), [{"run_id": 1, "node_id": 1, **row, "failure": None}])
        s.execute(insert(run_nodes), [{"run_id": 1, "node_id": 2, **row, "failure": failure}])
        columns = ("run_id", "node_id", "node_rank", "phase", "last_output_at", "reported_at", "failure")
        bulk.insert_rows(
            s,
            run_nodes,
            columns,
            [(2, 1, 0, 0, 1.5, 0.0, bulk.as_json(None)), (2, 2, 0, 0, 1.5, 0.0, bulk.as_json(failure))],
        )
        query = select(run_nodes.c.run_id, run_nodes.c.node_id, run_nodes.c.failure, run_nodes.c.last_output_at)
        return [tuple(r) for r in s.execute(query.order_by(run_nodes.c.run_id, run_nodes.c.node_id))]

    rows = await asyncio.to_thread(store.run, run)
    assert rows == [(1, 1, None, 1.5), (1, 2, failure, 1.5), (2, 1, None, 1.5), (2, 2, failure, 1.5)]


async def test_unknown_column_is_refused(store: Store) -> None:
    with pytest.raises(ValueError, match="no column nope in sched_tasks"):
        await asyncio.to_thread(store.run, lambda s: bulk.update_rows(s, tasks, "task_id", ("nope",), [(1, 2)]))
