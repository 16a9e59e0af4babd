"""Namespace rules over a real SQLite store (no sockets): resolution, rename, links, removal, quotas."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from ff_meta.core.errors import FsCode, FsError
from ff_meta.core.model import AttrChange, Defaults, DirEntry, Inode, InodeType, LayoutSpec, PathAt
from ff_meta.core.perms import Caller
from ff_meta.store import trash
from ff_meta.store.fsops import files, namespace, quotas, reads, sessions
from ff_meta.store.listing import ListingCache
from ff_meta.store.metastore import MIGRATIONS
from ff_meta.store.read_cache import ReadCache
from ff_meta.store.schema import VERSION_TABLE
from ff_meta.store.tx import Tx
from ff_store import Store, open_store

T = TypeVar("T")
ALICE = Caller(1000, (1000,), "alice")
BOB = Caller(1001, (1001,), "bob")
DEFAULTS = Defaults(LayoutSpec(1, 1 << 20, 4), {1: (0, 6)}, 30.0)


class Fs:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.ids = itertools.count(1000)

    def tx(self, fn: Callable[[Tx], T], caller: Caller = ALICE) -> T:
        return self.store.run(lambda s: fn(Tx(s, caller, time.time_ns())))

    def mkdir(self, path: str, caller: Caller = ALICE) -> Inode:
        return self.tx(lambda t: namespace.mkdirs(t, PathAt(0, path), 0o755, False, None, [next(self.ids)]), caller)

    def create(self, path: str, caller: Caller = ALICE) -> Inode:
        i = next(self.ids)
        return self.tx(lambda t: files.create(t, PathAt(0, path), 0o644, True, False, None, i, DEFAULTS)[0], caller)

    def stat(self, path: str, follow: bool = True) -> Inode:
        return self.tx(lambda t: reads.stat(t, PathAt(0, path), follow))

    def names(self, path: str) -> list[str]:
        return [e[0] for e in self.tx(lambda t: reads.list_dir(t, PathAt(0, path), 1000, "", False))[0]]

    def rename(self, a: str, b: str, caller: Caller = ALICE, no_replace: bool = False) -> Inode:
        return self.tx(lambda t: namespace.rename(t, PathAt(0, a), PathAt(0, b), no_replace), caller)

    def remove(self, path: str, recursive: bool = False, caller: Caller = ALICE) -> str:
        return self.tx(
            lambda t: namespace.remove(t, PathAt(0, path), recursive, False, 60.0, trash.new_trash_id()), caller
        )


@pytest.fixture
def fs(tmp_path: Path) -> Fs:
    return Fs(open_store(f"sqlite:///{tmp_path / 'meta.db'}", MIGRATIONS, VERSION_TABLE))


def code(fn: Callable[[], object]) -> FsCode:
    with pytest.raises(FsError) as exc:
        fn()
    return exc.value.fs_code


def test_resolution_dots_symlinks_and_inode_addressing(fs: Fs) -> None:
    a = fs.mkdir("/a")
    fs.mkdir("/a/b")
    f = fs.create("/a/b/f")
    fs.tx(lambda t: namespace.symlink(t, PathAt(0, "/a/up"), "b/../..", next(fs.ids)))
    assert fs.stat("/a/./b/../b/f").inode_id == f.inode_id
    assert fs.stat("/a/up/a/b/f").inode_id == f.inode_id  # symlink in the middle, relative target
    assert fs.stat("/a/up", follow=False).is_symlink
    assert fs.stat("/..").inode_id == 1  # the root is its own parent
    got = fs.tx(lambda t: reads.stat(t, PathAt(a.inode_id, "b/f"), True))  # relative to an inode
    assert got.inode_id == f.inode_id
    assert fs.tx(lambda t: reads.stat(t, PathAt(f.inode_id, ""), True)).inode_id == f.inode_id
    assert code(lambda: fs.stat("/a/b/f/x")) is FsCode.NOT_DIRECTORY
    assert code(lambda: fs.stat("/a/nope/x")) is FsCode.NOT_FOUND
    assert fs.tx(lambda t: reads.realpath(t, PathAt(0, "/a/up/a/b/f"))) == ("/a/b/f", f.inode_id)


def test_rename_rules(fs: Fs) -> None:
    fs.mkdir("/d")
    fs.mkdir("/d/sub")
    fs.mkdir("/e")
    fs.create("/e/inner")
    fs.create("/f")
    fs.create("/g")
    assert code(lambda: fs.rename("/d", "/d/sub/x")) is FsCode.RENAME_LOOP
    assert code(lambda: fs.rename("/d", "/d/x")) is FsCode.RENAME_LOOP
    assert code(lambda: fs.rename("/d", "/f")) is FsCode.NOT_DIRECTORY
    assert code(lambda: fs.rename("/f", "/d")) is FsCode.IS_DIRECTORY
    assert code(lambda: fs.rename("/d", "/e")) is FsCode.NOT_EMPTY
    assert code(lambda: fs.rename("/f", "/g", no_replace=True)) is FsCode.EXISTS
    assert code(lambda: fs.rename("/", "/x")) in (FsCode.BUSY, FsCode.INVALID_ARGUMENT)
    g = fs.stat("/f")
    fs.rename("/f", "/g")  # a file replaces a file
    assert fs.stat("/g").inode_id == g.inode_id and "f" not in fs.names("/")
    fs.mkdir("/empty")
    d = fs.stat("/d")
    fs.rename("/d", "/empty")  # a directory replaces an empty directory
    assert fs.stat("/empty").inode_id == d.inode_id and fs.stat("/empty").parent_id == 1
    fs.rename("/empty/sub", "/e/sub")
    assert fs.stat("/e/sub").parent_id == fs.stat("/e").inode_id
    fs.rename("/g", "/g")  # same entry: nothing happens
    assert fs.stat("/g").inode_id == g.inode_id


def test_links_and_removal(fs: Fs) -> None:
    f = fs.create("/f")
    fs.tx(lambda t: namespace.hardlink(t, PathAt(0, "/f"), PathAt(0, "/h")))
    assert fs.stat("/h").nlink == 2 and fs.stat("/h").inode_id == f.inode_id
    fs.remove("/f")
    assert fs.stat("/h").nlink == 1
    fs.mkdir("/d")
    fs.create("/d/x")
    assert code(lambda: fs.remove("/d")) is FsCode.NOT_EMPTY
    trash_id = fs.remove("/d", recursive=True)
    assert trash_id and "d" not in fs.names("/")
    fs.remove("/h")
    from ff_meta.store.schema import gc_queue, inodes

    left = fs.store.run(lambda s: {r.inode_id for r in s.execute(inodes.select())})
    assert f.inode_id not in left
    queued = fs.store.run(lambda s: {r.inode_id for r in s.execute(gc_queue.select())})
    assert f.inode_id in queued  # its chunks wait for GC
    assert fs.tx(lambda t: trash.delete_trash_entry(t, trash_id)) == (2, True)


def test_trash_tree_deleted_in_small_steps(fs: Fs) -> None:
    fs.mkdir("/t")
    for d in ("a", "b"):
        fs.mkdir(f"/t/{d}")
        fs.mkdir(f"/t/{d}/deep")
        for k in range(5):
            fs.create(f"/t/{d}/deep/f{k}")
        fs.create(f"/t/{d}/g")
    fs.tx(lambda t: namespace.hardlink(t, PathAt(0, "/t/a/g"), PathAt(0, "/kept")))
    trash_id = fs.remove("/t", recursive=True)
    steps, total = 0, 0
    while True:
        freed, done = fs.tx(lambda t: trash.delete_trash_entry(t, trash_id, budget=3))
        assert freed <= 3
        steps, total = steps + 1, total + freed
        if done:
            break
    assert total == 17 and steps >= 6  # 1 + 2 x (1 + 1 + 5 + 1) inodes, 3 at a time
    from ff_meta.store.schema import dirents, inodes
    from ff_meta.store.schema import trash as trash_table

    left = fs.store.run(lambda s: {r.inode_id for r in s.execute(inodes.select())})
    entries = fs.store.run(lambda s: list(s.execute(dirents.select())))
    assert {e.name for e in entries} == {"kept"}
    assert left == {1, fs.stat("/kept").inode_id} and fs.stat("/kept").nlink == 1
    assert not fs.store.run(lambda s: list(s.execute(trash_table.select())))


def test_permissions_and_sticky_root(fs: Fs) -> None:
    fs.mkdir("/alice")
    fs.create("/alice/f")
    fs.tx(lambda t: namespace.set_attr(t, PathAt(0, "/alice"), True, AttrChange(mode=0o700)))
    assert code(lambda: fs.tx(lambda t: reads.stat(t, PathAt(0, "/alice/f"), True), BOB)) is FsCode.ACCESS_DENIED
    assert code(lambda: fs.remove("/alice", recursive=True, caller=BOB)) is FsCode.NOT_PERMITTED  # sticky root
    assert code(lambda: fs.rename("/alice", "/mine", caller=BOB)) is FsCode.NOT_PERMITTED
    chown = AttrChange(uid=BOB.uid)
    assert (
        code(lambda: fs.tx(lambda t: namespace.set_attr(t, PathAt(0, "/alice"), True, chown))) is FsCode.NOT_PERMITTED
    )


def test_quota_counts_and_limits(fs: Fs) -> None:
    fs.mkdir("/q")
    root = Caller(0, (0,), is_root=True)
    fs.tx(lambda t: quotas.set_quota(t, PathAt(0, "/q"), 0, 3), root)
    fs.create("/q/a")
    fs.mkdir("/q/b")
    assert code(lambda: fs.create("/q/b/c")) is FsCode.QUOTA_EXCEEDED
    fs.mkdir("/elsewhere")
    fs.create("/elsewhere/x")
    assert code(lambda: fs.rename("/elsewhere/x", "/q/b/x")) is FsCode.QUOTA_EXCEEDED
    fs.rename("/q/a", "/elsewhere/a")  # moving out frees the inode
    fs.rename("/elsewhere/x", "/q/b/x")
    ((q, _),) = fs.tx(lambda t: quotas.get_quota(t, PathAt(0, "/q/b/x")))
    assert q.used_inodes == 3


def test_exclusive_create_never_follows_a_symlink(fs: Fs) -> None:
    fs.mkdir("/a")
    fs.tx(lambda t: namespace.symlink(t, PathAt(0, "/a/dangling"), "target", next(fs.ids)))
    assert code(lambda: fs.create("/a/dangling")) is FsCode.EXISTS  # O_EXCL: the link itself exists
    assert fs.names("/a") == ["dangling"]
    i = next(fs.ids)
    made, created, _ = fs.tx(
        lambda t: files.create(t, PathAt(0, "/a/dangling"), 0o644, False, False, None, i, DEFAULTS)
    )
    assert created and fs.names("/a") == ["dangling", "target"]  # without O_EXCL the link is followed
    assert fs.stat("/a/dangling").inode_id == made.inode_id


def test_inode_addressing_needs_search_permission_on_every_directory_above(fs: Fs) -> None:
    fs.mkdir("/alice")
    fs.mkdir("/alice/private")
    sub = fs.mkdir("/alice/private/sub")
    f = fs.create("/alice/private/sub/f")
    fs.tx(lambda t: namespace.set_attr(t, PathAt(0, "/alice/private"), True, AttrChange(mode=0o700)))

    def as_bob(at: PathAt) -> FsCode | int:
        try:
            return fs.tx(lambda t: reads.stat(t, at, True), BOB).inode_id
        except FsError as err:
            return err.fs_code

    assert as_bob(PathAt(f.inode_id, "")) is FsCode.ACCESS_DENIED  # the file itself
    assert as_bob(PathAt(sub.inode_id, "f")) is FsCode.ACCESS_DENIED  # relative to a directory below
    assert as_bob(PathAt(sub.inode_id, "")) is FsCode.ACCESS_DENIED
    assert fs.tx(lambda t: reads.realpath(t, PathAt(f.inode_id, ""))) == ("/alice/private/sub/f", f.inode_id)
    assert code(lambda: fs.tx(lambda t: reads.realpath(t, PathAt(f.inode_id, "")), BOB)) is FsCode.ACCESS_DENIED
    # A second link in a folder bob may search makes the file reachable, through that link only.
    fs.tx(lambda t: namespace.hardlink(t, PathAt(0, "/alice/private/sub/f"), PathAt(0, "/alice/pub")))
    assert as_bob(PathAt(f.inode_id, "")) == f.inode_id
    assert fs.tx(lambda t: reads.realpath(t, PathAt(f.inode_id, "")), BOB) == ("/alice/pub", f.inode_id)
    # 0711: searchable, not readable; the search bit is what counts.
    fs.tx(lambda t: namespace.set_attr(t, PathAt(0, "/alice/private"), True, AttrChange(mode=0o711)))
    assert as_bob(PathAt(sub.inode_id, "f")) == f.inode_id
    # A tree in the trash is not in the namespace: ENOENT for others, found by root.
    fs.remove("/alice/private", recursive=True)
    assert as_bob(PathAt(sub.inode_id, "")) is FsCode.NOT_FOUND
    root = Caller(0, (0,), is_root=True)
    assert fs.tx(lambda t: reads.stat(t, PathAt(sub.inode_id, ""), True), root).inode_id == sub.inode_id


def test_close_and_sync_without_the_session_change_only_what_the_caller_may(fs: Fs) -> None:
    fs.mkdir("/d")
    f = fs.create("/d/f")
    before = fs.stat("/d/f")
    sync = fs.tx(lambda t: sessions.finish_length(t, f.inode_id, "", 99_999_999, None, 0, close=False), BOB)
    assert (sync.length, sync.mtime_ns) == (before.length, before.mtime_ns)  # bob may read: nothing changes
    fs.tx(lambda t: namespace.set_attr(t, PathAt(0, "/d/f"), True, AttrChange(mode=0o600)))
    denied = code(lambda: fs.tx(lambda t: sessions.finish_length(t, f.inode_id, "", 5, 5, 0, close=True), BOB))
    assert denied is FsCode.ACCESS_DENIED
    own = fs.tx(lambda t: sessions.finish_length(t, f.inode_id, "", 99_999_999, 7, 0, close=False))
    assert (own.length, own.mtime_ns) == (7, before.mtime_ns)  # storage's length; no session: no hints


def test_deep_mkdirs_charges_each_level_and_stops_at_the_depth_limit(fs: Fs, monkeypatch: pytest.MonkeyPatch) -> None:
    from ff_meta.core import resolve as resolve_module

    monkeypatch.setattr(namespace, "MAX_DIR_DEPTH", 50)
    monkeypatch.setattr(resolve_module, "MAX_DIR_DEPTH", 50)
    fs.mkdir("/q")
    root = Caller(0, (0,), is_root=True)
    fs.tx(lambda t: quotas.set_quota(t, PathAt(0, "/q"), 0, 41), root)

    def mkdir_p(path: str) -> Inode:
        ids = [next(fs.ids) for _ in range(60)]
        return fs.tx(lambda t: namespace.mkdirs(t, PathAt(0, path), 0o755, True, None, ids))

    deep = mkdir_p("/q/" + "/".join(["a"] * 40))
    assert code(lambda: mkdir_p("/q/" + "/".join(["b"] * 41))) is FsCode.QUOTA_EXCEEDED  # 41 + 1 > 41 inodes
    ((q, _),) = fs.tx(lambda t: quotas.get_quota(t, PathAt(0, "/q")))
    assert q.used_inodes == 41  # the refused call charged nothing
    fs.tx(lambda t: quotas.set_quota(t, PathAt(0, "/q"), 0, 0), root)
    assert code(lambda: mkdir_p("/q/" + "/".join(["a"] * 40) + "/c/c/c/c/c/c/c/c/c/c")) is FsCode.NAME_TOO_LONG
    assert fs.tx(lambda t: t.paths.depth_of(deep.inode_id)) == 41
    assert fs.tx(lambda t: reads.realpath(t, PathAt(deep.inode_id, ""))) == ("/q/" + "/".join(["a"] * 40),
                                                                              deep.inode_id)  # fmt: skip


def test_listing_cache_follows_every_change_of_the_entries(fs: Fs) -> None:
    """A names-only page comes from the cache only while the directory's entries are those it was read with."""
    cache = ListingCache()

    def cached(path: str = "/d", after: str = "", size: int = 1000, caller: Caller = ALICE) -> list[DirEntry]:
        return fs.tx(lambda t: reads.list_dir(t, PathAt(0, path), size, after, False, cache), caller)[0]

    def fresh(path: str = "/d", after: str = "", size: int = 1000) -> list[DirEntry]:
        return fs.tx(lambda t: reads.list_dir(t, PathAt(0, path), size, after, False))[0]

    fs.mkdir("/d")
    fs.mkdir("/e")
    fs.create("/d/a")
    first = cached()
    trash_ids: list[str] = []
    assert cached() is first and [e[0] for e in first] == ["a"]  # unchanged: the same page
    changes: list[Callable[[], object]] = [
        lambda: fs.create("/d/b"),
        lambda: fs.mkdir("/d/sub"),
        lambda: fs.rename("/d/a", "/d/a2"),  # within the directory
        lambda: fs.rename("/d/a2", "/e/a3"),  # out of it
        lambda: fs.rename("/e/a3", "/d/b"),  # into it, replacing an entry
        lambda: fs.tx(lambda t: namespace.hardlink(t, PathAt(0, "/d/b"), PathAt(0, "/d/h"))),
        lambda: fs.tx(lambda t: namespace.symlink(t, PathAt(0, "/d/s"), "b", next(fs.ids))),
        lambda: fs.remove("/d/h"),
        lambda: trash_ids.append(fs.remove("/d/sub", recursive=True)),  # to the trash
        lambda: fs.tx(lambda t: trash.restore_trash(t, trash_ids[-1], None)),  # and back
        lambda: fs.remove("/d/s"),
    ]
    for change in changes:
        before = fresh()
        assert cached() == before
        version = fs.stat("/d").entries_version
        change()
        assert fs.stat("/d").entries_version > version
        assert fresh() != before and cached() == fresh()
    assert cached(after="b", size=1) == fresh(after="b", size=1) != cached(size=1)  # pages are keyed apart
    # Bob may not list what alice cached once her folder is closed to him: the check runs before the cache.
    fs.tx(lambda t: namespace.set_attr(t, PathAt(0, "/d"), True, AttrChange(mode=0o700)))
    assert cached()
    assert code(lambda: cached(caller=BOB)) is FsCode.ACCESS_DENIED
    untouched = fs.stat("/e").entries_version
    fs.tx(lambda t: namespace.set_attr(t, PathAt(0, "/e"), True, AttrChange(mode=0o711)))
    assert fs.stat("/e").entries_version == untouched  # attributes are not entries


def test_listing_cache_drops_the_least_recently_used_pages_past_its_size() -> None:
    cache = ListingCache(max_entries=5)
    page: list[DirEntry] = [(f"n{k}", k, InodeType.FILE, None) for k in range(2)]
    for d in range(3):
        cache.put((d, 1, "", 2), page, "")
    assert len(cache) == 2 and cache.get((0, 1, "", 2)) is None  # 6 entries > 5: the oldest went
    assert cache.get((1, 1, "", 2)) == (page, "")
    cache.put((3, 1, "", 2), page, "")  # 1 was used last: 2 goes
    assert cache.get((2, 1, "", 2)) is None and cache.get((1, 1, "", 2)) is not None
    cache.put((4, 1, "", 6), [*page, *page, *page], "")  # larger than the whole cache: not kept
    assert cache.get((4, 1, "", 6)) is None


def test_read_cache_holds_answers_of_one_data_version() -> None:
    cache = ReadCache(max_entries=3)
    assert cache.get(7, "a") is None  # adopts version 7
    cache.put(7, "a", 1)
    cache.put(7, "b", 2, size=2)
    assert cache.get(7, "a") == 1 and cache.get(7, "b") == 2
    cache.put(7, "c", 3)  # 4 entries > 3: the least recently used ("a" was read before "b") goes
    assert cache.get(7, "a") is None and cache.get(7, "c") == 3
    assert cache.get(8, "c") is None and len(cache) == 0  # a commit since: everything goes
    cache.put(7, "d", 4)  # computed after reading the old version: not kept
    assert cache.get(8, "d") is None
    cache.put(8, "big", 0, size=4)  # larger than the whole cache: not kept
    assert cache.get(8, "big") is None
