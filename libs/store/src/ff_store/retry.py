"""Which database errors mean "a concurrent transaction won, run it again", and how long to wait."""

from __future__ import annotations

import random
import sqlite3
from dataclasses import dataclass

import psycopg
from sqlalchemy.exc import DBAPIError

# serialization_failure and deadlock_detected: PostgreSQL aborted the whole transaction.
RETRYABLE_SQLSTATES = frozenset({"40001", "40P01"})
# "database is locked" and "database table is locked" (busy timeout expired): nothing was written.
RETRYABLE_SQLITE_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})

# 2.0 ** exponent overflows a float past ~1023; the cap is reached long before this anyway.
_MAX_EXPONENT = 62


def is_retryable(error: BaseException) -> bool:
    """Tells whether ``error`` aborted a transaction only because of a concurrent one.

    Accepts SQLAlchemy's wrapped errors (``DBAPIError.orig``) as well as raw driver errors. Lost
    connections are not retryable here: a COMMIT might have succeeded before the connection dropped.
    """
    cause = error.orig if isinstance(error, DBAPIError) else error
    if isinstance(cause, psycopg.Error):
        return cause.sqlstate in RETRYABLE_SQLSTATES
    if isinstance(cause, sqlite3.Error):
        # Extended codes (e.g. SQLITE_BUSY_SNAPSHOT) carry the primary code in the low byte.
        code: int = getattr(cause, "sqlite_errorcode", -1)
        return code >= 0 and (code & 0xFF) in RETRYABLE_SQLITE_CODES
    return False


@dataclass(frozen=True, kw_only=True)
class ConflictRetry:
    """How often and how patiently ``Store.run`` re-runs a conflicted transaction.

    Not an RPC retry (those are ``ff_rpc.RetryPolicy`` and ``ff_rpc.retry_call``): a transaction that lost a
    conflict ran and was rolled back, so it is always safe to run again, at once from a worker thread.

    The wait before retry ``n`` (0-based) is ``min(max_backoff_s, initial_backoff_s * 2**n)`` scaled by
    a random factor in [0.5, 1): exponential, with jitter so that two losers do not collide again.
    """

    max_retries: int = 10
    """Retries after the first attempt; 0 means run once."""
    initial_backoff_s: float = 0.005
    max_backoff_s: float = 0.5

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        if not 0 <= self.initial_backoff_s <= self.max_backoff_s:
            raise ValueError(
                f"need 0 <= initial_backoff_s <= max_backoff_s, got {self.initial_backoff_s}, {self.max_backoff_s}"
            )

    def backoff_s(self, retry: int, rng: random.Random) -> float:
        """Seconds to wait before retry number ``retry`` (0 for the first retry)."""
        ceiling_s = min(self.max_backoff_s, self.initial_backoff_s * 2.0 ** min(retry, _MAX_EXPONENT))
        return ceiling_s * (0.5 + 0.5 * rng.random())
