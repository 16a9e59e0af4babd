"""Pages of directory listings kept between calls, keyed by the directory's ``entries_version``."""

from __future__ import annotations

import threading
from collections import OrderedDict

from ff_meta.core.model import DirEntry

ListingKey = tuple[int, int, str, int]
"""(directory inode id, its ``entries_version``, the name the page starts after, page size)."""

DEFAULT_MAX_ENTRIES = 100_000


class ListingCache:
    """Names-only listing pages (what ``listdir`` asks), least recently used dropped past ``max_entries`` in all.

    Right across transactions and instances: a directory's ``entries_version`` moves in every transaction that adds or
    removes one of its entries (``Tx._entries_changed``), so the page read in a snapshot where the directory is at
    version v is the page of every snapshot where it is at v. Reads and puts come from the event loop and, on
    PostgreSQL, from worker threads: a lock keeps the order book whole. Listings with inodes are not kept (an entry's
    inode changes without moving its directory's version).
    """

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        self._max_entries = max_entries
        self._num_entries = 0
        self._pages: OrderedDict[ListingKey, tuple[list[DirEntry], str]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: ListingKey) -> tuple[list[DirEntry], str] | None:
        """The page of ``key`` (entries, the name to list after next), or None; the list is shared: do not change it."""
        with self._lock:
            page = self._pages.get(key)
            if page is not None:
                self._pages.move_to_end(key)
            return page

    def put(self, key: ListingKey, entries: list[DirEntry], last_name: str) -> None:
        """Keep the page of ``key`` (a page larger than the whole cache is not kept)."""
        if len(entries) > self._max_entries:
            return
        with self._lock:
            old = self._pages.pop(key, None)
            if old is not None:
                self._num_entries -= len(old[0])
            self._pages[key] = (entries, last_name)
            self._num_entries += len(entries)
            while self._num_entries > self._max_entries:
                _, (dropped, _) = self._pages.popitem(last=False)
                self._num_entries -= len(dropped)

    def __len__(self) -> int:
        return len(self._pages)
