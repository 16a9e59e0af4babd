"""Namespace changes done once (``store/once.py``) over a real SQLite MetaStore: a call sent again with its key answers
its first result and changes nothing, whatever changed meanwhile; without a key, or with another, it runs again."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ff_cluster import MgmtdClient
from ff_meta.core.errors import FsError
from ff_meta.core.model import Inode, InodeType, PathAt
from ff_meta.core.perms import Caller
from ff_meta.ops import MetaOps, MetaOptions
from ff_meta.ops.namespace import NamespaceOps
from ff_meta.store import once
from ff_meta.store.metastore import MetaStore

ROOT = Caller(0, (0,), "root", is_root=True)


@pytest.fixture
async def meta(tmp_path: Path) -> AsyncIterator[MetaOps]:
    store = MetaStore.open(f"sqlite:///{tmp_path / 'meta.db'}")
    mgmtd = MgmtdClient(["127.0.0.1:1"], token="unused")  # never called: no layout is asked for
    meta = MetaOps.build(store, mgmtd, MetaOptions(cluster_token="t"))
    try:
        yield meta
    finally:
        await meta.close()
        await store.close()
        await mgmtd.close()
        store.dispose()


@pytest.fixture
def ns(meta: MetaOps) -> NamespaceOps:
    return meta.namespace


def at(path: str) -> PathAt:
    return PathAt(0, path)


async def mkdir(ns: NamespaceOps, path: str, key: str | None = None) -> int:
    return (await ns.mkdirs(ROOT, at(path), 0o755, False, None, key)).inode_id


async def inode_at(ns: NamespaceOps, path: str) -> int | None:
    try:
        return (await ns.stat(ROOT, at(path), False))[0].inode_id
    except FsError:
        return None


async def test_a_rename_sent_again_answers_its_first_result_and_moves_nothing(ns: NamespaceOps) -> None:
    first = await mkdir(ns, "/a")
    moved = await ns.rename(ROOT, at("/a"), at("/b"), False, "Rename/0/k1")
    assert moved.inode_id == first
    second = await mkdir(ns, "/a")  # a new /a, made after the first answer was lost
    again = await ns.rename(ROOT, at("/a"), at("/b"), False, "Rename/0/k1")
    assert again == moved
    assert await inode_at(ns, "/a") == second and await inode_at(ns, "/b") == first
    # the same call with another key runs: it moves the new /a over the (empty) /b
    assert (await ns.rename(ROOT, at("/a"), at("/b"), False, "Rename/0/k2")).inode_id == second
    assert await inode_at(ns, "/a") is None


async def test_a_remove_sent_again_takes_nothing_made_since(ns: NamespaceOps) -> None:
    await mkdir(ns, "/c")
    trash_id = await ns.remove(ROOT, at("/c"), False, True, 0, None, "Remove/0/k")
    assert trash_id  # moved to the trash: its id
    made = await mkdir(ns, "/c")
    assert await ns.remove(ROOT, at("/c"), False, True, 0, None, "Remove/0/k") == trash_id
    assert await inode_at(ns, "/c") == made


async def test_a_mkdir_sent_again_answers_its_folder_not_exists(ns: NamespaceOps) -> None:
    made = await mkdir(ns, "/d", "Mkdirs/0/k")
    assert await mkdir(ns, "/d", "Mkdirs/0/k") == made
    with pytest.raises(FsError, match="exists"):
        await mkdir(ns, "/d")  # no key: it runs, and the folder is there


async def test_a_failed_call_records_nothing(ns: NamespaceOps) -> None:
    with pytest.raises(FsError):
        await ns.rename(ROOT, at("/missing"), at("/e"), False, "Rename/0/k")
    made = await mkdir(ns, "/missing")
    assert (await ns.rename(ROOT, at("/missing"), at("/e"), False, "Rename/0/k")).inode_id == made


async def test_records_older_than_a_retry_are_pruned_in_batches_off_the_event_loop(
    meta: MetaOps, monkeypatch: pytest.MonkeyPatch
) -> None:
    ns = meta.namespace
    made = await mkdir(ns, "/f", "Mkdirs/0/k")
    monkeypatch.setattr(once, "PRUNE_BATCH", 7)
    for i in range(20):
        await mkdir(ns, f"/g{i}", f"Mkdirs/0/g{i}")
    monkeypatch.setattr(once, "KEEP_S", 0.0)
    on_loop = []
    real_write = meta.shared.store.write

    async def write(caller: Caller, fn: Any, *, small: bool = True) -> Any:
        on_loop.append(small)
        return await real_write(caller, fn, small=small)

    monkeypatch.setattr(meta.shared.store, "write", write)
    assert await meta.background.prune_once() == 21
    assert on_loop == [False, False, False, False]  # 7 + 7 + 7 + 0, each its own transaction in a thread
    with pytest.raises(FsError, match="exists"):
        await mkdir(ns, "/f", "Mkdirs/0/k")  # its record is gone: the call runs again
    assert await inode_at(ns, "/f") == made


def test_a_record_from_a_meta_whose_inodes_have_more_fields_is_replayed() -> None:
    """During an upgrade two versions of meta share the database: a newer one's record must still replay here."""
    row = json.loads(once._encoded(Inode(inode_id=5, type=InodeType.DIRECTORY, mode=0o755, uid=1, gid=1)))
    row["inode"]["a_later_field"] = 1
    assert once._decoded(json.dumps(row)) == Inode(inode_id=5, type=InodeType.DIRECTORY, mode=0o755, uid=1, gid=1)


async def test_a_restore_from_the_trash_sent_again_answers_its_first_result(meta: MetaOps) -> None:
    ns = meta.namespace
    made = await mkdir(ns, "/t")
    trash_id = await ns.remove(ROOT, at("/t"), False, True, 0, None)
    restored = await meta.trash.restore(ROOT, trash_id, None, "RestoreTrashEntry/0/k")
    assert (restored[0].inode_id, restored[1]) == (made, "/t")
    again_in_trash = await ns.remove(ROOT, at("/t"), False, True, 0, None)
    assert await meta.trash.restore(ROOT, trash_id, None, "RestoreTrashEntry/0/k") == restored
    assert await inode_at(ns, "/t") is None  # nothing restored twice: /t is still in the trash
    with pytest.raises(FsError):
        await meta.trash.restore(ROOT, trash_id, None)  # without the key it runs: that trash entry is gone
    assert (await meta.trash.restore(ROOT, again_in_trash, None))[0].inode_id == made
