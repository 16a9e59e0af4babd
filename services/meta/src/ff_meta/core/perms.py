"""POSIX permission checks (pure): mode bits against a caller's uid and gids; root passes."""

from __future__ import annotations

from dataclasses import dataclass
from stat import S_ISGID

from ff_meta.core.errors import FsCode, fs_error
from ff_meta.core.model import Inode

R, W, X = 4, 2, 1
S_ISVTX = 0o1000


@dataclass(frozen=True)
class Caller:
    """Who makes a call: uid, groups (the first for new inodes), whether root."""

    uid: int
    gids: tuple[int, ...]
    name: str = ""
    is_root: bool = False

    @property
    def gid(self) -> int:
        """The group new inodes get."""
        return self.gids[0] if self.gids else self.uid


def allowed(caller: Caller, inode: Inode, want: int) -> bool:
    """Whether ``caller`` has every bit of ``want`` (R|W|X) on ``inode``."""
    return allowed_bits(caller, want, uid=inode.uid, gid=inode.gid, mode=inode.mode, is_dir=inode.is_dir)


def allowed_bits(caller: Caller, want: int, *, uid: int, gid: int, mode: int, is_dir: bool) -> bool:
    """``allowed`` on an inode's owner, group and mode alone (path walks check many directories per query)."""
    if caller.is_root:
        # Root may do anything except execute a file no one may execute.
        return not (want & X) or is_dir or bool(mode & 0o111)
    if caller.uid == uid:
        bits = (mode >> 6) & 7
    elif gid in caller.gids:
        bits = (mode >> 3) & 7
    else:
        bits = mode & 7
    return bits & want == want


def require(caller: Caller, inode: Inode, want: int, what: str) -> None:
    """EACCES unless the caller has every bit of ``want`` on the inode."""
    if not allowed(caller, inode, want):
        raise fs_error(FsCode.ACCESS_DENIED, f"permission denied: {what}")


def require_owner(caller: Caller, inode: Inode, what: str) -> None:
    """EPERM unless the caller owns the inode (or is root)."""
    if not caller.is_root and caller.uid != inode.uid:
        raise fs_error(FsCode.NOT_PERMITTED, f"operation not permitted: {what} (not the owner)")


def check_sticky(caller: Caller, parent: Inode, child: Inode, what: str) -> None:
    """In a sticky directory only the owner of the entry or of the directory (or root) removes it."""
    if parent.mode & S_ISVTX and not caller.is_root and caller.uid not in (parent.uid, child.uid):
        raise fs_error(FsCode.NOT_PERMITTED, f"operation not permitted: {what} (sticky directory)")


def require_session_owner(caller: Caller, session_uid: int) -> None:
    """A write session is used only by the user who opened it (or root)."""
    if not caller.is_root and session_uid != caller.uid:
        raise fs_error(FsCode.ACCESS_DENIED, "the write session belongs to another user")


def checked_mode(c: Caller, inode: Inode, mode: int, path: str) -> int:
    """chmod(2)'s rules: the mode to set.

    chmod(2): the owner (or root) only; set-group-ID is dropped when the caller is not in the file's group
    (as Linux does for a caller without CAP_FSETID). Returns the mode to set.
    """
    require_owner(c, inode, f"chmod {path}")
    if mode & ~0o7777:
        raise fs_error(FsCode.INVALID_ARGUMENT, f"mode {mode:o} has bits beyond 07777")
    if not c.is_root and mode & S_ISGID and inode.gid not in c.gids:
        mode &= ~S_ISGID
    return mode


def checked_owner(c: Caller, inode: Inode, uid: int | None, gid: int | None, path: str) -> dict[str, int]:
    """chown(2)'s rules: the owner and group columns that change.

    chown(2) as Linux checks it: root changes anything; anyone else must own the file, may "change" the
    owner only to itself, and the group only to the current one or one of its own groups. Returns the columns
    that change.
    """
    if c.is_root:
        return {k: v for k, v in (("uid", uid), ("gid", gid)) if v is not None and v != getattr(inode, k)}
    if uid is not None and (c.uid != inode.uid or uid != inode.uid):
        raise fs_error(FsCode.NOT_PERMITTED, f"chown {path}: only root changes the owner")
    if gid is not None and (c.uid != inode.uid or (gid != inode.gid and gid not in c.gids)):
        raise fs_error(FsCode.NOT_PERMITTED, f"chgrp {path}: not the owner or not a member of group {gid}")
    return {"gid": gid} if gid is not None and gid != inode.gid else {}
