"""A lock per key (an inode), made on first use and dropped with its last user."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Hashable, Iterator


class KeyedLocks:
    """One ``threading.Lock`` per key while anyone holds or awaits it.

    A dict of locks made on first use and never dropped grows by one per key ever used (a process appending to ever
    new files kept one per file): here a lock counts its holder and waiters and goes with the last of them, and one
    that waited while another held it keeps it, so the lock still excludes those who come after.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._locks: dict[Hashable, tuple[threading.Lock, int]] = {}  # key -> its lock, how many hold or await it

    @contextlib.contextmanager
    def hold(self, key: Hashable) -> Iterator[None]:
        """Held while the caller has ``key``'s lock (others with the same key wait)."""
        with self._lock:
            lock, users = self._locks.get(key) or (threading.Lock(), 0)
            self._locks[key] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._lock:
                lock, users = self._locks.pop(key)
                if users > 1:
                    self._locks[key] = (lock, users - 1)

    def __len__(self) -> int:
        """How many keys have a holder or a waiter now."""
        with self._lock:
            return len(self._locks)
