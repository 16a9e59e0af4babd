"""Which errors are retried, and how long the waits between retries are."""

from __future__ import annotations

import random
import sqlite3

import psycopg.errors
import pytest
from sqlalchemy.exc import IntegrityError, OperationalError

from ff_store import ConflictRetry, is_retryable


def sqlite_error(message: str, code: int) -> sqlite3.OperationalError:
    error = sqlite3.OperationalError(message)
    error.sqlite_errorcode = code  # set by the sqlite3 module on errors it raises
    return error


def wrapped(error: Exception) -> OperationalError:
    return OperationalError("UPDATE counters SET value = 1", {}, error)


@pytest.mark.parametrize(
    "error",
    [
        psycopg.errors.SerializationFailure("could not serialize access due to concurrent update"),
        psycopg.errors.DeadlockDetected("deadlock detected"),
        sqlite_error("database is locked", sqlite3.SQLITE_BUSY),
        sqlite_error("database is locked", sqlite3.SQLITE_BUSY | (2 << 8)),  # SQLITE_BUSY_SNAPSHOT
        sqlite_error("database table is locked", sqlite3.SQLITE_LOCKED),
    ],
    ids=["pg-40001", "pg-40P01", "sqlite-busy", "sqlite-busy-snapshot", "sqlite-locked"],
)
def test_conflicts_are_retryable_raw_or_wrapped(error: Exception) -> None:
    assert is_retryable(error)
    assert is_retryable(wrapped(error))


@pytest.mark.parametrize(
    "error",
    [
        wrapped(psycopg.errors.UniqueViolation("duplicate key")),
        wrapped(psycopg.errors.ReadOnlySqlTransaction("cannot execute UPDATE in a read-only transaction")),
        wrapped(psycopg.OperationalError("server closed the connection unexpectedly")),
        wrapped(sqlite_error("no such table: counters", sqlite3.SQLITE_ERROR)),
        wrapped(sqlite_error("attempt to write a readonly database", sqlite3.SQLITE_READONLY)),
        wrapped(sqlite3.OperationalError("database is locked")),  # no error code: not from sqlite3
        IntegrityError("INSERT", {}, sqlite3.IntegrityError("UNIQUE constraint failed")),
        ValueError("database is locked"),
        KeyError("40001"),
    ],
    ids=[
        "pg-unique",
        "pg-read-only",
        "pg-disconnect",
        "sqlite-no-table",
        "sqlite-read-only",
        "sqlite-no-code",
        "sqlite-unique",
        "value-error",
        "key-error",
    ],
)
def test_other_errors_are_not_retryable(error: Exception) -> None:
    assert not is_retryable(error)


class FixedRandom(random.Random):
    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value

    def random(self) -> float:
        return self.value


def test_backoff_doubles_up_to_the_cap() -> None:
    policy = ConflictRetry(initial_backoff_s=0.01, max_backoff_s=0.1)
    longest = FixedRandom(1.0)

    assert [policy.backoff_s(retry, longest) for retry in range(6)] == pytest.approx([0.01, 0.02, 0.04, 0.08, 0.1, 0.1])
    assert policy.backoff_s(10_000, longest) == pytest.approx(0.1)


def test_jitter_spans_half_to_all_of_the_ceiling() -> None:
    policy = ConflictRetry(initial_backoff_s=0.01, max_backoff_s=0.1)

    assert policy.backoff_s(2, FixedRandom(0.0)) == pytest.approx(0.02)
    assert policy.backoff_s(2, FixedRandom(0.5)) == pytest.approx(0.03)
    waits = [policy.backoff_s(2, random.Random(seed)) for seed in range(200)]
    assert all(0.02 <= wait < 0.04 for wait in waits)
    assert len(set(waits)) == 200


@pytest.mark.parametrize(
    "kwargs",
    [{"max_retries": -1}, {"initial_backoff_s": -0.1}, {"initial_backoff_s": 1.0, "max_backoff_s": 0.5}],
)
def test_invalid_policies_are_rejected(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ConflictRetry(**kwargs)  # type: ignore[arg-type]
