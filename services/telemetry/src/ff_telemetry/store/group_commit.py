"""Group commit in a writer thread of its own: items queued by event loops, written a group per transaction.

While the writer commits a group, the pushes that arrive queue up and go into the next transaction together
(each still all or nothing: ``write_group`` answers per item), so many small pushes cost few commits and
nobody waits for a timer. One thread, started on the first item, handing each group's results back to the
loop of each caller in one callback; the event loops never block on the database.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections import defaultdict
from collections.abc import Callable
from typing import Generic, TypeVar

logger = logging.getLogger(__name__)

Item = TypeVar("Item")
Result = TypeVar("Result")

_Entry = tuple[Item, "asyncio.Future[Result]", asyncio.AbstractEventLoop]


class GroupCommitter(Generic[Item, Result]):
    """Writes queued items in groups of at most ``max_group_size`` (by ``size_of``) in one thread.

    ``write_group`` gets a group and answers one result or exception per item, in order; if it raises,
    every item of the group gets that exception.
    """

    def __init__(
        self,
        write_group: Callable[[list[Item]], list[Result | Exception]],
        size_of: Callable[[Item], int],
        max_group_size: int,
        *,
        name: str = "group-commit",
    ) -> None:
        self._write_group = write_group
        self._size_of = size_of
        self._max_group_size = max_group_size
        self._name = name
        self._queue: queue.SimpleQueue[_Entry[Item, Result] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False

    async def submit(self, item: Item) -> Result:
        """Queue ``item`` and wait until its group is committed: its result, or its exception raised."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Result] = loop.create_future()
        with self._lock:  # nothing is queued behind close's stop mark
            if self._closed:
                raise RuntimeError(f"{self._name} is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._queue.put((item, future, loop))
        return await future

    def close(self) -> None:
        """Write what is queued, then stop the thread (blocks until it stopped)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
            self._queue.put(None)
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        carried: _Entry[Item, Result] | None = None
        while True:
            first = carried if carried is not None else self._queue.get()
            carried = None
            if first is None:
                return
            group, size, stop = [first], self._size_of(first[0]), False
            while size < self._max_group_size:
                try:
                    entry = self._queue.get_nowait()
                except queue.Empty:
                    break
                if entry is None:
                    stop = True
                    break
                if size + self._size_of(entry[0]) > self._max_group_size:
                    carried = entry
                    break
                group.append(entry)
                size += self._size_of(entry[0])
            self._commit(group)
            if stop:
                return

    def _commit(self, group: list[_Entry[Item, Result]]) -> None:
        try:
            results = self._write_group([item for item, _, _ in group])
        except Exception as exc:  # the database itself failed: every caller of the group hears it
            results = [exc] * len(group)
        by_loop: defaultdict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Result], Result | Exception]]]
        by_loop = defaultdict(list)
        for (_, future, loop), result in zip(group, results, strict=True):
            by_loop[loop].append((future, result))
        for loop, answers in by_loop.items():
            try:
                loop.call_soon_threadsafe(_answer, answers)
            except RuntimeError:  # that loop is closed: nobody waits for these answers any more
                logger.debug("%d group-commit answers for a closed event loop dropped", len(answers))


def _answer(answers: list[tuple[asyncio.Future[Result], Result | Exception]]) -> None:
    for future, result in answers:
        if future.done():  # the caller was cancelled
            continue
        if isinstance(result, Exception):
            future.set_exception(result)
        else:
            future.set_result(result)
