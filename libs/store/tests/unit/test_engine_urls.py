"""create_engine's URL checks; no engine here ever connects."""

from __future__ import annotations

import pytest

from ff_store import create_engine, read_only_engine


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql+pymysql://root@db/state", "unsupported database 'mysql'"),
        ("oracle://scott@db/state", "unsupported database 'oracle'"),
        ("postgresql+psycopg2://u@db/state", "unsupported PostgreSQL driver 'psycopg2'"),
        ("postgresql+asyncpg://u@db/state", "unsupported PostgreSQL driver 'asyncpg'"),
        ("sqlite+aiosqlite:///state.db", "unsupported SQLite driver 'aiosqlite'"),
        ("sqlite://", "SQLite needs a file"),
        ("sqlite:///:memory:", "SQLite needs a file"),
    ],
)
def test_unsupported_urls_are_rejected(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        create_engine(url)


def test_password_is_not_echoed_in_the_error() -> None:
    with pytest.raises(ValueError) as caught:
        create_engine("mysql://root:hunter2@db/state")
    assert "hunter2" not in str(caught.value)


def test_negative_busy_timeout_is_rejected() -> None:
    with pytest.raises(ValueError, match="sqlite_busy_timeout_ms"):
        create_engine("sqlite:///state.db", sqlite_busy_timeout_ms=-1)


@pytest.mark.parametrize("url", ["postgresql://u@db:5432/state", "postgresql+psycopg://u@db:5432/state"])
def test_postgres_urls_use_psycopg(url: str) -> None:
    engine = create_engine(url)
    try:
        assert (engine.dialect.name, engine.driver) == ("postgresql", "psycopg")
        assert engine.url.render_as_string() == "postgresql+psycopg://u@db:5432/state"
    finally:
        engine.dispose()


def test_read_only_engine_shares_the_pool() -> None:
    engine = create_engine("postgresql+psycopg://u@db/state")
    try:
        read_only = read_only_engine(engine)
        assert read_only.pool is engine.pool
        assert read_only.get_execution_options()["postgresql_readonly"] is True
        assert "postgresql_readonly" not in engine.get_execution_options()
    finally:
        engine.dispose()
