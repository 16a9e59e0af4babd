"""POSIX details of the namespace over a real SQLite store (no sockets): special files (mknod), a folder's times
and link count as its entries change."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from ff_meta.core.errors import FsCode, FsError
from ff_meta.core.model import AttrChange, Defaults, Inode, InodeType, LayoutSpec, PathAt
from ff_meta.core.perms import Caller
from ff_meta.store import trash
from ff_meta.store.fsops import files, namespace, reads
from ff_meta.store.metastore import MIGRATIONS
from ff_meta.store.schema import VERSION_TABLE
from ff_meta.store.tx import Tx
from ff_meta.wire import inode_pb
from ff_store import Store, open_store
from fireflyer.meta.v1 import meta_pb2 as pb

T = TypeVar("T")
ROOT = Caller(0, (0,), "root", is_root=True)
ALICE = Caller(1000, (1000,), "alice")
DEFAULTS = Defaults(LayoutSpec(1, 1 << 20, 4), {1: (0, 6)}, 30.0)


class Ns:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.ids = itertools.count(1000)
        self.clock = itertools.count(10**18, 10**9)  # a second per transaction: times that must move do

    def tx(self, fn: Callable[[Tx], T], caller: Caller = ROOT) -> T:
        now = next(self.clock)
        return self.store.run(lambda s: fn(Tx(s, caller, now)))

    def stat(self, path: str) -> Inode:
        return self.tx(lambda t: reads.stat(t, PathAt(0, path), False))

    def mkdir(self, path: str) -> Inode:
        return self.tx(lambda t: namespace.mkdirs(t, PathAt(0, path), 0o777, False, None, [next(self.ids)]))

    def create(self, path: str) -> Inode:
        i = next(self.ids)
        return self.tx(lambda t: files.create(t, PathAt(0, path), 0o644, True, False, None, i, DEFAULTS)[0])

    def mknod(self, path: str, kind: InodeType, rdev: int = 0, caller: Caller = ROOT) -> Inode:
        i = next(self.ids)
        return self.tx(lambda t: namespace.mknod(t, PathAt(0, path), kind, 0o640, rdev, i), caller)

    def remove(self, path: str) -> None:
        self.tx(lambda t: namespace.remove(t, PathAt(0, path), False, False, 60.0, trash.new_trash_id()))


@pytest.fixture
def ns(tmp_path: Path) -> Ns:
    store = open_store(f"sqlite:///{tmp_path / 'meta.db'}", MIGRATIONS, VERSION_TABLE)
    ns = Ns(store)
    ns.mkdir("/d")
    return ns


@pytest.mark.parametrize(
    ("kind", "rdev", "wire"),
    [
        (InodeType.FIFO, 0, pb.INODE_TYPE_FIFO),
        (InodeType.SOCKET, 0, pb.INODE_TYPE_SOCKET),
        (InodeType.CHAR_DEVICE, (1 << 8) | 3, pb.INODE_TYPE_CHAR_DEVICE),
        (InodeType.BLOCK_DEVICE, (8 << 8) | 1, pb.INODE_TYPE_BLOCK_DEVICE),
    ],
)
def test_mknod_makes_special_files(ns: Ns, kind: InodeType, rdev: int, wire: int) -> None:
    made = ns.mknod("/d/n", kind, rdev)
    st = ns.stat("/d/n")
    assert (st.inode_id, st.type, st.mode, st.nlink, st.rdev, st.length) == (made.inode_id, kind, 0o640, 1, rdev, 0)
    msg = inode_pb(st)
    assert (msg.type, msg.rdev, msg.symlink_target, msg.HasField("layout")) == (wire, rdev, "", False)


def test_mknod_refuses_what_mknod_2_refuses(ns: Ns) -> None:
    ns.mknod("/d/fifo", InodeType.FIFO)
    cases: list[tuple[Callable[[], object], FsCode]] = [
        (lambda: ns.mknod("/d/fifo", InodeType.FIFO), FsCode.EXISTS),
        (lambda: ns.mknod("/d/f", InodeType.FILE), FsCode.INVALID_ARGUMENT),
        (lambda: ns.mknod("/d/f", InodeType.FIFO, rdev=5), FsCode.INVALID_ARGUMENT),
        (lambda: ns.mknod("/d/c", InodeType.CHAR_DEVICE, rdev=5, caller=ALICE), FsCode.NOT_PERMITTED),
        (lambda: ns.mknod("/nowhere/f", InodeType.FIFO), FsCode.NOT_FOUND),
    ]
    for call, code in cases:
        with pytest.raises(FsError) as err:
            call()
        assert err.value.fs_code is code
    assert [e[0] for e in ns.tx(lambda t: reads.list_dir(t, PathAt(0, "/d"), 100, "", False))[0]] == ["fifo"]


def test_a_user_makes_fifos_and_sockets_owned_by_them(ns: Ns) -> None:
    made = ns.mknod("/d/s", InodeType.SOCKET, caller=ALICE)
    assert (made.uid, made.gid) == (1000, 1000)


def test_a_special_file_keeps_its_other_links(ns: Ns) -> None:
    ns.mknod("/d/fifo", InodeType.FIFO)
    ns.tx(lambda t: namespace.hardlink(t, PathAt(0, "/d/fifo"), PathAt(0, "/d/again")))
    assert ns.stat("/d/again").nlink == 2
    ns.remove("/d/fifo")
    assert (ns.stat("/d/again").type, ns.stat("/d/again").nlink) == (InodeType.FIFO, 1)


def _times(ns: Ns, path: str) -> tuple[int, int]:
    st = ns.stat(path)
    return st.mtime_ns, st.ctime_ns


def test_a_folder_s_mtime_and_ctime_move_with_its_entries(ns: Ns) -> None:
    ns.mkdir("/e")
    steps: list[tuple[str, Callable[[], object], list[str]]] = [
        ("create", lambda: ns.create("/d/f"), ["/d"]),
        ("mkdir", lambda: ns.mkdir("/d/sub"), ["/d"]),
        ("mknod", lambda: ns.mknod("/d/p", InodeType.FIFO), ["/d"]),
        ("symlink", lambda: ns.tx(lambda t: namespace.symlink(t, PathAt(0, "/d/l"), "f", next(ns.ids))), ["/d"]),
        ("link", lambda: ns.tx(lambda t: namespace.hardlink(t, PathAt(0, "/d/f"), PathAt(0, "/e/f2"))), ["/e"]),
        ("rename", lambda: ns.tx(lambda t: namespace.rename(t, PathAt(0, "/d/p"), PathAt(0, "/e/p"), False)),
         ["/d", "/e"]),
        ("unlink", lambda: ns.remove("/d/f"), ["/d"]),
        ("rmdir", lambda: ns.remove("/d/sub"), ["/d"]),
    ]  # fmt: skip
    for what, step, changed in steps:
        before = {p: _times(ns, p) for p in ("/d", "/e")}
        step()
        for p in ("/d", "/e"):
            mtime, ctime = _times(ns, p)
            if p in changed:
                assert mtime > before[p][0] and ctime > before[p][1] and mtime == ctime, (what, p)
            else:
                assert (mtime, ctime) == before[p], (what, p)
    before = _times(ns, "/d")
    ns.stat("/d")
    ns.tx(lambda t: reads.list_dir(t, PathAt(0, "/d"), 100, "", False))
    assert _times(ns, "/d") == before  # reading a folder changes neither


def _nlink(ns: Ns, path: str) -> int:
    return inode_pb(ns.stat(path)).nlink


def test_a_folder_counts_its_subfolders_in_its_links(ns: Ns) -> None:
    assert _nlink(ns, "/d") == 2
    ns.mkdir("/d/a")
    ns.mkdir("/d/b")
    ns.create("/d/f")  # files are no links of the folder
    ns.mkdir("/e")
    assert (_nlink(ns, "/d"), _nlink(ns, "/d/a"), _nlink(ns, "/e")) == (4, 2, 2)
    ns.tx(lambda t: namespace.rename(t, PathAt(0, "/d/a"), PathAt(0, "/e/a"), False))
    assert (_nlink(ns, "/d"), _nlink(ns, "/e")) == (3, 3)  # the moved folder's ".." names its new parent
    ns.remove("/d/b")
    assert _nlink(ns, "/d") == 2
    ns.tx(lambda t: namespace.rename(t, PathAt(0, "/e/a"), PathAt(0, "/e/a2"), False))
    assert _nlink(ns, "/e") == 3  # a rename within a folder keeps its count


BOB = Caller(1001, (1001, 50), "bob")


def _set(ns: Ns, path: str, caller: Caller, **change: int) -> Inode:
    return ns.tx(lambda t: namespace.set_attr(t, PathAt(0, path), False, AttrChange(**change)), caller)


def test_chown_follows_linux_rules(ns: Ns) -> None:
    ns.create("/d/f")
    _set(ns, "/d/f", ROOT, uid=1000, gid=1000)
    refused: list[tuple[Caller, dict[str, int]]] = [
        (BOB, {"uid": 1000}),  # not the owner, even to "change" the owner to what it is
        (BOB, {"gid": 1000}),  # nor the group
        (ALICE, {"uid": 1001}),  # the owner may not give the file away
        (ALICE, {"gid": 50}),  # nor hand it to a group she is not in
    ]
    for caller, change in refused:
        with pytest.raises(FsError) as err:
            _set(ns, "/d/f", caller, **change)
        assert err.value.fs_code is FsCode.NOT_PERMITTED, (caller.name, change)
    assert (ns.stat("/d/f").uid, ns.stat("/d/f").gid) == (1000, 1000)
    _set(ns, "/d/f", ALICE, uid=1000, gid=1000)  # the owner, to what is: fine
    assert _set(ns, "/d/f", Caller(1000, (1000, 50), "alice"), gid=50).gid == 50  # a group of hers
    assert _set(ns, "/d/f", ROOT, uid=7, gid=8).uid == 7


def test_chmod_drops_set_group_id_for_a_caller_outside_the_group(ns: Ns) -> None:
    ns.create("/d/g")
    _set(ns, "/d/g", ROOT, uid=1000, gid=50)
    assert _set(ns, "/d/g", ALICE, mode=0o2755).mode == 0o755  # alice is not in group 50
    assert _set(ns, "/d/g", Caller(1000, (1000, 50), "alice"), mode=0o2755).mode == 0o2755
    assert _set(ns, "/d/g", ROOT, mode=0o6755).mode == 0o6755
