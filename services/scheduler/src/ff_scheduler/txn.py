"""The store as the scheduler uses it: transactions in worker threads that shutdown can wait for.

A cancelled RPC handler does not stop its transaction (it runs on in its thread); disposing the engine
under it would leak the connection. ``Transactions.drain`` waits for every transaction still running.

Tasks a transaction marks changed (``store.ticks.note_changed``) are passed to the tick's ``TaskCache``
before the commit and again after it, so a tick that read before the commit reads them again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.orm import Session

from ff_scheduler.store.ticks import CHANGED_TASKS, TaskCache
from ff_store import Store

T = TypeVar("T")


class Transactions:
    """The scheduler's store run on its own worker threads, so transactions stay off the event loop."""

    def __init__(self, store: Store, max_workers: int = 8) -> None:
        self.store = store
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="sched-txn")
        self._pending: set[concurrent.futures.Future[object]] = set()
        self.tasks = TaskCache()

    async def arun(self, fn: Callable[[Session], T], *, read_only: bool = False) -> T:
        """``Store.run(fn)`` in a worker thread; same errors."""
        future = self._pool.submit(self._run, fn, read_only)
        self._pending.add(future)  # type: ignore[arg-type]
        future.add_done_callback(self._pending.discard)
        return await asyncio.wrap_future(future)

    def _run(self, fn: Callable[[Session], T], read_only: bool) -> T:
        changed: set[int] = set()

        def marking(s: Session) -> T:
            result = fn(s)
            changed.update(s.info.pop(CHANGED_TASKS, ()))
            self.tasks.mark(changed)
            return result

        result = self.store.run(marking, read_only=read_only)
        self.tasks.mark(changed)
        return result

    async def drain(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the transactions in flight (at shutdown, before ``dispose``)."""
        pending = list(self._pending)
        if pending:
            await asyncio.to_thread(concurrent.futures.wait, pending, timeout_s)

    def dispose(self) -> None:
        """Stop the worker threads (waiting for them) and close the database connections."""
        self._pool.shutdown(wait=True)
        self.store.dispose()
