"""The inode as meta's logic sees it (pure data)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import IntEnum

ROOT_INODE_ID = 1
NO_LIMIT = (1 << 64) - 1


class InodeType(IntEnum):
    """The kinds of inode (the proto's InodeType values)."""

    FILE = 1
    DIRECTORY = 2
    SYMLINK = 3
    FIFO = 4
    SOCKET = 5
    CHAR_DEVICE = 6
    BLOCK_DEVICE = 7


_TYPES_BY_VALUE = {int(t): t for t in InodeType}


def inode_type_of(value: int) -> InodeType:
    """The InodeType of a stored value (a dict lookup: ``InodeType(value)`` costs a List of 100 names ~15 %).

    Raises:
        ValueError: no such type.
    """
    return _TYPES_BY_VALUE.get(value) or InodeType(value)


SPECIAL_TYPES = frozenset({InodeType.FIFO, InodeType.SOCKET, InodeType.CHAR_DEVICE, InodeType.BLOCK_DEVICE})
DEVICE_TYPES = frozenset({InodeType.CHAR_DEVICE, InodeType.BLOCK_DEVICE})


@dataclass(frozen=True, kw_only=True)
class Inode:
    """An inode's row as meta's logic sees it."""

    inode_id: int
    type: InodeType
    mode: int
    uid: int
    gid: int
    nlink: int = 1
    atime_ns: int = 0
    mtime_ns: int = 0
    ctime_ns: int = 0
    length: int = 0
    parent_id: int = 0
    symlink_target: str = ""
    chain_table_id: int = 0
    chain_table_version: int = 0
    chunk_size: int = 0
    stripe_size: int = 0
    chain_begin: int = 0
    shuffle_seed: int = 0
    rdev: int = 0  # a device node's number (0 for every other type)
    entries_version: int = 0  # a directory's: moves with every change of its entries (0 for other types)

    @property
    def is_dir(self) -> bool:
        """Whether it is a directory."""
        return self.type is InodeType.DIRECTORY

    @property
    def is_file(self) -> bool:
        """Whether it is a regular file."""
        return self.type is InodeType.FILE

    @property
    def is_symlink(self) -> bool:
        """Whether it is a symbolic link."""
        return self.type is InodeType.SYMLINK

    def with_(self, **changes: object) -> Inode:
        """A copy with some fields changed."""
        return replace(self, **changes)  # type: ignore[arg-type]


# One entry of a listing: (name, inode id, type, the inode when asked for, else None). A plain tuple: a page
# holds up to 10,000, and building a NamedTuple or dataclass per entry cost a List of 100 names about 15 %.
DirEntry = tuple[str, int, InodeType, Inode | None]


@dataclass(frozen=True)
class PathAt:
    """A path as a request names it.

    Absolute, or relative to directory ``parent_id`` (0: the root); an empty path with a parent names that inode itself.
    """

    parent_id: int
    path: str


@dataclass(frozen=True)
class LayoutSpec:
    """A layout as asked for (0: not said, the directory's or the default then)."""

    chain_table_id: int = 0
    chunk_size: int = 0
    stripe_size: int = 0


@dataclass(frozen=True)
class Defaults:
    """What new files get when no directory up the tree says otherwise, and the chain tables known now."""

    layout: LayoutSpec
    tables: dict[int, tuple[int, int]]  # table id -> (version, number of chains)
    lease_s: float


@dataclass(frozen=True)
class AttrChange:
    """What a SetAttr changes (None, False: not that)."""

    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    atime_ns: int | None = None
    mtime_ns: int | None = None
    atime_now: bool = False
    mtime_now: bool = False
    layout: LayoutSpec | None = None


@dataclass(frozen=True)
class SessionInfo:
    """A write session as its holder sees it."""

    session_id: str
    client_id: str
    inode_id: int
    write_limit: int
    lease_s: float


@dataclass(frozen=True)
class QuotaRow:
    """A directory quota: its limits (0: none) and what the tree under it uses and has reserved."""

    inode_id: int
    max_bytes: int
    max_inodes: int
    used_bytes: int
    used_inodes: int
    reserved_bytes: int


@dataclass(frozen=True)
class TrashRow:
    """A tree in the trash."""

    trash_id: str
    inode_id: int
    type: InodeType
    uid: int
    original_path: str
    removed_at_ns: int
    expires_at_ns: int


@dataclass(frozen=True)
class GcJob:
    """A removed file whose chunks storage must still delete."""

    inode_id: int
    chain_table_id: int
    stripe_size: int
    chain_begin: int
    shuffle_seed: int
    attempts: int
