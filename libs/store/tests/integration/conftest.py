"""A migrated Store on each database (SQLite file and real PostgreSQL), built from the test schema."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ff_store import ConflictRetry, Store, create_engine, run_migrations
from ff_store.engine import DEFAULT_SQLITE_BUSY_TIMEOUT_MS

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
VERSION_TABLE = "ff_store_test_alembic_version"

MakeStore = Callable[..., Store]


@pytest.fixture
def make_store(db_url: str) -> Iterator[MakeStore]:
    """Builds migrated Stores on the test's database (with a counter "c" at 0); disposes them after."""
    stores: list[Store] = []

    def make(
        *,
        sqlite_busy_timeout_ms: int = DEFAULT_SQLITE_BUSY_TIMEOUT_MS,
        retry_policy: ConflictRetry | None = None,
    ) -> Store:
        engine = create_engine(db_url, sqlite_busy_timeout_ms=sqlite_busy_timeout_ms)
        store = Store(engine, retry_policy=retry_policy)
        stores.append(store)
        run_migrations(engine, MIGRATIONS_DIR, VERSION_TABLE)
        with engine.begin() as connection:
            connection.exec_driver_sql("DELETE FROM counters")
            connection.exec_driver_sql("INSERT INTO counters (name, value) VALUES ('c', 0)")
        return store

    yield make
    for store in stores:
        store.dispose()


@pytest.fixture
def store(make_store: MakeStore) -> Store:
    return make_store()
