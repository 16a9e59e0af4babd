"""Path and name rules (pure): components, limits, what a name may contain."""

from __future__ import annotations

from ff_meta.core.errors import FsCode, fs_error

MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4096
MAX_SYMLINK_HOPS = 40
# A path of 4096 bytes has at most 2048 components ("a/" each); said explicitly so that no walk is longer.
MAX_PATH_COMPONENTS = MAX_PATH_BYTES // 2
# Directories may nest at most this deep below the root (Linux has no such limit, but every walk up the tree
# (permission checks of inode addressing, quotas, rename's loop check, realpath) is bounded by it).
MAX_DIR_DEPTH = 4096


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
    return f"{parent.rstrip('/')}/{name}" if parent != "/" else f"/{name}"
