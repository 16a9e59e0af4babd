"""The mount's attribute cache (hf3fs.fuse.attrs): what it answers, and what each change through the mount makes it
forget. A fake clock stands for time."""

from __future__ import annotations

import dataclasses

import pytest

from ff_testing.fakes import FakeClock
from hf3fs.entries import Stat
from hf3fs.fuse.attrs import ABSENT, UNKNOWN, AttrCache


@dataclasses.dataclass(frozen=True)
class St:
    inode_id: int
    mode: int = 0o644


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(100.0)


@pytest.fixture
def cache(clock: FakeClock) -> AttrCache:
    return AttrCache(1.0, clock)


def test_a_stat_is_kept_for_the_ttl_then_asked_again(cache: AttrCache, clock: FakeClock) -> None:
    cache.remember("/a", St(5), cache.generation())
    assert cache.lookup("/a") == (True, St(5))
    assert cache.lookup_inode(5) == St(5)
    clock.now += 1.01
    assert cache.lookup("/a") == (False, None)
    assert cache.lookup_inode(5) is ABSENT


def test_a_stat_read_before_a_change_is_not_kept(cache: AttrCache) -> None:
    since = cache.generation()
    cache.changed_inode(5)  # e.g. a release made the length exact while the Stat was on the wire
    cache.remember("/a", St(5), since)
    assert cache.lookup("/a") == (False, None)


def test_a_change_by_handle_forgets_every_name_of_the_inode(cache: AttrCache) -> None:
    for path in ("/a", "/b"):  # two hard links
        cache.remember(path, St(5), cache.generation())
    cache.changed_inode(5)
    assert cache.lookup("/a") == cache.lookup("/b") == (False, None)
    assert cache.lookup_inode(5) is ABSENT
    cache.changed_inode(5, St(5, 0o600))  # a SetAttr's answer: kept for every name
    assert cache.lookup("/b") == (True, St(5, 0o600)) and cache.lookup_inode(5) == St(5, 0o600)


def test_a_folder_made_here_answers_for_names_in_it_until_the_ttl(cache: AttrCache, clock: FakeClock) -> None:
    cache.changed("/d", UNKNOWN, new_dir=True)
    assert cache.lookup("/d") == (False, None)  # it exists: its attributes come from meta
    assert cache.lookup("/d/x") == (True, ABSENT)  # it was empty and nothing was made in it here
    cache.changed("/d/x", St(7))
    assert cache.lookup("/d/x") == (True, St(7))
    clock.now += 1.01
    assert cache.lookup("/d/y") == (False, None)  # someone else may have made it by now


def test_names_made_in_a_new_folder_never_read_as_absent(cache: AttrCache, clock: FakeClock) -> None:
    """A file's attributes forgotten (its close) or a sub-folder's times changed (a file made in it) leave the
    name known to exist: the new folder's 'empty when made' must not answer for it (tar x failed so)."""
    cache.changed("/d", UNKNOWN, new_dir=True)
    cache.changed("/d/sub", UNKNOWN, new_dir=True)
    cache.changed("/d/f", St(7))
    clock.now += 0.5
    cache.changed("/d/sub/g", St(8))  # /d/sub's times change
    cache.changed_inode(7)  # /d/f closed
    assert cache.lookup("/d/sub") == (False, None)
    assert cache.lookup("/d/f") == (False, None)
    assert cache.exists("/d/sub") and cache.exists("/d/f")


def test_a_removed_name_is_absent_and_a_failed_change_forgets(cache: AttrCache) -> None:
    cache.remember("/a", St(5), cache.generation())
    cache.changed("/a", ABSENT)
    assert cache.lookup("/a") == (True, ABSENT) and not cache.exists("/a")
    cache.changed("/n", UNKNOWN, new_dir=True)
    cache.forget("/n/x")  # a create in it failed half way: the folder is no longer known whole
    assert cache.lookup("/n/x") == (False, None)


def test_removing_a_folder_forgets_what_was_under_it_and_rename_forgets_all(cache: AttrCache) -> None:
    cache.changed("/d", UNKNOWN, new_dir=True)
    cache.changed("/d/f", St(7))
    cache.changed("/d/f", ABSENT)
    cache.changed("/d", ABSENT)
    assert cache.lookup("/d/f") == (False, None) and cache.lookup("/d/g") == (False, None)
    cache.remember("/a", St(5), cache.generation())
    cache.clear()
    assert cache.lookup("/a") == (False, None)


def test_a_ttl_of_zero_keeps_nothing(clock: FakeClock) -> None:
    cache = AttrCache(0.0, clock)
    cache.changed("/d", UNKNOWN, new_dir=True)
    cache.remember("/a", St(5), cache.generation())
    cache.changed("/b", St(6))
    assert cache.lookup("/a") == cache.lookup("/b") == cache.lookup("/d/x") == (False, None)


def test_a_no_such_name_is_kept_past_changes_of_other_names_only(cache: AttrCache) -> None:
    since = cache.generation()
    cache.changed_inode(9)  # the release of the file tar wrote before, racing its lookup of the next name
    cache.remember("/next", ABSENT, since)
    assert cache.lookup("/next") == (True, ABSENT)
    since = cache.generation()
    cache.changed("/made", St(3))  # made here while meta's "not there" was on the wire
    cache.remember("/made", ABSENT, since)
    assert cache.lookup("/made") == (True, St(3))
    since = cache.generation()
    cache.clear()  # a rename: any name may have changed
    cache.remember("/next", ABSENT, since)
    assert cache.lookup("/next") == (False, None)


def _stat(inode_id: int, kind: str, ctime_ns: int, nlink: int = 1) -> Stat:
    return Stat(inode_id, kind, 0o755, 0, 0, nlink, 0, 1, ctime_ns, ctime_ns)


def test_a_name_made_here_brings_its_known_folder_up_to_date_and_keeps_its_expiry(
    cache: AttrCache, clock: FakeClock
) -> None:
    """Meta sets a folder's mtime and ctime to the new entry's ctime in the Create's (or Mkdir's) transaction, and a
    new sub-folder adds a link: the folder's Stat needs no meta call after each file tar x makes in it."""
    cache.remember("/d", _stat(2, "directory", 10, nlink=2), cache.generation())
    clock.now += 0.5
    cache.changed("/d/f", _stat(7, "file", 50), made=True)
    assert cache.lookup("/d") == (True, _stat(2, "directory", 50, nlink=2))
    cache.changed("/d/sub", _stat(8, "directory", 60, nlink=2), new_dir=True, made=True)
    assert cache.lookup("/d") == (True, _stat(2, "directory", 60, nlink=3)) and cache.lookup_inode(2).nlink == 3
    cache.changed("/d/f", _stat(7, "file", 50))  # opened again, not made (O_CREAT of an existing file): ask meta
    assert cache.lookup("/d") == (False, None)
    cache.remember("/d", _stat(2, "directory", 60, nlink=3), cache.generation())
    clock.now += 0.6
    cache.changed("/d/g", _stat(9, "file", 70), made=True)
    clock.now += 0.5  # past the folder's own expiry: the creates did not extend it
    assert cache.lookup("/d") == (False, None)


def test_folders_made_long_ago_are_forgotten(cache: AttrCache, clock: FakeClock) -> None:
    """``tar x`` of a tree of many folders, one every 5 ms: what the mount remembers of the folders it made grew by one
    entry per folder for as long as the mount lived (20,000 folders: 20,000 kept, of which 200 were younger than the
    attribute timeout), as nothing looks a name up in a folder once its extraction is done."""
    for i in range(20_000):
        cache.changed(f"/t/d{i}", UNKNOWN, new_dir=True)
        clock.now += 0.005
    assert len(cache) <= 5_000
    assert cache.lookup("/t/d19999/x") == (True, ABSENT)  # the young ones still answer


def test_an_opens_fresh_answer_is_kept_and_says_whether_it_differs(cache: AttrCache) -> None:
    """An Open's inode replaces what the mount knew of the path; it differs (the kernel must ask again) when its size
    or mtime changed, or when nothing was known."""
    assert cache.renewed("/f", _stat(5, "file", 10), cache.generation())  # nothing known
    assert cache.lookup("/f") == (True, _stat(5, "file", 10))
    assert not cache.renewed("/f", _stat(5, "file", 10), cache.generation())  # the same
    grown = dataclasses.replace(_stat(5, "file", 10), size=100)
    assert cache.renewed("/f", grown, cache.generation()) and cache.lookup_inode(5) == grown
