"""Directory quota rules (pure).

Which quotas a change counts against, the EDQUOT check, what is left.

Against ``QuotaRows``; the directories above come from the ``PathResolver``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ff_meta.core.errors import FsCode, fs_error
from ff_meta.core.model import NO_LIMIT, Inode, QuotaRow
from ff_meta.core.resolve import PathResolver
from ff_meta.core.rows import QuotaRows


def check_charge(chain: Sequence[QuotaRow], *, dbytes: int = 0, dinodes: int = 0, dreserved: int = 0) -> None:
    """EDQUOT when adding the usage would grow some quota of ``chain`` past its limit (shrinking never fails).

    Raises:
        FsExhausted: the inode or byte limit of a quota would be exceeded (EDQUOT).
    """
    for q in chain:
        if dinodes > 0 and q.max_inodes and q.used_inodes + dinodes > q.max_inodes:
            raise fs_error(
                FsCode.QUOTA_EXCEEDED,
                f"inode quota of directory {q.inode_id} exceeded ({q.used_inodes}/{q.max_inodes})",
            )
        grow = dbytes + dreserved
        if grow > 0 and q.max_bytes and q.used_bytes + q.reserved_bytes + grow > q.max_bytes:
            raise fs_error(
                FsCode.QUOTA_EXCEEDED,
                f"byte quota of directory {q.inode_id} exceeded "
                f"({q.used_bytes + q.reserved_bytes}+{grow}"
                f"/{q.max_bytes})",
            )


def quota_room(chain: Sequence[QuotaRow], reserved: int = 0) -> tuple[int, int] | None:
    """The room the tightest byte quota of a chain leaves, and its folder.

    (bytes still allowed, folder) of the tightest byte quota of ``chain`` once ``reserved`` more bytes are
    taken; None when none of them limits bytes.
    """
    rooms = [
        (max(0, q.max_bytes - q.used_bytes - q.reserved_bytes - reserved), q.inode_id) for q in chain if q.max_bytes
    ]
    return min(rooms) if rooms else None


def headroom(chain: Sequence[QuotaRow]) -> int:
    """Bytes the byte quotas of ``chain`` would still grant (``NO_LIMIT`` when none limits bytes)."""
    rooms = [max(0, q.max_bytes - q.used_bytes - q.reserved_bytes) for q in chain if q.max_bytes]
    return min(rooms) if rooms else NO_LIMIT


def quota_ids_text(chain: Sequence[QuotaRow]) -> str:
    """The quota ids a write session keeps (comma-separated, nearest first)."""
    return ",".join(str(q.inode_id) for q in chain)


@dataclass
class QuotaBook:
    """The quotas of one transaction: a folder's chain of quotas and charging usage to them."""

    rows: QuotaRows
    paths: PathResolver
    _any: bool | None = None

    def any_quota(self) -> bool:
        """Whether any directory has a quota (asked once per transaction)."""
        if self._any is None:
            self._any = self.rows.any_quota()
        return self._any

    def chain(self, dir_inode: Inode | None) -> list[QuotaRow]:
        """Quotas of ``dir_inode`` and its ancestors, nearest first."""
        if dir_inode is None or not self.any_quota():
            return []
        return self.chain_of(self.paths.ancestors(dir_inode))

    def chain_of(self, dir_ids: Sequence[int]) -> list[QuotaRow]:
        """The quotas (as they are now) of those of ``dir_ids`` that have one, in the order given."""
        if not dir_ids or not self.any_quota():
            return []
        rows = {q.inode_id: q for q in self.rows.quota_rows(dir_ids)}
        return [rows[i] for i in dir_ids if i in rows]

    def of_ids(self, ids: str) -> list[QuotaRow]:
        """The quotas a write session recorded (``quota_ids_text``), as they are now."""
        wanted = [int(x) for x in ids.split(",") if x]
        return self.rows.quota_rows(wanted) if wanted else []

    def charge(
        self, chain: Sequence[QuotaRow], *, dbytes: int = 0, dinodes: int = 0, dreserved: int = 0, enforce: bool = True
    ) -> None:
        """Add usage to every quota of a chain.

        With ``enforce``, growth past a limit is EDQUOT (nothing charged).
        """
        if enforce:
            check_charge(chain, dbytes=dbytes, dinodes=dinodes, dreserved=dreserved)
        for q in chain:
            self.rows.add_usage(q.inode_id, dbytes=dbytes, dinodes=dinodes, dreserved=dreserved)
