"""Runs functions in serializable transactions, retrying the ones that lose to concurrent transactions."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from ff_store.engine import read_only_engine
from ff_store.errors import TransactionConflict
from ff_store.raw import RawWriter
from ff_store.retry import ConflictRetry, is_retryable

logger = logging.getLogger(__name__)

T = TypeVar("T")


class Store:
    """An engine plus the one way services touch it: ``run(fn)`` in a transaction, retried on conflict.

    Every transaction is serializable (see ``ff_store.create_engine``), so a function that reads, decides
    and writes sees no interleaving; the price is that it may be aborted by a concurrent transaction and
    run again. Hence the contract for ``fn``:

    - it may run several times, so it must be safe to re-run: no side effects outside the session (no
      RPCs, no files, no mutation of the caller's objects), only reads and writes through ``session``;
    - it must not commit, roll back or close the session, nor call ``run`` again (on SQLite a nested
      writer would wait for the outer one's lock);
    - it returns the result; ORM objects stay readable after the commit (``expire_on_commit=False``)
      but are detached.

    One exception, for a hot write path only: ``raw_writer()`` gives a writer its own connection on which
    each transaction is plain DBAPI statements (``ff_store.raw``), under the same contract.
    """

    def __init__(self, engine: Engine, *, retry_policy: ConflictRetry | None = None) -> None:
        self._engine = engine
        self._retry_policy = retry_policy or ConflictRetry()
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self._read_only_sessions = sessionmaker(read_only_engine(engine), expire_on_commit=False)
        self._rng = random.Random()

    @property
    def engine(self) -> Engine:
        """The engine the store runs on, for what is outside a transaction: its dialect, URL, connect-time tuning."""
        return self._engine

    def run(self, fn: Callable[[Session], T], *, retries: int | None = None, read_only: bool = False) -> T:
        """Runs ``fn(session)`` in one transaction and commits; blocks the calling thread.

        Args:
            fn: the transaction body; see the class docstring for what it may do.
            retries: how many times to re-run after a conflict; defaults to the store's policy.
            read_only: run in a read-only transaction: writes fail, and on SQLite it takes no lock.

        Returns:
            What ``fn`` returned.

        Raises:
            TransactionConflict: every attempt lost to a concurrent transaction.
            Exception: whatever ``fn`` or the database raised otherwise, after rolling back, unchanged.
        """
        num_retries = self._retry_policy.max_retries if retries is None else retries
        if num_retries < 0:
            raise ValueError(f"retries must be >= 0, got {num_retries}")
        sessions = self._read_only_sessions if read_only else self._sessions
        retry = 0
        while True:
            try:
                with sessions.begin() as session:
                    return fn(session)
            except Exception as error:
                if not is_retryable(error):
                    raise
                if retry >= num_retries:
                    raise TransactionConflict(retry + 1) from error
                backoff_s = self._retry_policy.backoff_s(retry, self._rng)
                # The driver's error, without SQLAlchemy's statement and parameters.
                cause = getattr(error, "orig", error)
                logger.debug("transaction conflicted (%s); retry %d in %.3f s", cause, retry + 1, backoff_s)
                time.sleep(backoff_s)
                retry += 1

    async def arun(self, fn: Callable[[Session], T], *, retries: int | None = None, read_only: bool = False) -> T:
        """``run`` in a worker thread, for asyncio code; same arguments and errors.

        Cancelling the awaiting task does not stop the transaction: it finishes (commits or rolls back)
        in its thread, and its result is dropped.
        """
        return await asyncio.to_thread(self.run, fn, retries=retries, read_only=read_only)

    def raw_writer(self) -> RawWriter:
        """A writer with its own connection of this store's engine and retry policy (``ff_store.raw``).

        For a path that runs the same few statements hundreds of times a second, where the session's
        ~0.5 ms of CPU per transaction matters. Close it before ``dispose``.
        """
        return RawWriter(self._engine, retry_policy=self._retry_policy)

    def dispose(self) -> None:
        """Closes the pooled connections (at shutdown)."""
        self._engine.dispose()
