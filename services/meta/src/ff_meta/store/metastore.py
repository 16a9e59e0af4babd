"""``MetaStore``: meta's transactions, awaited.

A body (``Callable[[Tx], T]``) runs in one serializable transaction by whichever path suits the database and the call;
callers see only ``read`` and ``write``.

The paths, and why:

- **PostgreSQL**: every transaction, reads included, in a worker thread: its statements wait on the network and
  on locks, which must not hold the event loop. The body runs first on a bare DB-API cursor of one of
  ``RAW_CONNECTIONS`` connections kept for it (``ff_store.RawWriter``: the same serializable transaction and
  retries on conflict, without the ORM session's ~0.5 ms of CPU per transaction); one that needs the session
  (``NeedsOrm``) is rolled back and runs again in ``Store.arun``.
- **SQLite** (one file, WAL): a *small* call (a few indexed statements) runs on the event loop, where it
  takes well under a millisecond and a thread hop would cost more than the work:
  - a read on its own DB-API connection (a WAL snapshot from BEGIN to COMMIT); a body that needs the ORM
    session runs in an ordinary ``Store.run``, still on the loop;
  - a write on the *inline writer*, a DB-API connection with busy timeout 0 (``BEGIN IMMEDIATE``, the body,
    ``COMMIT``) that never waits for SQLite's lock and never checkpoints the WAL (that fsyncs: ``checkpoint``
    does it in a thread). When another writer holds the lock, or the body needs the ORM session, the attempt
    is rolled back and the write queued for the *group writer*, a worker thread that commits the queued
    writes together (one transaction, a savepoint each). With ``synchronous = FULL`` (an fsync per commit)
    every write is queued.
  A body on the loop has a walking budget (``Tx.loop_budget``); past it (``NeedsThread``) it is rolled back
  and runs again in a worker thread, as do calls that are not small.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from sqlalchemy import Engine, event
from sqlalchemy.orm import Session

from ff_meta.core.errors import FsError
from ff_meta.core.perms import Caller
from ff_meta.store.schema import VERSION_TABLE
from ff_meta.store.tx import NeedsOrm, NeedsThread, Tx
from ff_store import RawWriter, Store, is_retryable, open_store

logger = logging.getLogger(__name__)

T = TypeVar("T")
Body = Callable[[Tx], T]
MIGRATIONS = Path(__file__).parent / "migrations"
GROUP_WRITES = 64  # writes per transaction of the group writer, and of ``write_many`` on the inline writer
# What a transaction may spend walking paths on the event loop (``Tx.loop_budget``: about 2,000 lookups, tens
# of milliseconds); past it, it runs again in a worker thread (NeedsThread).
LOOP_BUDGET_ROWS = 2048
# PostgreSQL: connections kept for transactions on a bare cursor, one per transaction at a time (the default
# executor's threads take them; a transaction that finds none free waits for one).
RAW_CONNECTIONS = 4
Synchronous = Literal["FULL", "NORMAL"]


@dataclass
class WriteCounts:
    """How this store's writes ran since it opened (for tests and the curious)."""

    inline: int = 0  # committed on the event loop by the inline writer
    queued: int = 0  # handed to the group writer (or, on PostgreSQL, to a worker thread)


class MetaStore:
    """Meta's tables behind two awaitable calls, ``read`` and ``write`` (and ``write_many`` for batches).

    A body follows ``Store``'s contract (it may run several times: no side effects outside the ``Tx``), and may
    be run first on a bare DB-API cursor: a helper that needs the ORM session then raises ``NeedsOrm`` and the
    body runs again with one (see the module docstring).
    """

    def __init__(self, store: Store, *, synchronous: Synchronous = "NORMAL") -> None:
        self._store = store
        self.counts = WriteCounts()
        self._on_sqlite = store.engine.dialect.name == "sqlite"
        self._write_lock = threading.Lock()
        self._write_queue: list[tuple[Callable[[Session], Any], asyncio.Future[Any]]] = []
        self._writer_busy = False
        self._writer_task: asyncio.Task[None] | None = None
        self._db_file = store.engine.url.database or ""
        self._reader: sqlite3.Connection | None = None
        self._version_cursor: sqlite3.Cursor | None = None  # the reader's, kept for data_version
        self._writer: sqlite3.Connection | None = None
        self._checkpointer: sqlite3.Connection | None = None
        self._raw: queue.SimpleQueue[RawWriter] | None = None
        if not self._on_sqlite:
            self._raw = queue.SimpleQueue()
            for _ in range(RAW_CONNECTIONS):
                self._raw.put(store.raw_writer())
        if self._on_sqlite and self._db_file:
            self._reader = sqlite3.connect(self._db_file, isolation_level=None, check_same_thread=False)
            self._reader.execute("PRAGMA query_only = ON")
            self._version_cursor = self._reader.cursor()
            # Inline writes only where a commit does not fsync (FULL: the group writer's thread pays it).
            if synchronous == "NORMAL":
                self._writer = self._open_writer()

    @classmethod
    def open(cls, url: str, *, synchronous: Synchronous = "NORMAL") -> MetaStore:
        """Open (and migrate) meta's database; blocks (run it in a thread)."""
        store = open_store(url, MIGRATIONS, VERSION_TABLE)
        _tune_sqlite(store.engine, synchronous)
        return cls(store, synchronous=synchronous)

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine (migrations, tests)."""
        return self._store.engine

    def _open_writer(self) -> sqlite3.Connection:
        """The inline writer's connection.

        The inline writer: it never waits for SQLite's lock (busy timeout 0: when another writer holds it,
        the write queues for the group writer's thread instead of stalling the event loop) and never
        checkpoints the WAL (that fsyncs; ``checkpoint`` does it off the loop).
        """
        writer = sqlite3.connect(self._db_file, isolation_level=None, check_same_thread=False, timeout=0)
        writer.execute("PRAGMA foreign_keys = ON")
        writer.execute("PRAGMA synchronous = NORMAL")
        writer.execute("PRAGMA wal_autocheckpoint = 0")
        return writer

    async def close(self) -> None:
        """Close the SQLite connections of the fast paths (the engine's pool: ``dispose``)."""
        if self._writer_task is not None:
            with contextlib.suppress(Exception):
                await self._writer_task
        for conn in (self._reader, self._writer, self._checkpointer):
            if conn is not None:
                conn.close()
        self._reader = self._writer = self._checkpointer = None
        self._version_cursor = None
        if self._raw is not None:
            raw, self._raw = self._raw, None
            for _ in range(RAW_CONNECTIONS):
                await asyncio.to_thread(raw.get().close)  # waits for any still in a transaction

    def dispose(self) -> None:
        """Close the engine's pooled connections (after ``close``, at shutdown); blocks."""
        self._store.dispose()

    # ---- reads ----

    def data_version(self) -> int | None:
        """SQLite's data version on the reader connection; None where there is none to read (PostgreSQL).

        It moves with every commit of any other connection: this process's writers, other meta instances on the file.
        """
        if self._version_cursor is None:
            return None
        # fetchall: the statement is run to its end, so no read transaction stays open on the reader
        [(version,)] = self._version_cursor.execute("PRAGMA data_version").fetchall()
        return int(version)

    async def read(self, caller: Caller, fn: Body[T], *, small: bool = True) -> T:
        """``fn`` in a read-only transaction. ``small``: a few indexed statements (may run on the loop)."""
        if self._on_sqlite and small:
            if self._reader is not None:
                try:
                    return self._read_inline(caller, fn)
                except NeedsThread:
                    return await self._read_in_thread(caller, fn)
                except NeedsOrm:
                    pass
            with contextlib.suppress(NeedsThread):
                now = time.time_ns()
                return self._store.run(lambda s: fn(Tx(s, caller, now, loop_budget=LOOP_BUDGET_ROWS)), read_only=True)
        return await self._read_in_thread(caller, fn)

    def _read_inline(self, caller: Caller, fn: Body[T]) -> T:
        assert self._reader is not None
        cur = self._reader.cursor()
        cur.execute("BEGIN")
        try:
            return fn(Tx(None, caller, time.time_ns(), _cursor=cur, _qmark=True, loop_budget=LOOP_BUDGET_ROWS))
        finally:
            cur.execute("COMMIT")
            cur.close()

    async def _read_in_thread(self, caller: Caller, fn: Body[T]) -> T:
        now = time.time_ns()
        if self._raw is not None:
            with contextlib.suppress(NeedsOrm):
                return await asyncio.to_thread(self._run_raw, caller, fn, now)
        return await self._store.arun(lambda s: fn(Tx(s, caller, now)), read_only=True)

    def _run_raw(self, caller: Caller, fn: Body[T], now: int) -> T:
        """``fn`` in a transaction on a bare cursor of a kept PostgreSQL connection (blocks: a worker thread's).

        Raises:
            NeedsOrm: the body needs the ORM session (rolled back: run it again in ``Store.run``).
        """
        assert self._raw is not None
        raw = self._raw.get()
        try:
            return raw.run(lambda t: fn(Tx(None, caller, now, _cursor=t.cursor, _qmark=t.mark == "?")))
        finally:
            self._raw.put(raw)

    # ---- writes ----

    async def write(self, caller: Caller, fn: Body[T], *, small: bool = True) -> T:
        """``fn`` in a write transaction; an exception from it (an FsError) rolls back and is raised."""
        now = time.time_ns()

        def body(session: Session) -> T:
            return fn(Tx(session, caller, now))

        if not self._on_sqlite:
            self.counts.queued += 1
            if self._raw is not None:
                with contextlib.suppress(NeedsOrm):
                    return await asyncio.to_thread(self._run_raw, caller, fn, now)
            return await self._store.arun(body)
        if self._writer is not None and small:
            done, value = self._write_inline(caller, fn, now)
            if done:
                self.counts.inline += 1
                return value  # type: ignore[return-value]
        self.counts.queued += 1
        return await self._group_write(body)  # type: ignore[no-any-return]

    async def write_many(self, caller: Caller, fns: Sequence[Body[T]]) -> list[T | FsError]:
        """Many small writes, each alone.

        Many small writes (a BatchCreate's or BatchClose's items), in order, each as its own ``write`` would
        be: one that fails (an FsError) changes nothing and the others go on. On SQLite's inline writer they
        share transactions of up to ``GROUP_WRITES``, a savepoint each (one commit per group instead of one per
        call); elsewhere, or when a group cannot run inline (the write lock taken, a call that needs the ORM),
        each goes through ``write``.
        """
        out: list[T | FsError] = []
        for k in range(0, len(fns), GROUP_WRITES):
            group = fns[k : k + GROUP_WRITES]
            done, values = (
                self._write_inline_many(caller, group, time.time_ns()) if self._writer is not None else (False, [])
            )
            if done:
                self.counts.inline += len(group)
                out += values
                continue
            for fn in group:
                try:
                    out.append(await self.write(caller, fn))
                except FsError as err:
                    out.append(err)
        return out

    def _write_inline_many(self, caller: Caller, fns: Sequence[Body[T]], now: int) -> tuple[bool, list[T | FsError]]:
        """``_write_inline`` for several calls, a savepoint each.

        ``(True, results)``, or ``(False, [])`` with nothing changed (the lock taken, a call needing the ORM: the caller
        runs them one by one).
        """
        assert self._writer is not None
        cur = self._writer.cursor()
        try:
            try:
                cur.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError:
                self._rollback()
                return False, []
            out: list[T | FsError] = []
            try:
                for fn in fns:
                    cur.execute("SAVEPOINT item")
                    try:
                        out.append(fn(Tx(None, caller, now, _cursor=cur, _qmark=True, loop_budget=LOOP_BUDGET_ROWS)))
                    except FsError as err:
                        cur.execute("ROLLBACK TO item")
                        out.append(err)
                    cur.execute("RELEASE item")
                cur.execute("COMMIT")
            except (NeedsOrm, sqlite3.OperationalError):
                self._rollback()
                return False, []
            except BaseException:
                self._rollback()
                raise
            return True, out
        finally:
            cur.close()

    def _write_inline(self, caller: Caller, fn: Body[T], now: int) -> tuple[bool, T | None]:
        """The write on the event loop, on the inline writer.

        On the bare DB-API writer connection: ``(True, result)``; or ``(False, None)`` with nothing changed when
        SQLite's write lock is taken (by the group writer or another process) or the body needs the ORM session (quotas,
        sessions, trash): the caller queues it for the group writer. A failure of the body (an FsError) rolls back and
        is raised, as from ``Store.run``.

        On SQLite a short write transaction costs a few indexed statements and, in WAL mode with synchronous
        NORMAL, no fsync; the thread hop and ORM session of the queued path cost several times that.
        """
        assert self._writer is not None
        cur = self._writer.cursor()
        try:
            try:
                cur.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError:  # SQLITE_BUSY: another writer holds the lock (or worse: see below)
                self._rollback()
                return False, None
            try:
                value = fn(Tx(None, caller, now, _cursor=cur, _qmark=True, loop_budget=LOOP_BUDGET_ROWS))
            except (NeedsOrm, sqlite3.OperationalError):
                self._rollback()  # the queued path runs it with the ORM, retries it, or reports the error
                return False, None
            except BaseException:
                self._rollback()
                raise
            try:
                cur.execute("COMMIT")
            except sqlite3.OperationalError:  # e.g. SQLITE_BUSY at commit outside WAL mode: retried queued
                self._rollback()
                return False, None
            return True, value
        finally:
            cur.close()

    def _rollback(self) -> None:
        """Leave the inline writer outside any transaction, reopening it if it cannot roll back."""
        assert self._writer is not None
        try:
            if self._writer.in_transaction:
                self._writer.execute("ROLLBACK")
        except sqlite3.Error:
            logger.warning("the inline SQLite writer could not roll back: reopening it", exc_info=True)
            with contextlib.suppress(sqlite3.Error):
                self._writer.close()
            self._writer = self._open_writer()

    async def _group_write(self, body: Callable[[Session], Any]) -> Any:
        """Queue a write for the group writer.

        SQLite has one writer at a time, so the writes waiting in this process go together: one
        transaction (``Store.run``, re-run whole on conflict) with a savepoint per call, so that a call that
        fails (an FsError) changes nothing and the others still commit (group commit).
        """
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._write_queue.append((body, future))
        if not self._writer_busy:
            self._writer_busy = True
            self._writer_task = asyncio.create_task(self._drain_writes())
        return await future

    async def _drain_writes(self) -> None:
        try:
            while self._write_queue:
                batch, self._write_queue = self._write_queue[:GROUP_WRITES], self._write_queue[GROUP_WRITES:]
                try:
                    results = await asyncio.to_thread(self._write_batch, [b for b, _ in batch])
                except Exception as exc:
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                for (_, fut), (ok, value) in zip(batch, results, strict=True):
                    if fut.done():
                        continue
                    if ok:
                        fut.set_result(value)
                    else:
                        fut.set_exception(value)
        finally:
            self._writer_busy = False

    def _write_batch(self, bodies: list[Callable[[Session], Any]]) -> list[tuple[bool, Any]]:
        def run_all(session: Session) -> list[tuple[bool, Any]]:
            out: list[tuple[bool, Any]] = []
            for body in bodies:
                savepoint = session.begin_nested()
                try:
                    value = body(session)
                except Exception as err:
                    if is_retryable(err):
                        raise  # the whole group runs again
                    savepoint.rollback()
                    out.append((False, err))
                    continue
                savepoint.commit()
                out.append((True, value))
            return out

        # Writers of this process queue here rather than in SQLite's busy handler, which sleeps in steps of
        # milliseconds (another process on the same file still meets the busy handler).
        with self._write_lock:
            if len(bodies) == 1:  # alone: its own transaction is its savepoint
                try:
                    return [(True, self._store.run(bodies[0]))]
                except Exception as err:
                    return [(False, err)]
            return self._store.run(run_all)

    # ---- upkeep ----

    async def checkpoint(self) -> int:
        """Copy the SQLite WAL back into the database (the inline writer never does), in a worker thread: it fsyncs.

        PASSIVE: it waits for no reader or writer. Returns the pages copied (0 without inline writes).
        """
        if self._writer is None:
            return 0

        def checkpoint() -> int:
            if self._checkpointer is None:
                self._checkpointer = sqlite3.connect(self._db_file, isolation_level=None, check_same_thread=False)
            busy, _log, copied = self._checkpointer.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            return int(copied) if not busy else 0

        return await asyncio.to_thread(checkpoint)


def _tune_sqlite(engine: Engine, synchronous: Synchronous) -> None:
    """Meta's SQLite durability setting, on every pooled connection (no-op on PostgreSQL)."""
    if engine.dialect.name != "sqlite":
        return

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.execute(f"PRAGMA synchronous = {synchronous}")

    event.listen(engine, "connect", on_connect)
    engine.dispose()
