"""What meta's rules read and write, as a protocol the store implements: the rows of one transaction.

``core`` (path resolution, permission checks, quota rules) is written against these methods only, so it is
tested with rows in a dict (tests/unit) and runs in the service over SQL (``store/tx.py``: ``Tx``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

from ff_meta.core.model import Inode, QuotaRow


class DirBits(NamedTuple):
    """The permission columns of a directory (a walk down checks several per query)."""

    inode_id: int
    type: int
    mode: int
    uid: int
    gid: int


class AncestorRow(NamedTuple):
    """A directory on the way up, with its name.

    The name is its parent's entry's (None for the root, or where a tree in the trash was cut off).
    """

    inode_id: int
    type: int
    mode: int
    uid: int
    gid: int
    parent_id: int
    name: str | None


class NamespaceRows(Protocol):
    """The inodes and directory entries of one transaction.

    A lookup may raise ``FsError`` (ELOOP) when the request has spent its walking budget (``paths.WalkBudget``),
    or a store-specific exception that makes the caller run the transaction again elsewhere.
    """

    def get(self, inode_id: int) -> Inode | None:
        """The inode, or None."""
        ...

    def lookup(self, parent_id: int, name: str) -> Inode | None:
        """The inode the entry ``name`` of directory ``parent_id`` names, or None."""
        ...

    def walk_dirs(
        self, start_id: int, names: Sequence[str], then: str | None = None
    ) -> tuple[Sequence[DirBits], Inode, Inode | None] | None:
        """Down several directories in one go.

        Down from ``start_id`` along ``names`` in one go: the permission columns of ``start_id`` and of each
        directory before the last, the last's inode, and with ``then`` the inode that the entry ``then`` of the last
        names (None: no such entry, or no ``then``); None when an entry of ``names`` is missing.
        """
        ...

    def ancestry(self, dir_id: int, limit: int) -> Sequence[AncestorRow]:
        """The directory and the directories above it, nearest first.

        Up to the root (or to where a tree in the trash was cut off), at most ``limit`` rows.
        """
        ...

    def links(self, inode_id: int, limit: int) -> Sequence[tuple[int, str]]:
        """Up to ``limit`` entries (parent id, name) that name the inode, by parent id and name."""
        ...


class QuotaRows(Protocol):
    """The directory quotas of one transaction."""

    def any_quota(self) -> bool:
        """Whether any directory has a quota (most file systems have none: then no walk up is needed)."""
        ...

    def quota_rows(self, ids: Sequence[int]) -> list[QuotaRow]:
        """The quotas of those of ``ids`` that have one (any order)."""
        ...

    def add_usage(self, quota_id: int, *, dbytes: int, dinodes: int, dreserved: int) -> None:
        """Add to a quota's usage; used and reserved bytes never go below 0."""
        ...
