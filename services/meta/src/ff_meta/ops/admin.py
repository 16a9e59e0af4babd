"""Quota and trash operators: directory quotas (get, set, list) and the trash (list, restore, empty)."""

from __future__ import annotations

from collections.abc import Sequence

from ff_meta.core.errors import FsCode, FsError, fs_error
from ff_meta.core.model import Inode, PathAt, QuotaRow, TrashRow
from ff_meta.core.perms import Caller
from ff_meta.ops.namespace import SMALL_PAGE
from ff_meta.ops.shared import Shared
from ff_meta.store import trash
from ff_meta.store.fsops import quotas
from ff_meta.store.once import once


class QuotaOps:
    """Directory quotas."""

    def __init__(self, shared: Shared) -> None:
        self._store = shared.store

    async def get(self, caller: Caller, at: PathAt) -> list[tuple[QuotaRow, str]]:
        """The quotas over a path, nearest first, with their folders' paths."""
        return await self._store.read(caller, lambda t: quotas.get_quota(t, at))

    async def set(self, caller: Caller, at: PathAt, max_bytes: int, max_inodes: int) -> tuple[QuotaRow, str]:
        """Set (0 and 0: remove) a directory's quota; its usage counted from the tree."""
        return await self._store.write(caller, lambda t: quotas.set_quota(t, at, max_bytes, max_inodes))

    async def list(self, caller: Caller) -> list[tuple[QuotaRow, str]]:
        """Every quota, with its folder's path."""
        return await self._store.read(caller, quotas.list_quotas, small=False)


class TrashOps:
    """The trash: removed trees kept until they expire, restorable by their owner."""

    def __init__(self, shared: Shared) -> None:
        self._store = shared.store

    async def list(self, caller: Caller, all_users: bool, page_size: int, after: str) -> tuple[list[TrashRow], str]:
        """A page of the caller's trash (everyone's: admins only), and the id to list after next ("": the end)."""
        if all_users and not caller.is_root:
            raise fs_error(FsCode.NOT_PERMITTED, "only admins list everyone's trash")
        return await self._store.read(
            caller, lambda t: trash.list_trash(t, all_users, page_size, after), small=page_size <= SMALL_PAGE
        )

    async def restore(
        self, caller: Caller, trash_id: str, to: PathAt | None, once_key: str | None = None
    ) -> tuple[Inode, str]:
        """Put an entry back (where it was, or at ``to``): the inode and its path; done once per ``once_key``."""
        return await self._store.write(caller, once(once_key, lambda t: trash.restore_trash(t, trash_id, to)))

    async def empty(self, caller: Caller, ids: Sequence[str], expired_only: bool) -> int:
        """Delete the caller's entries among ``ids`` (all of them if none is given): how many went."""
        found = await self._store.read(caller, lambda t: trash.trash_ids(t, ids, expired_only))
        n = 0
        for trash_id in found:
            try:
                await self.delete(caller, trash_id)
            except FsError as err:
                if err.fs_code is not FsCode.NOT_FOUND:  # deleted meanwhile: fine
                    raise
                continue
            n += 1
        return n

    async def expire(self, caller: Caller) -> int:
        """Delete every expired entry (of every user): how many."""
        ids = await self._store.read(caller, lambda t: trash.trash_ids(t, [], expired_only=True, everyone=True))
        for trash_id in ids:
            await self.delete(caller, trash_id, check_owner=False)
        return len(ids)

    async def delete(self, caller: Caller, trash_id: str, *, check_owner: bool = True) -> None:
        """Delete a trash entry in small transactions (each consistent on its own)."""
        if check_owner:
            await self._store.read(caller, lambda t: trash.trash_row(t, trash_id))
        while True:
            _, done = await self._store.write(caller, lambda t: trash.delete_trash_entry(t, trash_id))
            if done:
                return
