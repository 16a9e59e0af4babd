"""Store.raw_writer on a real SQLite file and a real PostgreSQL: plain statements in the Store's serializable
transactions, committed or rolled back whole, retried on conflict, and a lost connection replaced."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from ff_store import ConflictRetry, RawTransaction, Store, TransactionConflict, create_engine, run_migrations
from ff_store.raw import DRIVER_ERRORS

MakeStore = Callable[..., Store]

FAST_RETRIES = ConflictRetry(max_retries=200, initial_backoff_s=0.001, max_backoff_s=0.02)


def read_counter(session: Session) -> int:
    value: int = session.execute(text("SELECT value FROM counters WHERE name = 'c'")).scalar_one()
    return value


def increment(session: Session) -> int:
    value = read_counter(session) + 1
    session.execute(text("UPDATE counters SET value = :value WHERE name = 'c'"), {"value": value})
    return value


def raw_read(tx: RawTransaction) -> int:
    tx.execute("SELECT value FROM counters WHERE name = 'c'")
    value: int = tx.cursor.fetchone()[0]
    return value


def raw_add(tx: RawTransaction, amount: int) -> int:
    value = raw_read(tx) + amount  # read-modify-write in Python: only serializable transactions keep every add
    tx.execute(f"UPDATE counters SET value = {tx.mark} WHERE name = 'c'", (value,))
    return value


def test_statements_commit_together_or_not_at_all(store: Store) -> None:
    writer = store.raw_writer()
    try:
        assert writer.run(lambda tx: raw_add(tx, 5)) == 5

        def add_then_fail(tx: RawTransaction) -> None:
            raw_add(tx, 100)
            raise KeyError("no such series")

        with pytest.raises(KeyError, match="no such series"):
            writer.run(add_then_fail)

        def insert_notes(tx: RawTransaction) -> None:
            sql = f"INSERT INTO notes (counter_name, body) VALUES ({tx.mark}, {tx.mark})"
            tx.executemany(sql, [("c", "first"), ("missing", "orphan")])

        with pytest.raises(DRIVER_ERRORS):  # the second note has no counter: the first is rolled back too
            writer.run(insert_notes)
        assert writer.run(raw_read) == 5  # the writer goes on after both failures
        assert store.run(read_counter) == 5
        assert store.run(lambda s: int(s.execute(text("SELECT COUNT(*) FROM notes")).scalar_one())) == 0
    finally:
        writer.close()
    with pytest.raises(RuntimeError, match="closed"):
        writer.run(raw_read)


def test_concurrent_writers_keep_every_update(make_store: MakeStore) -> None:
    store = make_store(sqlite_busy_timeout_ms=0, retry_policy=FAST_RETRIES)
    writer = store.raw_writer()
    num_adds = 40
    errors: list[BaseException] = []

    def session_adds() -> None:
        try:
            for _ in range(num_adds):
                store.run(increment)
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=session_adds)
    thread.start()
    try:
        for _ in range(num_adds):
            writer.run(lambda tx: raw_add(tx, 1000))
    finally:
        thread.join()
        writer.close()
    assert errors == []
    assert store.run(read_counter) == num_adds * 1001


def test_a_conflict_is_retried_and_exhausted_retries_raise(make_store: MakeStore) -> None:
    store = make_store(sqlite_busy_timeout_ms=0, retry_policy=FAST_RETRIES)
    writer = store.raw_writer()
    try:
        if store.engine.dialect.name == "sqlite":
            # Another connection holds the write lock: the writer's BEGIN IMMEDIATE is refused, and retried.
            database = store.engine.url.database
            assert database is not None
            holder = sqlite3.connect(database, isolation_level=None, check_same_thread=False)
            holder.execute("BEGIN IMMEDIATE")
            with pytest.raises(TransactionConflict):
                writer.run(lambda tx: raw_add(tx, 1), retries=2)
            releaser = threading.Timer(0.05, holder.rollback)
            releaser.start()
            try:
                assert writer.run(lambda tx: raw_add(tx, 1)) == 1  # waited the holder out by retrying
            finally:
                releaser.join()
                holder.close()
            assert store.run(read_counter) == 1
            return
        # PostgreSQL: another transaction updates the row after the writer read it, twice.
        num_attempts = 0

        def add_after_conflicts(tx: RawTransaction) -> int:
            nonlocal num_attempts
            num_attempts += 1
            value = raw_read(tx)
            if num_attempts <= 2:
                with store.engine.connect() as other, other.begin():
                    other.execute(text("UPDATE counters SET value = value + 1000 WHERE name = 'c'"))
            tx.execute(f"UPDATE counters SET value = {tx.mark} WHERE name = 'c'", (value + 1,))
            return value + 1

        assert writer.run(add_after_conflicts) == 2001
        assert num_attempts == 3
        assert store.run(read_counter) == 2001
        num_attempts = -10  # every attempt conflicts
        with pytest.raises(TransactionConflict):
            writer.run(add_after_conflicts, retries=2)
        assert num_attempts == -7
        assert store.run(read_counter) == 5001
    finally:
        writer.close()


def test_a_writer_reuses_a_connection_left_read_only(sqlite_url: str) -> None:
    engine = create_engine(sqlite_url)
    run_migrations(engine, Path(__file__).parent / "migrations", "ff_store_test_alembic_version")
    store = Store(engine)
    with engine.begin() as connection:
        connection.exec_driver_sql("INSERT INTO counters (name, value) VALUES ('c', 0)")
    assert store.run(read_counter, read_only=True) == 0  # leaves PRAGMA query_only = ON on the pooled connection
    writer = store.raw_writer()
    try:
        assert writer.run(lambda tx: raw_add(tx, 3)) == 3
    finally:
        writer.close()
        store.dispose()


def test_a_lost_connection_is_replaced(make_store: MakeStore) -> None:
    store = make_store()
    if store.engine.dialect.name != "postgresql":
        pytest.skip("a SQLite file has no server to drop the connection")
    writer = store.raw_writer()
    try:
        assert writer.run(lambda tx: raw_add(tx, 1)) == 1

        def backend_pid(tx: RawTransaction) -> int:
            tx.execute("SELECT pg_backend_pid()")
            pid: int = tx.cursor.fetchone()[0]
            return pid

        first = writer.run(backend_pid)
        with store.engine.connect() as other:
            other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": first})
        assert writer.run(lambda tx: raw_add(tx, 1)) == 2  # run again on a new connection: nothing was committed
        assert writer.run(backend_pid) != first
        assert store.run(read_counter) == 2
    finally:
        writer.close()
