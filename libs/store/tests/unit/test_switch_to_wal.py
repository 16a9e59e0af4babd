"""The WAL switch retries "database is locked" under the retry policy and nothing else."""

from __future__ import annotations

import random
import sqlite3
from typing import Any

import pytest

from ff_store import ConflictRetry
from ff_store.engine import switch_to_wal


def busy() -> sqlite3.OperationalError:
    error = sqlite3.OperationalError("database is locked")
    error.sqlite_errorcode = sqlite3.SQLITE_BUSY  # set by the sqlite3 module on errors it raises
    return error


class Cursor:
    """Raises the given errors on the first executes, then succeeds."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.executed: list[str] = []

    def execute(self, sql: str) -> Any:
        self.executed.append(sql)
        if self.errors:
            raise self.errors.pop(0)
        return self


def test_busy_answers_are_retried_with_the_policys_backoff() -> None:
    cursor, waits = Cursor(busy(), busy()), []
    policy = ConflictRetry(max_retries=3, initial_backoff_s=0.01, max_backoff_s=1.0)
    switch_to_wal(cursor, policy=policy, rng=random.Random(1), sleep=waits.append)  # type: ignore[arg-type]
    assert cursor.executed == ["PRAGMA journal_mode = WAL"] * 3
    assert len(waits) == 2 and 0.005 <= waits[0] < 0.01 and 0.01 <= waits[1] < 0.02


def test_other_errors_are_raised_at_once() -> None:
    cursor, waits = Cursor(sqlite3.OperationalError("disk I/O error")), []
    with pytest.raises(sqlite3.OperationalError, match="disk I/O"):
        switch_to_wal(cursor, sleep=waits.append)  # type: ignore[arg-type]
    assert waits == []


def test_gives_up_after_the_policys_retries() -> None:
    cursor, waits = Cursor(busy(), busy(), busy()), []
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        switch_to_wal(cursor, policy=ConflictRetry(max_retries=2), sleep=waits.append)  # type: ignore[arg-type]
    assert len(cursor.executed) == 3 and len(waits) == 2
