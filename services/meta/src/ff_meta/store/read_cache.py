"""Answers of reads kept while the database has had no commit since (SQLite's ``PRAGMA data_version``)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

DEFAULT_MAX_ENTRIES = 20_000


class ReadCache:
    """Read answers by key, all dropped at once when the database's data version moves.

    SQLite's ``PRAGMA data_version`` on meta's reader connection changes whenever any other connection, of this
    process or another (several meta instances on one file), commits. An answer is put with the version read *before*
    the transaction that computed it, and served only while the version read now is still that one: no commit has
    happened since before its snapshot, so it is the answer a new read would give. Only answers that depend on nothing
    but the database and the key are kept (not a count of write sessions, whose leases lapse with time). Sizes count
    entries (a listing page counts its names), least recently used first out. Event-loop only (not thread-safe).
    """

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        self._max_entries = max_entries
        self._version: int | None = None
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._num_entries = 0

    def get(self, version: int, key: Hashable) -> Any | None:
        """The answer of ``key`` if it was put at ``version`` (the data version read now); None otherwise."""
        if version != self._version:
            self._adopt(version)
            return None
        hit = self._entries.get(key)
        if hit is None:
            return None
        self._entries.move_to_end(key)
        return hit[0]

    def put(self, version: int, key: Hashable, answer: Any, size: int = 1) -> None:
        """Keep ``answer``, computed in a snapshot taken after ``version`` was read.

        Not kept when that is no longer the version this cache holds answers of.
        """
        if version != self._version or size > self._max_entries:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self._num_entries -= old[1]
        self._entries[key] = (answer, size)
        self._num_entries += size
        while self._num_entries > self._max_entries:
            _, (_, dropped) = self._entries.popitem(last=False)
            self._num_entries -= dropped

    def _adopt(self, version: int) -> None:
        self._entries.clear()
        self._num_entries = 0
        self._version = version

    def __len__(self) -> int:
        return len(self._entries)
