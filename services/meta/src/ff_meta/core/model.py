"""The inode as meta's logic sees it (pure data)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import IntEnum

ROOT_INODE_ID = 1
NO_LIMIT = (1 << 64) - 1


class InodeType(IntEnum):
    FILE = 1
    DIRECTORY = 2
    SYMLINK = 3
    FIFO = 4
    SOCKET = 5
    CHAR_DEVICE = 6
    BLOCK_DEVICE = 7


SPECIAL_TYPES = frozenset({InodeType.FIFO, InodeType.SOCKET, InodeType.CHAR_DEVICE, InodeType.BLOCK_DEVICE})
DEVICE_TYPES = frozenset({InodeType.CHAR_DEVICE, InodeType.BLOCK_DEVICE})


@dataclass(frozen=True, kw_only=True)
class Inode:
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

    @property
    def is_dir(self) -> bool:
        return self.type is InodeType.DIRECTORY

    @property
    def is_file(self) -> bool:
        return self.type is InodeType.FILE

    @property
    def is_symlink(self) -> bool:
        return self.type is InodeType.SYMLINK

    def with_(self, **changes: object) -> Inode:
        return replace(self, **changes)  # type: ignore[arg-type]
