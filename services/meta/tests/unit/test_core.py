"""Pure rules: names and paths, permission bits (the layout's permutation and IoCapability: libs/fsprotocol)."""

from __future__ import annotations

import pytest

from ff_meta.core.errors import FS_ERROR_METADATA, FsCode, FsError
from ff_meta.core.model import Inode, InodeType
from ff_meta.core.paths import check_name, split_path
from ff_meta.core.perms import Caller, R, W, X, allowed, check_sticky


def code(fn: object) -> FsCode:
    with pytest.raises(FsError) as exc:
        fn()  # type: ignore[operator]
    return exc.value.fs_code


def test_names() -> None:
    assert check_name("a.txt") == "a.txt"
    assert check_name("é" * 127) == "é" * 127
    for bad in ("", ".", "..", "a/b", "a\0b"):
        assert code(lambda b=bad: check_name(b)) is FsCode.INVALID_ARGUMENT
    assert code(lambda: check_name("x" * 256)) is FsCode.NAME_TOO_LONG
    assert code(lambda: check_name("é" * 128)) is FsCode.NAME_TOO_LONG


def test_paths() -> None:
    assert split_path("/a//b/./c/") == (True, ["a", "b", "c"])
    assert split_path("a/../b") == (False, ["a", "..", "b"])
    assert split_path("/") == (True, [])
    assert code(lambda: split_path("/a\0")) is FsCode.INVALID_ARGUMENT
    assert code(lambda: split_path("/" + "x" * 300)) is FsCode.NAME_TOO_LONG
    assert code(lambda: split_path("/a" * 2100)) is FsCode.NAME_TOO_LONG


def test_error_metadata() -> None:
    from ff_meta.core.errors import fs_error

    err = fs_error(FsCode.QUOTA_EXCEEDED, "full")
    assert tuple(err.trailing_metadata()) == ((FS_ERROR_METADATA, "FS_ERROR_QUOTA_EXCEEDED"),)


def _node(mode: int, uid: int = 10, gid: int = 20, kind: InodeType = InodeType.FILE) -> Inode:
    return Inode(inode_id=5, type=kind, mode=mode, uid=uid, gid=gid)


def test_permission_bits() -> None:
    owner, member, other = Caller(10, (99,)), Caller(11, (20,)), Caller(12, (30,))
    root = Caller(0, (0,), is_root=True)
    f = _node(0o640)
    assert allowed(owner, f, R | W) and not allowed(owner, f, X)
    assert allowed(member, f, R) and not allowed(member, f, W)
    assert not allowed(other, f, R)
    assert allowed(root, f, R | W) and not allowed(root, f, X)  # root needs some x bit to execute
    assert allowed(root, _node(0o000, kind=InodeType.DIRECTORY), R | W | X)
    # Owner bits win even when they give less than the group's.
    assert not allowed(owner, _node(0o070), R)


def test_sticky_directory() -> None:
    d = _node(0o1777, uid=0, kind=InodeType.DIRECTORY)
    mine, theirs = _node(0o644, uid=10), _node(0o644, uid=11)
    check_sticky(Caller(10, ()), d, mine, "rm")
    assert code(lambda: check_sticky(Caller(10, ()), d, theirs, "rm")) is FsCode.NOT_PERMITTED
    check_sticky(Caller(0, (), is_root=True), d, theirs, "rm")
