"""run_migrations on both databases: applied at start, idempotent, safe when two processes race."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy
from sqlalchemy import Engine, text

from ff_store import create_engine, run_migrations
from ff_store.migrations import advisory_lock_key

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
VERSION_TABLE = "ff_store_test_alembic_version"
HEAD = "0002"

# What each racing process runs: says it is ready, migrates, prints the revision it ended at.
MIGRATE_SCRIPT = """
import sys
from sqlalchemy import text
from ff_store import create_engine, run_migrations
url, migrations_dir, version_table = sys.argv[1:]
engine = create_engine(url)
print("ready", flush=True)
run_migrations(engine, migrations_dir, version_table)
with engine.connect() as connection:
    print(connection.execute(text(f"SELECT version_num FROM {version_table}")).scalar_one())
engine.dispose()
"""


def versions(engine: Engine) -> list[str]:
    with engine.connect() as connection:
        return list(connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars())


def test_migrations_create_the_schema_and_record_head(db_url: str) -> None:
    engine = create_engine(db_url)
    try:
        run_migrations(engine, MIGRATIONS_DIR, VERSION_TABLE)

        tables = set(sqlalchemy.inspect(engine).get_table_names())
        assert tables == {"counters", "notes", VERSION_TABLE}  # not Alembic's default alembic_version
        assert versions(engine) == [HEAD]
    finally:
        engine.dispose()


def test_running_migrations_again_changes_nothing(db_url: str) -> None:
    engine = create_engine(db_url)
    try:
        run_migrations(engine, MIGRATIONS_DIR, VERSION_TABLE)
        with engine.begin() as connection:
            connection.execute(text("INSERT INTO counters (name, value) VALUES ('kept', 7)"))

        run_migrations(engine, MIGRATIONS_DIR, VERSION_TABLE)
        run_migrations(engine, str(MIGRATIONS_DIR), VERSION_TABLE)

        assert versions(engine) == [HEAD]
        with engine.connect() as connection:
            rows = connection.execute(text("SELECT name, value FROM counters")).all()
        assert [tuple(row) for row in rows] == [("kept", 7)]
    finally:
        engine.dispose()


def test_two_processes_starting_at_once_migrate_once(db_url: str) -> None:
    engine = create_engine(db_url)
    command = [sys.executable, "-c", MIGRATE_SCRIPT, db_url, str(MIGRATIONS_DIR), VERSION_TABLE]
    try:
        # Hold the migration lock until both processes wait for it, then let them race for it.
        with migration_lock_held(engine) as wait_for_waiters:
            processes = [
                subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)
            ]
            for process in processes:
                assert process.stdout is not None
                assert process.stdout.readline() == "ready\n", process.communicate()[1]
            wait_for_waiters()
        outputs = [process.communicate(timeout=60) for process in processes]

        assert [process.returncode for process in processes] == [0, 0], [err for _, err in outputs]
        assert [out for out, _ in outputs] == [f"{HEAD}\n", f"{HEAD}\n"]
        assert versions(engine) == [HEAD]
    finally:
        engine.dispose()


@contextmanager
def migration_lock_held(engine: Engine) -> Iterator[Callable[[], None]]:
    """Holds what run_migrations waits for; yields a function that returns once two callers wait."""
    if engine.dialect.name == "postgresql":
        with engine.connect() as connection:
            key = advisory_lock_key(VERSION_TABLE)
            connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": key})
            connection.commit()
            yield lambda: wait_for_postgres_lock_waiters(engine, num_waiters=2)
            connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": key})
            connection.commit()
    else:
        with engine.connect():
            pass  # creates the file, in WAL mode, as a service's first start would
        database = engine.url.database
        assert database is not None
        holder = sqlite3.connect(database, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            # SQLite does not show who waits on its lock; the processes are in their busy timeout (5 s).
            yield lambda: time.sleep(0.5)
        finally:
            holder.close()


def wait_for_postgres_lock_waiters(engine: Engine, *, num_waiters: int) -> None:
    query = text(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    )
    deadline = time.monotonic() + 30
    with engine.connect() as connection:
        while connection.execute(query).scalar_one() < num_waiters:
            connection.rollback()
            assert time.monotonic() < deadline, "the migrating processes never waited for the lock"
            time.sleep(0.01)
