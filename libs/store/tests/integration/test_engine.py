"""create_engine's settings, checked on the live connections they produce."""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy
from sqlalchemy import text

from ff_store import create_engine


def test_sqlite_engine_creates_the_folder_and_sets_its_pragmas(tmp_path: Path) -> None:
    path = tmp_path / "state" / "mgmtd" / "store.db"
    engine = create_engine(f"sqlite:///{path}", sqlite_busy_timeout_ms=1234)
    try:
        with engine.connect() as connection:
            pragmas = {
                name: connection.exec_driver_sql(f"PRAGMA {name}").scalar_one()
                for name in ("journal_mode", "foreign_keys", "busy_timeout", "query_only")
            }
        assert pragmas == {"journal_mode": "wal", "foreign_keys": 1, "busy_timeout": 1234, "query_only": 0}
        assert path.is_file()
    finally:
        engine.dispose()


def test_sqlite_transaction_takes_the_write_lock_at_begin(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    engine = create_engine(f"sqlite:///{path}")
    other = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        with engine.connect() as connection:
            # A transaction that has only read so far already holds the write lock (BEGIN IMMEDIATE)...
            connection.execute(text("SELECT 1"))
            assert connection.in_transaction()
            with pytest.raises(sqlite3.OperationalError, match="database is locked"):
                other.execute("BEGIN IMMEDIATE")
            connection.rollback()
        # ...and releases it at its end.
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
    finally:
        other.close()
        engine.dispose()


def test_sqlite_ddl_is_transactional(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        with pytest.raises(RuntimeError), engine.begin() as connection:
            connection.exec_driver_sql("CREATE TABLE t (x INTEGER)")
            raise RuntimeError("abort")
        assert not sqlalchemy.inspect(engine).has_table("t")
    finally:
        engine.dispose()


def test_postgres_engine_is_serializable(postgres_url: str) -> None:
    engine = create_engine(postgres_url)
    try:
        with engine.connect() as connection:
            assert connection.get_isolation_level() == "SERIALIZABLE"
            assert connection.exec_driver_sql("SHOW transaction_isolation").scalar_one() == "serializable"
    finally:
        engine.dispose()


def test_postgres_engine_replaces_pooled_connections_the_server_closed(postgres_url: str) -> None:
    engine = create_engine(postgres_url)
    try:
        with engine.connect() as connection:
            old_pid = connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        # As after a server restart: the pooled connection's backend is gone.
        with psycopg.connect(engine.url.set(drivername="postgresql").render_as_string(), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s, 5000)", (old_pid,))  # waits for it

        with engine.connect() as connection:  # pre-ping notices, and reconnects
            new_pid = connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        assert new_pid != old_pid
    finally:
        engine.dispose()


def test_bare_postgresql_url_uses_psycopg(postgres_url: str) -> None:
    engine = create_engine(postgres_url.replace("postgresql+psycopg://", "postgresql://"))
    try:
        assert engine.driver == "psycopg"
        with engine.connect() as connection:
            assert connection.exec_driver_sql("SELECT 1").scalar_one() == 1
    finally:
        engine.dispose()


def _connect_after(barrier: Any, url: str, results: Any) -> None:
    engine = create_engine(url)
    try:
        barrier.wait()
        with engine.connect() as connection:
            results.put(connection.exec_driver_sql("PRAGMA journal_mode").scalar_one())
    except Exception as exc:  # reported to the test, which names it
        results.put(repr(exc))
    finally:
        engine.dispose()


def test_processes_opening_one_new_sqlite_file_at_once_all_connect(tmp_path: Path) -> None:
    # Without a retry, SQLite answers the WAL switch "database is locked" at once (busy timeout or not) to
    # every connection but the one converting the new file: two mgmtd instances started together failed so.
    ctx = multiprocessing.get_context("fork")
    for trial in range(8):
        url = f"sqlite:///{tmp_path / f'race-{trial}.db'}"
        barrier, results = ctx.Barrier(6), ctx.Queue()
        procs = [ctx.Process(target=_connect_after, args=(barrier, url, results)) for _ in range(6)]
        for proc in procs:
            proc.start()
        got = [results.get(timeout=30) for _ in procs]
        for proc in procs:
            proc.join(timeout=30)
        assert got == ["wal"] * 6, f"trial {trial}: {got}"
