"""A writer's own connection: plain DBAPI statements in the Store's serializable transactions, no session.

``Store.run`` costs ~0.5 ms of CPU per transaction in SQLAlchemy's session, pool and event machinery before
the database does anything. A hot path that writes the same few statements hundreds of times a second (the
telemetry collector's group commits) takes a ``RawWriter`` instead: one connection of the engine (its
connect hooks applied: WAL, foreign keys, pragmas, the isolation level) kept checked out, on which each
``run`` is BEGIN, the caller's statements on a DBAPI cursor, COMMIT. Same transactions as ``Store.run``
(``BEGIN IMMEDIATE`` on SQLite, SERIALIZABLE on PostgreSQL), same retries on conflict.
"""

from __future__ import annotations

import logging
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

import psycopg
from sqlalchemy import Engine
from sqlalchemy.engine.interfaces import DBAPICursor, Dialect
from sqlalchemy.pool import PoolProxiedConnection

from ff_store.errors import TransactionConflict
from ff_store.retry import ConflictRetry, is_retryable

logger = logging.getLogger(__name__)

T = TypeVar("T")

DRIVER_ERRORS = (sqlite3.Error, psycopg.Error)


class RawTransaction:
    """What a ``RawWriter.run`` body gets: a DBAPI cursor in an open transaction, and its dialect.

    Statements are the database's own SQL with the driver's placeholders (``mark``: ``?`` on SQLite,
    ``%s`` on PostgreSQL); parameters are plain tuples, passed to the driver as they are.
    """

    def __init__(self, cursor: DBAPICursor, dialect: Dialect) -> None:
        self.cursor = cursor
        self.dialect = dialect
        self.mark = "%s" if dialect.paramstyle in ("format", "pyformat") else "?"

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        """Runs one statement (placeholders written as ``mark``) in the transaction; results stay on ``cursor``."""
        self.cursor.execute(sql, params)

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Runs one statement once per row of parameters, in one driver call (the batch insert of a group commit)."""
        self.cursor.executemany(sql, rows)


class RawWriter:
    """One connection kept for one writer; ``run(fn)`` is a transaction on it, retried on conflict.

    The contract for ``fn`` is ``Store.run``'s (it may run several times, only statements through the
    transaction, no commit or rollback of its own). Callers in several threads are served one at a time.
    A connection the database dropped is replaced: a transaction that failed before its COMMIT is run
    again once on a new connection (nothing of it was committed); a failure during COMMIT is raised, as
    ``Store.run`` raises it (the commit may have happened). ``close`` gives the connection back.
    """

    def __init__(self, engine: Engine, *, retry_policy: ConflictRetry | None = None) -> None:
        self._engine = engine
        self._dialect = engine.dialect
        self._sqlite = engine.dialect.name == "sqlite"
        self._retry_policy = retry_policy or ConflictRetry()
        self._rng = random.Random()
        self._lock = threading.Lock()
        self._connection: PoolProxiedConnection | None = None
        self._closed = False

    @property
    def dialect(self) -> Dialect:
        """The engine's dialect, so a caller can prepare its SQL for SQLite or PostgreSQL before the first ``run``."""
        return self._dialect

    def run(self, fn: Callable[[RawTransaction], T], *, retries: int | None = None) -> T:
        """Runs ``fn`` in one transaction on the writer's connection and commits; blocks the calling thread.

        Raises:
            TransactionConflict: every attempt lost to a concurrent transaction.
            RuntimeError: the writer is closed.
            Exception: whatever ``fn`` or the database raised otherwise, after rolling back, unchanged.
        """
        num_retries = self._retry_policy.max_retries if retries is None else retries
        if num_retries < 0:
            raise ValueError(f"retries must be >= 0, got {num_retries}")
        with self._lock:
            retry = 0
            reconnected = False
            while True:
                connection = self._open()
                cursor = connection.cursor()
                committing = False
                try:
                    if self._sqlite:
                        cursor.execute("BEGIN IMMEDIATE")
                    result = fn(RawTransaction(cursor, self._dialect))
                    committing = True
                    if self._sqlite:
                        cursor.execute("COMMIT")
                    else:
                        connection.commit()
                    return result
                except Exception as error:
                    dropped = self._roll_back(connection, cursor, error)
                    if dropped and not committing and not reconnected:
                        reconnected = True  # nothing of it was committed: once more on a new connection
                        continue
                    if not is_retryable(error):
                        raise
                    if retry >= num_retries:
                        raise TransactionConflict(retry + 1) from error
                    backoff_s = self._retry_policy.backoff_s(retry, self._rng)
                    logger.debug("raw transaction conflicted (%s); retry %d in %.3f s", error, retry + 1, backoff_s)
                    time.sleep(backoff_s)
                    retry += 1
                finally:
                    cursor.close()

    def close(self) -> None:
        """Gives the connection back to the engine's pool (rolled back); later ``run`` calls fail."""
        with self._lock:
            self._closed = True
            if self._connection is not None:
                connection, self._connection = self._connection, None
                connection.close()

    def _open(self) -> PoolProxiedConnection:
        if self._closed:
            raise RuntimeError("the raw writer is closed")
        if self._connection is None:
            connection = self._engine.raw_connection()
            if self._sqlite:
                # The pooled connection may last have served a read-only transaction (ff_store.engine).
                cursor = connection.cursor()
                try:
                    cursor.execute("PRAGMA query_only = OFF")
                finally:
                    cursor.close()
            self._connection = connection
        return self._connection

    def _roll_back(self, connection: PoolProxiedConnection, cursor: DBAPICursor, error: Exception) -> bool:
        """Rolls the failed transaction back; True if the connection was lost (it is then dropped)."""
        lost = isinstance(error, DRIVER_ERRORS) and self._dialect.is_disconnect(
            cast(Any, error), connection.dbapi_connection, cursor
        )
        if not lost:
            try:
                if self._sqlite:
                    driver = connection.driver_connection
                    if driver is not None and driver.in_transaction:
                        cursor.execute("ROLLBACK")
                else:
                    connection.rollback()
            except Exception:
                logger.debug("rollback failed; dropping the writer's connection", exc_info=True)
                lost = True
        if lost:
            self._connection = None
            connection.invalidate(error)
        return lost
