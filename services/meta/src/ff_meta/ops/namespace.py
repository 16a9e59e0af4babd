"""Namespace operators: stat, listings, making and removing entries, renames, attributes, realpath, StatFs."""

from __future__ import annotations

from collections.abc import Sequence

from ff_meta.core.errors import FsCode, FsError, fs_error
from ff_meta.core.model import AttrChange, Inode, InodeType, LayoutSpec, PathAt
from ff_meta.core.paths import split_path
from ff_meta.core.perms import Caller, R, allowed
from ff_meta.ops.shared import Shared
from ff_meta.ops.types import Capability, DirPage, FsSpace, StatItem
from ff_meta.store import trash
from ff_meta.store.fsops import namespace, reads
from ff_meta.store.once import once

# Calls up to these sizes run on the event loop on SQLite (well under a millisecond); larger ones in a thread.
SMALL_BATCH = 64
SMALL_PAGE = 1000
SMALL_MKDIRS = 16
MAX_RETENTION_S = 100 * 365 * 24 * 3600.0


class NamespaceOps:
    """The calls on names and inodes that need no storage."""

    def __init__(self, shared: Shared) -> None:
        self._s = shared
        self._store = shared.store

    async def statfs(self, caller: Caller) -> FsSpace:
        """The storage targets' disks (divided by the replication), meta's used bytes and inode count."""
        used, count = await self._store.read(caller, reads.statfs, small=False)
        space = await self._s.space.get()
        if space is not None:
            return FsSpace(space.capacity_bytes, used, space.free_bytes, count)
        cap = self._s.options.capacity_bytes  # no target reported its disk: the configured figure
        return FsSpace(cap, used, max(0, cap - used), count)

    async def stat(self, caller: Caller, at: PathAt, follow_last: bool) -> tuple[Inode, int]:
        """The inode and, for a file, its open write sessions.

        From the read cache while the database has had no commit (an answer with write sessions is not kept: their
        leases lapse with time).
        """
        version = self._store.data_version()
        key = ("stat", caller, at, follow_last)
        if version is not None:
            known: tuple[Inode, int] | None = self._s.reads.get(version, key)
            if known is not None:
                return known
        answer = await self._store.read(caller, lambda t: reads.stat_with_sessions(t, at, follow_last))
        if version is not None and answer[1] == 0:
            self._s.reads.put(version, key, answer)
        return answer

    async def batch_stat(
        self, caller: Caller, paths: Sequence[PathAt | FsError], follow_last: bool, read_capability: bool
    ) -> list[StatItem | FsError]:
        """Many stats in one read.

        Each path's inode or error (an FsError in place of a path is its answer), with a read capability for
        each file the caller may read when asked (one per file, however often it is named).
        """
        results = await self._store.read(
            caller, lambda t: reads.batch_stat(t, paths, follow_last), small=len(paths) <= SMALL_BATCH
        )
        caps: dict[int, Capability] = {}
        out: list[StatItem | FsError] = []
        for r in results:
            if isinstance(r, FsError):
                out.append(r)
                continue
            cap = None
            if read_capability and r.is_file and allowed(caller, r, R):
                cap = caps.get(r.inode_id) or caps.setdefault(r.inode_id, self._s.capability(r, False))
            out.append(StatItem(r, cap))
        return out

    async def list_dir(self, caller: Caller, at: PathAt, page_size: int, after: str, with_inodes: bool) -> DirPage:
        """A page of a directory's entries by name, after ``after``.

        From the read cache while the database has had no commit.
        """
        version = self._store.data_version()
        key = ("list", caller, at, page_size, after, with_inodes)
        if version is not None:
            known: DirPage | None = self._s.reads.get(version, key)
            if known is not None:
                return known
        listings = self._s.listings
        entries, last = await self._store.read(
            caller,
            lambda t: reads.list_dir(t, at, page_size, after, with_inodes, listings),
            small=page_size <= SMALL_PAGE,
        )
        page = DirPage(entries, last)
        if version is not None:
            self._s.reads.put(version, key, page, max(1, len(entries)))
        return page

    async def mkdirs(
        self,
        caller: Caller,
        at: PathAt,
        mode: int,
        recursive: bool,
        layout: LayoutSpec | None,
        once_key: str | None = None,
    ) -> Inode:
        """Mkdir (-p); a call done once per ``once_key`` (``store/once.py``), as the other namespace changes."""
        _, parts = split_path(at.path)
        await self._s.check_table(layout)
        ids = await self._s.ids.take(max(1, len(parts)))
        return await self._store.write(
            caller,
            once(once_key, lambda t: namespace.mkdirs(t, at, mode, recursive, layout, ids)),
            small=len(parts) <= SMALL_MKDIRS,
        )

    async def symlink(self, caller: Caller, at: PathAt, target: str, once_key: str | None = None) -> Inode:
        """A symbolic link to ``target``."""
        [inode_id] = await self._s.ids.take(1)
        return await self._store.write(caller, once(once_key, lambda t: namespace.symlink(t, at, target, inode_id)))

    async def mknod(
        self, caller: Caller, at: PathAt, kind: InodeType, mode: int, rdev: int, once_key: str | None = None
    ) -> Inode:
        """A FIFO, socket or device node."""
        [inode_id] = await self._s.ids.take(1)
        body = once(once_key, lambda t: namespace.mknod(t, at, kind, mode, rdev, inode_id))
        return await self._store.write(caller, body)

    async def hardlink(self, caller: Caller, old: PathAt, new: PathAt, once_key: str | None = None) -> Inode:
        """Another name for a file."""
        return await self._store.write(caller, once(once_key, lambda t: namespace.hardlink(t, old, new)))

    async def remove(
        self,
        caller: Caller,
        at: PathAt,
        recursive: bool,
        to_trash: bool,
        retention_s: float,
        expect_dir: bool | None,
        once_key: str | None = None,
    ) -> str:
        """Unlink or rmdir, or move to the trash (``retention_s``; 0: the default): the trash id or ""."""
        retention = retention_s or self._s.options.trash_retention_s
        if not 0 <= retention <= MAX_RETENTION_S:  # NaN fails too
            raise fs_error(FsCode.INVALID_ARGUMENT, f"trash_retention_s must be from 0 to {MAX_RETENTION_S:.0f}")
        trash_id = trash.new_trash_id() if recursive or to_trash else ""  # (an unlink's: none; uuid4 costs a syscall)
        body = once(once_key, lambda t: namespace.remove(t, at, recursive, to_trash, retention, trash_id, expect_dir))
        return await self._store.write(caller, body)

    async def rename(
        self, caller: Caller, src: PathAt, dst: PathAt, no_replace: bool, once_key: str | None = None
    ) -> Inode:
        """Move an entry to another name, as the rename system call (``no_replace``: RENAME_NOREPLACE)."""
        return await self._store.write(caller, once(once_key, lambda t: namespace.rename(t, src, dst, no_replace)))

    async def set_attr(self, caller: Caller, at: PathAt, follow_last: bool, change: AttrChange) -> Inode:
        """chmod, chown, utimes, a directory's default layout."""
        await self._s.check_table(change.layout)
        return await self._store.write(caller, lambda t: namespace.set_attr(t, at, follow_last, change))

    async def realpath(self, caller: Caller, at: PathAt) -> tuple[str, int]:
        """The absolute path (through names the caller may search) and the inode id."""
        return await self._store.read(caller, lambda t: reads.realpath(t, at))
