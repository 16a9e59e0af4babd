"""SQLAlchemy engines for the two supported databases: a SQLite file, or PostgreSQL through psycopg 3."""

from __future__ import annotations

import itertools
import random
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy
from sqlalchemy import event
from sqlalchemy.engine import URL, Connection, Engine, make_url

from ff_store.retry import ConflictRetry, is_retryable

SQLITE_DRIVER = "pysqlite"
POSTGRES_DRIVER = "psycopg"
DEFAULT_SQLITE_BUSY_TIMEOUT_MS = 5_000

# Execution option read by the SQLite "begin" hook; PostgreSQL has its own (postgresql_readonly).
_SQLITE_READ_ONLY = "ff_store_read_only"


def create_engine(url: str, *, sqlite_busy_timeout_ms: int = DEFAULT_SQLITE_BUSY_TIMEOUT_MS) -> Engine:
    """Creates an engine whose transactions are serializable on either database.

    SQLite (``sqlite:///path/to/file.db``): WAL journal, foreign keys on, a busy timeout, and every
    transaction starts with ``BEGIN IMMEDIATE`` so that writers queue for the lock up front instead of
    deadlocking when two readers both try to upgrade. The parent folder of the file is created.

    PostgreSQL (``postgresql+psycopg://...``; a bare ``postgresql://`` means psycopg too): isolation
    level SERIALIZABLE, and connections are pinged before use so a restarted server is survived.

    Args:
        url: the database URL.
        sqlite_busy_timeout_ms: how long a SQLite transaction waits for another one's write lock
            before it fails with "database is locked" (which ``Store.run`` retries).

    Raises:
        ValueError: the URL names another database or driver, or an in-memory SQLite database.
    """
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return _sqlite_engine(parsed, busy_timeout_ms=sqlite_busy_timeout_ms)
    if backend == "postgresql":
        return _postgres_engine(parsed)
    raise ValueError(
        f"unsupported database {backend!r} in {parsed.render_as_string(hide_password=True)!r}: "
        "use sqlite:///path/to/file.db or postgresql+psycopg://user@host/db"
    )


def read_only_engine(engine: Engine) -> Engine:
    """The same engine (same pool) whose transactions are read-only: writes fail, nothing is locked.

    On SQLite a read-only transaction starts with a plain ``BEGIN`` (a WAL snapshot that never blocks a
    writer) under ``PRAGMA query_only``; on PostgreSQL it is ``READ ONLY``.
    """
    if engine.dialect.name == "sqlite":
        return engine.execution_options(**{_SQLITE_READ_ONLY: True})
    return engine.execution_options(postgresql_readonly=True)


def _sqlite_engine(url: URL, *, busy_timeout_ms: int) -> Engine:
    driver = url.get_driver_name()
    if driver != SQLITE_DRIVER:
        raise ValueError(f"unsupported SQLite driver {driver!r}: use sqlite:///path/to/file.db")
    if not url.database or url.database == ":memory:":
        raise ValueError(f"SQLite needs a file, not an in-memory database: {url.render_as_string()!r}")
    if busy_timeout_ms < 0:
        raise ValueError(f"sqlite_busy_timeout_ms must be >= 0, got {busy_timeout_ms}")
    Path(url.database).parent.mkdir(parents=True, exist_ok=True)
    # pysqlite's `timeout` is sqlite3_busy_timeout(), i.e. PRAGMA busy_timeout, from the first statement on.
    engine = sqlalchemy.create_engine(url, connect_args={"timeout": busy_timeout_ms / 1000})
    event.listen(engine, "connect", _on_sqlite_connect)
    event.listen(engine, "begin", _on_sqlite_begin)
    return engine


def _on_sqlite_connect(dbapi_connection: sqlite3.Connection, _record: Any) -> None:
    # Turn off pysqlite's own BEGIN handling: it would not begin before a SELECT, breaking
    # serializability; _on_sqlite_begin emits the BEGIN instead (SQLAlchemy's documented recipe).
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        switch_to_wal(cursor)
        cursor.execute("PRAGMA foreign_keys = ON")
    finally:
        cursor.close()


_WAL_SWITCH_RETRIES = ConflictRetry()


def switch_to_wal(
    cursor: sqlite3.Cursor,
    *,
    policy: ConflictRetry = _WAL_SWITCH_RETRIES,
    rng: random.Random | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """``PRAGMA journal_mode = WAL``, retried while another connection holds the file.

    When several processes open the same new database file at once (two mgmtd instances brought up together),
    SQLite answers this pragma "database is locked" at once, without waiting out the busy timeout, to every
    connection but the one converting the file. It is retried under ``policy`` like a conflicted transaction.
    """
    rng = rng or random.Random()
    for retry in itertools.count():
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if retry >= policy.max_retries or not is_retryable(exc):
                raise
            sleep(policy.backoff_s(retry, rng))


def _on_sqlite_begin(connection: Connection) -> None:
    if connection.get_execution_options().get(_SQLITE_READ_ONLY, False):
        connection.exec_driver_sql("PRAGMA query_only = ON")
        connection.exec_driver_sql("BEGIN")
    else:
        # query_only lives on the pooled connection, so a writer must switch it back off.
        connection.exec_driver_sql("PRAGMA query_only = OFF")
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def _postgres_engine(url: URL) -> Engine:
    driver = url.get_driver_name()
    if url.drivername == "postgresql":
        url = url.set(drivername=f"postgresql+{POSTGRES_DRIVER}")
    elif driver != POSTGRES_DRIVER:
        raise ValueError(f"unsupported PostgreSQL driver {driver!r}: use postgresql+psycopg://")
    return sqlalchemy.create_engine(url, isolation_level="SERIALIZABLE", pool_pre_ping=True)
