"""Path and name rules (pure): components, limits, what a name may contain."""

from __future__ import annotations

from dataclasses import dataclass

from ff_meta.core.errors import FsCode, fs_error

MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4096
MAX_SYMLINK_HOPS = 40
# A path of 4096 bytes has at most 2048 components ("a/" each); said explicitly so that no walk is longer.
MAX_PATH_COMPONENTS = MAX_PATH_BYTES // 2
# Directories may nest at most this deep below the root (Linux has no such limit, but every walk up the tree
# (permission checks of inode addressing, quotas, rename's loop check, realpath) is bounded by it).
MAX_DIR_DEPTH = 4096
# One path resolution may walk at most this many components, symlink expansions included (40 hops of
# 2,048-component targets would otherwise be 80,000 lookups for one Stat): ELOOP beyond. One transaction
# (a BatchStat of 10,000 paths) may spend at most MAX_WALK_COST on walking paths (a lookup costs 1; one
# query for up to 16 directories down, 1 + 1 per 2; the directories above an inode, 1 + 1 per 16 rows):
# ELOOP for what comes after, so that no request costs more than a few seconds.
MAX_COMPONENTS_WALKED = 4096
MAX_WALK_COST = 1 << 16


def check_name(name: str) -> str:
    """A name for a new entry: 1-255 bytes of UTF-8, no "/", no NUL, not "." or ".."."""
    if not name or name in (".", ".."):
        raise fs_error(FsCode.INVALID_ARGUMENT, f"invalid name {name!r}")
    if "/" in name or "\0" in name:
        raise fs_error(FsCode.INVALID_ARGUMENT, f"a name may not contain '/' or NUL: {name!r}")
    try:
        size = len(name.encode())
    except UnicodeEncodeError:
        raise fs_error(FsCode.INVALID_ARGUMENT, f"name is not valid UTF-8: {name!r}") from None
    if size > MAX_NAME_BYTES:
        raise fs_error(FsCode.NAME_TOO_LONG, f"name of {size} bytes (at most {MAX_NAME_BYTES})")
    return name


def split_path(path: str) -> tuple[bool, list[str]]:
    """(absolute, components) of ``path``; "" and "." components dropped, ".." kept.

    Raises:
        FsInvalid: NUL in the path, a too-long path or component.
    """
    if "\0" in path:
        raise fs_error(FsCode.INVALID_ARGUMENT, "a path may not contain NUL")
    try:
        size = len(path.encode())
    except UnicodeEncodeError:
        raise fs_error(FsCode.INVALID_ARGUMENT, f"path is not valid UTF-8: {path!r}") from None
    if size > MAX_PATH_BYTES:
        raise fs_error(FsCode.NAME_TOO_LONG, f"path of {size} bytes (at most {MAX_PATH_BYTES})")
    parts = [p for p in path.split("/") if p and p != "."]
    if len(parts) > MAX_PATH_COMPONENTS:
        raise fs_error(FsCode.NAME_TOO_LONG, f"path of {len(parts)} components (at most {MAX_PATH_COMPONENTS})")
    for p in parts:
        if len(p.encode()) > MAX_NAME_BYTES:
            raise fs_error(FsCode.NAME_TOO_LONG, f"path component of {len(p.encode())} bytes: {p[:40]!r}...")
    return path.startswith("/"), parts


def join(parent: str, name: str) -> str:
    """A folder's path and a name in it."""
    return f"{parent.rstrip('/')}/{name}" if parent != "/" else f"/{name}"


@dataclass
class WalkBudget:
    """What one request may still spend walking paths (``MAX_WALK_COST``; the store charges each query)."""

    left: int = MAX_WALK_COST

    def spend(self, cost: int) -> None:
        """Charge ``cost``; ELOOP once the request has walked too much."""
        self.left -= cost
        if self.left < 0:
            raise fs_error(FsCode.SYMLINK_LOOP, "the request walks too many path components (symlinks?)")
