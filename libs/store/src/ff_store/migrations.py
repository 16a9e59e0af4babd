"""Alembic migrations run from code at service start, safe when several instances start at once.

A service keeps its migrations in its own package::

    ff_<svc>/store/migrations/
        env.py            # the three lines below
        script.py.mako    # Alembic's revision template (only needed to write new revisions)
        versions/0001_<what>.py ...

with ``env.py``::

    from ff_<svc>.store.schema import metadata
    from ff_store.migrations import run_env
    run_env(metadata)

and at start: ``run_migrations(engine, Path(__file__).parent / "migrations", "ff_<svc>_alembic_version")``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command, context
from alembic.config import Config
from sqlalchemy import Connection, Engine, MetaData, func, select

from ff_store.engine import create_engine
from ff_store.store import Store

# Keys of Config.attributes through which run_migrations hands its state to run_env.
_CONNECTION = "connection"
_VERSION_TABLE = "ff_store.version_table"


def run_migrations(engine: Engine, script_location: str | Path, version_table: str) -> None:
    """Upgrades the database to the newest revision in ``script_location``; a no-op when it is there.

    The whole upgrade is one transaction. Concurrent callers take turns: on PostgreSQL through an
    advisory lock named after ``version_table``, on SQLite through ``BEGIN IMMEDIATE``; the later one
    then finds the database at head and does nothing.

    Args:
        engine: from ``ff_store.create_engine``.
        script_location: the service's migrations folder (with ``env.py`` and ``versions/``).
        version_table: where Alembic records the revision; one name per service, so that several
            services can share one PostgreSQL database.
    """
    config = Config()
    # Config values go through configparser interpolation, where "%" is special.
    config.set_main_option("script_location", str(script_location).replace("%", "%%"))
    with (
        engine.connect() as connection,
        _postgres_advisory_lock(connection, version_table),
        connection.begin(),
    ):
        config.attributes[_CONNECTION] = connection
        config.attributes[_VERSION_TABLE] = version_table
        command.upgrade(config, "head")


def run_env(target_metadata: MetaData | None) -> None:
    """The body of a service's migrations ``env.py``: runs the migrations on ``run_migrations``' connection.

    Args:
        target_metadata: the service's tables, for ``alembic revision --autogenerate`` comparisons.

    Raises:
        RuntimeError: ``env.py`` was not run through ``run_migrations`` (e.g. from the alembic CLI,
            or in offline ``--sql`` mode, which is not supported).
    """
    connection = context.config.attributes.get(_CONNECTION)
    version_table = context.config.attributes.get(_VERSION_TABLE)
    if not isinstance(connection, Connection) or not isinstance(version_table, str):
        raise RuntimeError("this env.py runs only through ff_store.migrations.run_migrations()")
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        version_table=version_table,
        # SQLite cannot ALTER most things; batch mode rebuilds the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def advisory_lock_key(version_table: str) -> int:
    """The PostgreSQL advisory lock (a signed 64-bit key) that serializes migrations of ``version_table``."""
    digest = hashlib.sha256(f"ff_store.migrations:{version_table}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


@contextmanager
def _postgres_advisory_lock(connection: Connection, version_table: str) -> Iterator[None]:
    if connection.dialect.name != "postgresql":
        yield
        return
    key = advisory_lock_key(version_table)
    # A session-level lock, taken and committed before the migration's transaction begins: under
    # SERIALIZABLE, a transaction that waited for the lock inside itself would migrate from a snapshot
    # taken before the other instance's migration committed.
    connection.execute(select(func.pg_advisory_lock(key)))
    connection.commit()
    try:
        yield
    finally:
        connection.execute(select(func.pg_advisory_unlock(key)))
        connection.commit()


def open_store(database_url: str, script_location: str | Path, version_table: str) -> Store:
    """A service's store at start-up: the engine, with every migration applied (a no-op when current)."""
    engine = create_engine(database_url)
    run_migrations(engine, script_location, version_table)
    return Store(engine)
