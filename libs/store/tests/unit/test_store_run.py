"""Store.run's retry loop, with transaction bodies that fail before touching the database."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg.errors
import pytest
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from ff_store import ConflictRetry, Store, TransactionConflict, create_engine

NO_WAIT = ConflictRetry(max_retries=3, initial_backoff_s=0.0, max_backoff_s=0.0)


def serialization_failure() -> OperationalError:
    return OperationalError("UPDATE t", {}, psycopg.errors.SerializationFailure("could not serialize"))


@pytest.fixture
def store() -> Iterator[Store]:
    # Sessions connect on their first statement; these bodies never run one, so nothing connects.
    store = Store(create_engine("postgresql+psycopg://u@db.invalid/state"), retry_policy=NO_WAIT)
    yield store
    store.dispose()


class FlakyBody:
    """Fails with a serialization failure ``num_failures`` times, then returns "done"."""

    def __init__(self, num_failures: int) -> None:
        self.num_failures = num_failures
        self.num_calls = 0

    def __call__(self, session: Session) -> str:
        self.num_calls += 1
        if self.num_calls <= self.num_failures:
            raise serialization_failure()
        return "done"


def test_conflicts_are_retried_and_the_result_returned(store: Store) -> None:
    body = FlakyBody(num_failures=3)

    assert store.run(body) == "done"
    assert body.num_calls == 4


def test_retries_override_the_policy(store: Store) -> None:
    body = FlakyBody(num_failures=5)

    assert store.run(body, retries=5) == "done"
    assert body.num_calls == 6


def test_exhausted_retries_raise_transaction_conflict_from_the_last_error(store: Store) -> None:
    body = FlakyBody(num_failures=10)

    with pytest.raises(TransactionConflict, match="after 4 attempts") as caught:
        store.run(body)

    assert body.num_calls == 4
    assert caught.value.num_attempts == 4
    assert isinstance(caught.value.__cause__, OperationalError)


def test_zero_retries_runs_once(store: Store) -> None:
    body = FlakyBody(num_failures=1)

    with pytest.raises(TransactionConflict):
        store.run(body, retries=0)
    assert body.num_calls == 1


def test_other_errors_propagate_unchanged_at_once(store: Store) -> None:
    error = LookupError("no such target")
    num_calls = 0

    def body(session: Session) -> None:
        nonlocal num_calls
        num_calls += 1
        raise error

    with pytest.raises(LookupError) as caught:
        store.run(body)
    assert caught.value is error
    assert num_calls == 1


def test_negative_retries_are_rejected(store: Store) -> None:
    with pytest.raises(ValueError, match="retries must be >= 0"):
        store.run(FlakyBody(num_failures=0), retries=-1)


async def test_arun_retries_like_run(store: Store) -> None:
    body = FlakyBody(num_failures=2)

    assert await store.arun(body) == "done"
    assert body.num_calls == 3
