"""Store.run on a real SQLite file and a real PostgreSQL: serializable, retried on conflict, rolled back."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable

import pytest
import sqlalchemy
from sqlalchemy import text
from sqlalchemy.orm import Session

from ff_store import ConflictRetry, Store, TransactionConflict, db_now, is_retryable

MakeStore = Callable[..., Store]

# SQLite waits this long for the lock before "database is locked"; short, so conflicts are quick.
SHORT_BUSY_TIMEOUT_MS = 20
FAST_RETRIES = ConflictRetry(max_retries=200, initial_backoff_s=0.001, max_backoff_s=0.02)


def read_counter(session: Session) -> int:
    value: int = session.execute(text("SELECT value FROM counters WHERE name = 'c'")).scalar_one()
    return value


def write_counter(session: Session, value: int) -> None:
    session.execute(text("UPDATE counters SET value = :value WHERE name = 'c'"), {"value": value})


def increment(session: Session) -> int:
    # Read-modify-write in Python: without serializable transactions, concurrent increments get lost.
    value = read_counter(session) + 1
    write_counter(session, value)
    return value


def lose_to_concurrent_writer(store: Store, session: Session) -> None:
    """Makes ``session``'s transaction lose to a concurrent one: the database aborts it as retryable."""
    if store.engine.dialect.name == "sqlite":
        # Another connection holds the write lock when the session's BEGIN IMMEDIATE runs.
        database = store.engine.url.database
        assert database is not None
        holder = sqlite3.connect(database, isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")
            read_counter(session)
        finally:
            holder.close()
    else:
        # Another transaction updates the row after the session's snapshot and before its update.
        value = read_counter(session)
        with store.engine.connect() as other, other.begin():
            other.execute(text("UPDATE counters SET value = value + 1000 WHERE name = 'c'"))
        write_counter(session, value + 1)


def test_concurrent_increments_are_all_kept(make_store: MakeStore) -> None:
    store = make_store(sqlite_busy_timeout_ms=0, retry_policy=FAST_RETRIES)
    num_threads, num_increments = 2, 50
    num_attempts = 0
    attempts_lock = threading.Lock()
    start = threading.Barrier(num_threads)
    # On PostgreSQL each thread's first transaction reads, then waits for the other's to have read too: both write
    # the same value, so one of them must lose and be run again (without it the threads may happen never to
    # overlap). SQLite's write transactions take the write lock when they begin: the second one waits there.
    both_read = threading.Barrier(num_threads, timeout=30)
    first = threading.local()
    rendezvous = store.engine.dialect.name == "postgresql"
    errors: list[BaseException] = []

    def counted_increment(session: Session) -> int:
        nonlocal num_attempts
        with attempts_lock:
            num_attempts += 1
        if not rendezvous or getattr(first, "done", False):
            return increment(session)
        first.done = True
        value = read_counter(session) + 1
        both_read.wait()
        write_counter(session, value)
        return value

    def worker() -> None:
        start.wait()
        try:
            for _ in range(num_increments):
                store.run(counted_increment)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=worker) for _ in range(num_threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert store.run(read_counter, read_only=True) == num_threads * num_increments
    # Some increments lost to the other thread and were run again: the retry did the work.
    assert num_attempts > num_threads * num_increments


def test_conflicted_transaction_is_retried_until_it_commits(make_store: MakeStore) -> None:
    store = make_store(sqlite_busy_timeout_ms=SHORT_BUSY_TIMEOUT_MS)
    num_conflicts = 2
    num_attempts = 0

    def increment_after_conflicts(session: Session) -> int:
        nonlocal num_attempts
        num_attempts += 1
        if num_attempts <= num_conflicts:
            lose_to_concurrent_writer(store, session)
        return increment(session)

    result = store.run(increment_after_conflicts, retries=num_conflicts)

    assert num_attempts == num_conflicts + 1
    # On PostgreSQL the concurrent writer committed +1000 each time; on SQLite it wrote nothing.
    expected = 1 + (1000 * num_conflicts if store.engine.dialect.name == "postgresql" else 0)
    assert result == expected
    assert store.run(read_counter) == expected


def test_retries_exhausted_raise_transaction_conflict(make_store: MakeStore) -> None:
    store = make_store(sqlite_busy_timeout_ms=SHORT_BUSY_TIMEOUT_MS)
    num_attempts = 0

    def always_conflicts(session: Session) -> None:
        nonlocal num_attempts
        num_attempts += 1
        lose_to_concurrent_writer(store, session)

    with pytest.raises(TransactionConflict) as caught:
        store.run(always_conflicts, retries=2)

    assert num_attempts == 3
    assert caught.value.num_attempts == 3
    assert caught.value.__cause__ is not None
    assert is_retryable(caught.value.__cause__)


def test_other_errors_roll_back_and_are_not_retried(store: Store) -> None:
    num_attempts = 0

    def increment_then_fail(session: Session) -> None:
        nonlocal num_attempts
        num_attempts += 1
        increment(session)
        raise KeyError("no such chain")

    with pytest.raises(KeyError, match="no such chain"):
        store.run(increment_then_fail)

    assert num_attempts == 1
    assert store.run(read_counter) == 0


def test_constraint_violation_is_not_retried(store: Store) -> None:
    num_attempts = 0

    def insert_orphan_note(session: Session) -> None:
        nonlocal num_attempts
        num_attempts += 1
        increment(session)
        session.execute(text("INSERT INTO notes (counter_name, body) VALUES ('missing', 'orphan')"))

    with pytest.raises(sqlalchemy.exc.IntegrityError):
        store.run(insert_orphan_note)

    assert num_attempts == 1
    assert store.run(read_counter) == 0


def test_read_only_transaction_rejects_writes(store: Store) -> None:
    with pytest.raises(sqlalchemy.exc.DBAPIError, match=r"read-?only"):
        store.run(increment, read_only=True)

    assert store.run(read_counter, read_only=True) == 0
    # query_only / READ ONLY does not stick to the pooled connection: the next writer succeeds.
    assert store.run(increment) == 1


def test_read_only_transaction_sees_one_snapshot_and_blocks_no_writer(store: Store) -> None:
    def read_around_a_write(session: Session) -> tuple[int, int]:
        before = read_counter(session)
        store.run(increment, retries=0)  # another transaction, on another connection
        return before, read_counter(session)

    assert store.run(read_around_a_write, read_only=True) == (0, 0)
    assert store.run(read_counter) == 1


async def test_arun_runs_in_a_worker_thread(store: Store) -> None:
    def increment_in_thread(session: Session) -> tuple[int, bool]:
        return increment(session), threading.current_thread() is threading.main_thread()

    assert await store.arun(increment_in_thread) == (1, False)
    assert await store.arun(read_counter, read_only=True) == 1


def test_db_now_is_the_wall_clock_with_sub_second_resolution(store: Store) -> None:
    def two_readings(session: Session) -> tuple[float, float]:
        first = db_now(session)
        time.sleep(0.02)
        return first, db_now(session)

    before = time.time()
    first, second = store.run(two_readings)
    after = time.time()

    # Same machine, so the database's clock is ours (SQLite's has millisecond resolution).
    assert before - 0.002 <= first <= second <= after + 0.002
    # It advances inside one transaction (PostgreSQL's now() would not), by the sleep, not by seconds.
    assert 0.015 <= second - first < 0.5
