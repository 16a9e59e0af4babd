"""What the mount remembers of meta's answers between FUSE callbacks, for a short time.

libfuse's high-level API asks ``getattr`` after every create, mkdir and setattr to fill its reply, and the
kernel asks again after each write, setattr and expired entry: without a memory each is a meta ``Stat``
(``tar x`` made 9 per file). This cache answers those from what meta said moments ago: the inode a create or a
SetAttr returned, or a ``Stat`` made by an earlier callback, for ``ttl_s`` (the mount's attribute timeout, the
staleness the kernel's own cache already allows for changes made elsewhere).

It never answers past a change made through this mount: each change drops what it makes stale (a path's entry,
every path of an inode, or everything for a rename) and bumps a generation, and a ``Stat`` that started before
a change is not kept (its answer may predate it). Negative answers come from two places only: a name this mount
removed, and a name in a folder this mount made within ``ttl_s`` that no callback here has created since (the
folder was empty, and anything made in it by this mount is remembered), so ``tar x``'s lookup of each name
it is about to create needs no round trip. Someone else creating that name meanwhile is seen once ``ttl_s``
has passed, as with the kernel's negative entries.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from hf3fs.entries import Stat

ABSENT = None  # a cached "no such name"
_SWEEP_PAST = 4096  # what the cache holds before each new answer drops the expired ones


class _Unknown:
    """A name this mount just made whose attributes it was not told (mkdir, symlink): it exists, ask meta."""


UNKNOWN: Any = _Unknown()
ASK: Any = _Unknown()  # something about the name changed in a way not known here: ask meta


def _inode(stat: Any) -> int | None:
    return None if stat is ABSENT or stat is UNKNOWN or stat is ASK else int(stat.inode_id)


@dataclass(frozen=True)
class _Entry:
    stat: Any  # hf3fs.fs.Stat, UNKNOWN or ABSENT
    expires: float
    inode_id: int | None = None  # also for UNKNOWN when known
    gen: int = 0  # the generation that put it


class AttrCache:
    """Recent answers about paths: a Stat, or ABSENT. Thread-safe."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s, self._clock = ttl_s, clock
        self._entries: dict[str, _Entry] = {}
        self._inodes: dict[int, _Entry] = {}  # the same Stats by inode (calls on an open handle name no path)
        self._new_dirs: dict[str, float] = {}  # folders made here, empty then: path -> until when we know them whole
        self._gen = 0
        self._cleared = 0  # the generation of the last clear()
        self._lock = threading.Lock()
        self.hits = 0

    def __len__(self) -> int:
        """How much it holds: names, inodes and folders made here (expired ones go once past ``_SWEEP_PAST``)."""
        return len(self._entries) + len(self._inodes) + len(self._new_dirs)

    @property
    def enabled(self) -> bool:
        """False when the cache keeps nothing (``ttl_s`` 0): every call asks meta."""
        return self.ttl_s > 0

    def generation(self) -> int:
        """The current generation: read it before asking meta, hand it to ``put`` with the answer."""
        with self._lock:
            return self._gen

    def lookup(self, path: str) -> tuple[bool, Any]:
        """``(True, stat_or_ABSENT)`` when known, ``(False, None)`` when meta must be asked."""
        if not self.enabled:
            return False, None
        now = self._clock()
        with self._lock:
            entry = self._entries.get(path)
            if entry is not None:
                if entry.expires > now:
                    if entry.stat is UNKNOWN or entry.stat is ASK:
                        return False, None
                    self.hits += 1
                    return True, entry.stat
                del self._entries[path]
            parent = path.rsplit("/", 1)[0] or "/"
            until = self._new_dirs.get(parent)
            if until is not None:
                if until > now:
                    self.hits += 1
                    return True, ABSENT
                del self._new_dirs[parent]
        return False, None

    def exists(self, path: str) -> bool:
        """Whether ``path`` is known to exist (its attributes may be stale: opendir's check)."""
        if not self.enabled:
            return False
        with self._lock:
            entry = self._entries.get(path)
            known = entry is not None and entry.stat is not ABSENT and entry.stat is not ASK
            return known and entry is not None and entry.expires > self._clock()

    def lookup_inode(self, inode_id: int) -> Any:
        """The Stat of an inode when known, else ABSENT."""
        if not self.enabled:
            return ABSENT
        with self._lock:
            entry = self._inodes.get(inode_id)
            if entry is None:
                return ABSENT
            if entry.expires <= self._clock():
                del self._inodes[inode_id]
                return ABSENT
            self.hits += 1
            return entry.stat

    def remember(self, path: str | None, stat: Any, since: int) -> None:
        """Keep a Stat read at generation ``since`` (of ``path``, or by inode when None) unless anything changed since.

        A "no such name" is kept unless that name (or everything) changed since: the changes of other files (a
        release of the previous one racing ``tar``'s next lookup) do not matter.
        """
        if not self.enabled:
            return
        with self._lock:
            if self._gen != since and not (stat is ABSENT and path is not None and self._untouched(path, since)):
                return
            if path is None:
                self._inodes[stat.inode_id] = _Entry(stat, self._clock() + self.ttl_s)
            else:
                self._put(path, stat)

    def renewed(self, path: str, stat: Stat, since: int) -> bool:
        """Meta's fresh answer about ``path`` (an Open's, read at generation ``since``), kept as ``remember`` keeps one.

        Whether its size or mtime differ from what was known of the path (True when nothing was): the kernel may
        still hold the older attributes.
        """
        known, before = self.lookup(path)
        self.remember(path, stat, since)
        same = known and isinstance(before, Stat) and (before.size, before.mtime_ns) == (stat.size, stat.mtime_ns)
        return not same

    def changed(self, path: str, stat: Any = ABSENT, *, new_dir: bool = False, made: bool = False) -> None:
        """This mount changed ``path``: its new Stat, UNKNOWN when it exists but meta did not say how, or ABSENT.

        The new Stat is a create, mkdir or SetAttr answer; UNKNOWN follows a symlink; ABSENT: it is gone.
        ``new_dir``: an empty folder was just made there. The parent folder's entry goes (its times and links
        change), and so do the other paths of the inode that was there. ``made``: meta made ``stat``'s inode
        there just now (a new name): the parent's times became its ctime in the same transaction and a new folder
        added a link, so a known parent Stat is brought up to date (its expiry kept) rather than asked again.
        """
        with self._lock:
            self._gen += 1
            old = self._entries.pop(path, None)
            parent = path.rsplit("/", 1)[0] or "/"
            if (above := self._entries.get(parent)) is not None and above.stat is not ABSENT:
                if made and isinstance(stat, Stat) and isinstance(above.stat, Stat) and parent != path:
                    t = stat.ctime_ns
                    now = replace(above.stat, mtime_ns=t, ctime_ns=t, nlink=above.stat.nlink + stat.is_dir())
                    self._entries[parent] = entry = _Entry(now, above.expires, above.inode_id, self._gen)
                    self._inodes[now.inode_id] = entry
                else:
                    self._put(parent, UNKNOWN, above.inode_id)  # it exists, its times and links changed
                    self._inodes.pop(above.inode_id or 0, None)
            if old is not None and old.inode_id is not None:
                self._drop_inode(old.inode_id)
            if stat is ABSENT:
                for p in [p for p in self._entries if p.startswith(path + "/")]:
                    del self._entries[p]
                for p in [p for p in self._new_dirs if p == path or p.startswith(path + "/")]:
                    del self._new_dirs[p]
            elif stat is not UNKNOWN:
                self._drop_inode(stat.inode_id)
            if self.enabled:
                self._put(path, stat)
                if new_dir:
                    self._new_dirs[path] = self._clock() + self.ttl_s

    def changed_inode(self, inode_id: int, stat: Any = ABSENT) -> None:
        """This mount changed an inode through a handle: each path of it is forgotten, or given its new Stat if known.

        Through a handle: SetAttr, Truncate, Sync, Close.
        """
        with self._lock:
            self._gen += 1
            paths = self._drop_inode(inode_id)
            if stat is not ABSENT and self.enabled:
                self._inodes[inode_id] = _Entry(stat, self._clock() + self.ttl_s)
                for p in paths:
                    self._put(p, stat)

    def forget(self, path: str) -> None:
        """``path`` may have changed in a way not known here (a call that failed): ask meta next time.

        Both about it and about names in its folder.
        """
        with self._lock:
            self._gen += 1
            self._entries[path] = _Entry(ASK, self._clock() + self.ttl_s, None, self._gen)
            self._new_dirs.pop(path, None)
            self._new_dirs.pop(path.rsplit("/", 1)[0] or "/", None)

    def clear(self) -> None:
        """Forget everything (renames: every path under the names moved changes)."""
        with self._lock:
            self._gen += 1
            self._cleared = self._gen
            self._entries.clear()
            self._inodes.clear()
            self._new_dirs.clear()

    def _untouched(self, path: str, since: int) -> bool:
        entry = self._entries.get(path)
        return self._cleared <= since and (entry is None or entry.gen <= since)

    def _put(self, path: str, stat: Any, inode_id: int | None = None) -> None:
        ino = _inode(stat)
        entry = _Entry(stat, self._clock() + self.ttl_s, inode_id if ino is None else ino, self._gen)
        self._entries[path] = entry
        if ino is not None:
            self._inodes[ino] = entry
        if len(self) > _SWEEP_PAST:  # a burst of names: drop the expired ones
            now = self._clock()
            for p in [p for p, e in self._entries.items() if e.expires <= now]:
                del self._entries[p]
            for i in [i for i, e in self._inodes.items() if e.expires <= now]:
                del self._inodes[i]
            for p in [p for p, until in self._new_dirs.items() if until <= now]:
                del self._new_dirs[p]

    def _drop_inode(self, inode_id: int) -> list[str]:
        """Forget an inode's attributes; its paths stay known to exist.

        They stay UNKNOWN: a name in a new folder must not fall back to the folder's "empty when made".
        """
        paths = [p for p, e in self._entries.items() if e.inode_id == inode_id]
        for p in paths:
            self._put(p, UNKNOWN, inode_id)
        self._inodes.pop(inode_id, None)
        return paths
