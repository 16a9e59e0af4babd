"""The operators' arguments and answers.

What meta's operators take and return besides the core's types: the arguments of the calls with many, and
their answers (``wire.py`` converts them from and to protobuf at the servicer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ff_meta.core.model import DirEntry, Inode, LayoutSpec, PathAt, SessionInfo


@dataclass(frozen=True)
class Capability:
    """An IoCapability: what storage checks on a user's reads and writes of a file (``ff_fsprotocol.capability``)."""

    token: bytes
    inode_id: int
    writable: bool
    expires_at_ns: int


@dataclass(frozen=True, kw_only=True)
class CreateArgs:
    """A Create (or one item of a BatchCreate), checked: a write open has a session and a client id."""

    path: PathAt
    mode: int
    exclusive: bool = False
    write: bool = False
    truncate: bool = False
    layout: LayoutSpec | None = None
    reserve_bytes: int = 0
    session_id: str = ""
    client_id: str = ""
    set_mode: int | None = None  # chmod the file to this (created with it, or changed if it exists)
    expect_inode_id: int = 0  # the path must still name this file (0: any)


@dataclass(frozen=True, kw_only=True)
class OpenArgs:
    """An Open, checked: a write open has a session and a client id; O_TRUNC only with write."""

    path: PathAt
    read: bool
    write: bool
    truncate: bool = False
    session_id: str = ""
    client_id: str = ""


@dataclass(frozen=True)
class CloseArgs:
    """A Close or Sync (or one item of a BatchClose).

    The file, the caller's write session ("": none), the length it wrote and the time of its last write (None: not
    said).
    """

    inode_id: int
    session_id: str
    written: int
    mtime_ns: int | None


@dataclass(frozen=True, kw_only=True)
class Opened:
    """A file opened or created.

    Its inode, the write session (None: a read), the IoCapability (None for a directory), whether it was created, and
    the tightest byte quota's room and folder (None: no byte quota).
    """

    inode: Inode
    session: SessionInfo | None = None
    capability: Capability | None = None
    created: bool = False
    quota_room: tuple[int, int] | None = None


class StatItem(NamedTuple):
    """One answer of a BatchStat: the inode, and a read capability when asked for and allowed.

    A tuple: a batch makes thousands (a frozen dataclass costs several times as much to build).
    """

    inode: Inode
    read_capability: Capability | None = None


@dataclass(frozen=True)
class DirPage:
    """A page of a listing; ``last_name``: the name to list after for the next page ("": the end)."""

    entries: list[DirEntry]
    last_name: str


@dataclass(frozen=True)
class FsSpace:
    """StatFs: the cluster's usable capacity and free bytes, and meta's used bytes and inode count."""

    capacity_bytes: int
    used_bytes: int
    free_bytes: int
    num_inodes: int
