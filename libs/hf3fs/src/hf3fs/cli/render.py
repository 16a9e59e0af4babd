"""How the CLI prints inodes and sizes, and reads sizes (``10G``)."""

from __future__ import annotations

import stat as statmod
import time
from typing import Any

_UNITS = "KMGTPE"
_SHELL_SPECIAL = frozenset(" \"'\\`$&*()[]{};|<>?!#~")
_C_ESCAPES = {"\a": "\\a", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\v": "\\v", "\f": "\\f", "\r": "\\r"}


def quote_name(name: str) -> str:
    r"""A name as GNU ``ls`` prints it on a terminal (``--quoting-style=shell-escape``), so one entry is one line.

    As is when it is plain, in single quotes when it holds a space or a shell character, and with each control
    character written as ``$'\n'`` between quoted runs (``a<newline>b`` -> ``'a'$'\n''b'``).
    """
    if name and all(c.isprintable() and c not in _SHELL_SPECIAL for c in name):
        return name
    parts: list[str] = []
    run = ""
    for c in name:
        if c.isprintable():
            run += c
            continue
        if run:
            parts.append(_single_quoted(run))
            run = ""
        escaped = _C_ESCAPES.get(c) or "".join(f"\\{b:03o}" for b in c.encode("utf-8", "surrogateescape"))
        parts.append(f"$'{escaped}'")
    if run or not parts:
        parts.append(_single_quoted(run))
    return "".join(parts)


def _single_quoted(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def format_size(num_bytes: int, human: bool = False) -> str:
    """``1536`` or, human-readable, ``1.5K`` (powers of 1024, like ``ls -h``)."""
    if not human or num_bytes < 1024:
        return str(num_bytes)
    value = float(num_bytes)
    for unit in _UNITS:
        value /= 1024
        if value < 1024 or unit == _UNITS[-1]:
            return f"{value:.1f}{unit}"
    raise AssertionError("unreachable")


def parse_size(text: str) -> int:
    """``"100"``, ``"64K"``, ``"10G"``, ``"1.5T"`` (powers of 1024) in bytes.

    Raises:
        ValueError: not a size.
    """
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = 1
    if t and t[-1] in _UNITS:
        scale = 1024 ** (_UNITS.index(t[-1]) + 1)
        t = t[:-1]
    try:
        value = float(t)
    except ValueError:
        raise ValueError(f"not a size: {text!r} (write e.g. 1048576, 512K, 10G)") from None
    if value < 0:
        raise ValueError(f"not a size: {text!r} (negative)")
    return int(value * scale)


def _mtime(ns: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ns / 1e9))


def format_long(name: str, st: Any) -> str:
    """One ``ls -l`` line: mode, links, owner, size, mtime, name (and a symlink's target), names quoted."""
    target = f" -> {quote_name(st.symlink_target)}" if st.type == "symlink" else ""
    return (
        f"{statmod.filemode(st.st_mode)} {st.nlink:>3} {st.uid:>6} {st.gid:>6} {st.size:>12} "
        f"{_mtime(st.mtime_ns)} {quote_name(name)}{target}"
    )


def format_stat(path: str, st: Any) -> str:
    """``stat``: every field of the inode, one per line."""
    lines = [
        f"  File: {path}" + (f" -> {st.symlink_target}" if st.type == "symlink" else ""),
        f"  Type: {st.type}   Size: {st.size}   Inode: {st.inode_id}   Links: {st.nlink}",
        f"Access: ({st.mode & 0o7777:04o}/{statmod.filemode(st.st_mode)})  Uid: {st.uid}  Gid: {st.gid}",
        f"Layout: chain table {st.chain_table_id}  chunk {st.chunk_size}  stripe {st.stripe_size}",
    ]
    for label, ns in (("Access", st.atime_ns), ("Modify", st.mtime_ns), ("Change", st.ctime_ns)):
        frac = ns % 1_000_000_000
        lines.append(f"{label}: {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(ns // 1_000_000_000))}.{frac:09d}")
    return "\n".join(lines)
