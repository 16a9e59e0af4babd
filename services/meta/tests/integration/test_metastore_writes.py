"""MetaStore's write paths on SQLite: inline on the event loop when the write lock is free, queued for the group
writer when it is not or when the body needs the ORM session; either way all or nothing. The WAL is
checkpointed off the loop; with synchronous FULL every write is queued (its fsync off the loop too)."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ff_meta.core.errors import FsCode, FsError, fs_error
from ff_meta.core.model import Defaults, Inode, LayoutSpec, PathAt
from ff_meta.core.perms import Caller
from ff_meta.store.fsops import files, namespace, quotas, reads, sessions
from ff_meta.store.metastore import MetaStore
from ff_meta.store.tx import Tx
from ff_testing.waiting import eventually

ALICE = Caller(1000, (1000,), "alice")
DEFAULTS = Defaults(LayoutSpec(1, 1 << 20, 4), {1: (0, 6)}, 30.0)


@pytest.fixture
async def store(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[MetaStore]:
    synchronous = getattr(request, "param", "NORMAL")
    meta = MetaStore.open(f"sqlite:///{tmp_path / 'meta.db'}", synchronous=synchronous)
    await meta.write(ALICE, lambda t: namespace.mkdirs(t, PathAt(0, "/d"), 0o777, False, None, [900]))
    try:
        yield meta
    finally:
        await meta.close()
        meta.dispose()


def create(path: str, inode_id: int) -> Any:
    return lambda t: files.create(t, PathAt(0, path), 0o644, True, False, None, inode_id, DEFAULTS)[0]


async def names(store: MetaStore) -> list[str]:
    entries = await store.read(ALICE, lambda t: reads.list_dir(t, PathAt(0, "/d"), 1000, "", False))
    return [e[0] for e in entries[0]]


async def test_a_write_with_the_lock_free_runs_inline(store: MetaStore) -> None:
    before, inline = store.counts.queued, store.counts.inline
    made: Inode = await store.write(ALICE, create("/d/a", 1 << 20))
    assert made.inode_id == 1 << 20 and store.counts.queued - before == 0 and store.counts.inline == inline + 1
    assert await names(store) == ["a"]


async def test_a_write_waits_for_another_writer_and_then_commits(store: MetaStore, tmp_path: Path) -> None:
    before = store.counts.queued
    other = sqlite3.connect(tmp_path / "meta.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process's writer holds the lock
    try:
        task = asyncio.create_task(store.write(ALICE, create("/d/b", (1 << 20) + 1)))

        async def queued() -> bool:
            return store.counts.queued - before == 1

        await eventually(queued, timeout_s=10, what="the write queued for the group writer")
        assert not task.done()  # it waits for the other writer's lock
    finally:
        other.execute("COMMIT")
        other.close()
    await asyncio.wait_for(task, 10)
    assert await names(store) == ["b"]


async def test_a_body_that_needs_the_orm_is_rolled_back_and_run_again_once(store: MetaStore) -> None:
    before = store.counts.queued
    runs: list[bool] = []

    def body(t: Tx) -> Inode:
        runs.append(t.orm is not None)
        made = create("/d/c", (1 << 20) + 2)(t)  # written inline first...
        t.session  # noqa: B018 - ...then the ORM is needed: the inline attempt must leave nothing
        return made  # type: ignore[no-any-return]

    await store.write(ALICE, body)
    assert runs == [False, True] and store.counts.queued - before == 1  # a leftover entry: the rerun's EEXIST
    assert await names(store) == ["c"]


@pytest.mark.parametrize("lock_free", [True, False])
async def test_a_failing_body_changes_nothing(store: MetaStore, tmp_path: Path, lock_free: bool) -> None:
    def body(t: Tx) -> None:
        create("/d/e", (1 << 20) + 3)(t)
        raise fs_error(FsCode.QUOTA_EXCEEDED, "after a write")

    other = None if lock_free else sqlite3.connect(tmp_path / "meta.db", isolation_level=None)
    if other is not None:
        other.execute("BEGIN IMMEDIATE")
        asyncio.get_running_loop().call_later(0.2, lambda: (other.execute("COMMIT"), other.close()))
    started = time.monotonic()
    with pytest.raises(FsError) as err:
        await store.write(ALICE, body)
    assert err.value.fs_code is FsCode.QUOTA_EXCEEDED
    assert lock_free or time.monotonic() - started >= 0.2
    assert await names(store) == []


async def test_writes_in_a_quota_tree_and_write_sessions_stay_inline(store: MetaStore) -> None:
    root = Caller(0, (0,), "root", is_root=True)
    await store.write(root, lambda t: quotas.set_quota(t, PathAt(0, "/d"), 1 << 30, 10))
    before = store.counts.queued
    await store.write(ALICE, create("/d/q", (1 << 20) + 4))
    inode = await store.write(ALICE, lambda t: files.open_file(t, PathAt(0, "/d/q"), True, False))
    session = await store.write(
        ALICE, lambda t: sessions.open_session(t, inode[0], inode[1], "s1", "c1", DEFAULTS, 1e12)
    )
    assert store.counts.queued - before == 0 and session.inode_id == (1 << 20) + 4
    [(quota, _)] = await store.read(ALICE, lambda t: quotas.get_quota(t, PathAt(0, "/d")))
    assert quota.used_inodes == 2  # the directory itself and the new file


async def test_the_inline_writer_leaves_the_wal_to_the_checkpoint(store: MetaStore, tmp_path: Path) -> None:
    for i in range(200):
        await store.write(ALICE, create(f"/d/w{i}", (1 << 20) + 100 + i))
    wal = tmp_path / "meta.db-wal"
    assert wal.stat().st_size > 1000 * 4096  # past the 1000-page autocheckpoint: the writer did not checkpoint
    assert await store.checkpoint() > 1000
    assert len(await names(store)) == 200


@pytest.mark.parametrize("store", ["FULL"], indirect=True)
async def test_with_synchronous_full_every_write_is_queued(store: MetaStore) -> None:
    before = store.counts.queued
    await store.write(ALICE, create("/d/f", (1 << 20) + 5))
    assert store.counts.queued - before == 1 and await names(store) == ["f"]


async def test_bodies_run_on_the_loop_on_sqlite_and_in_threads_on_postgres(db_url: str) -> None:
    """Small reads and writes on SQLite run on the event loop (a thread hop costs more than they do); on
    PostgreSQL every body runs in a worker thread (its statements wait on the network and on locks)."""
    store = await asyncio.to_thread(MetaStore.open, db_url)
    loop_thread = threading.get_ident()
    ran_in: list[int] = []

    def mkdir(t: Tx) -> Inode:
        ran_in.append(threading.get_ident())
        return namespace.mkdirs(t, PathAt(0, "/where"), 0o755, False, None, [901])

    def stat(t: Tx) -> Inode:
        ran_in.append(threading.get_ident())
        return reads.stat(t, PathAt(0, "/where"), True)

    try:
        made = await store.write(ALICE, mkdir)
        assert (await store.read(ALICE, stat)).inode_id == made.inode_id == 901
        on_sqlite = db_url.startswith("sqlite")
        assert [t == loop_thread for t in ran_in] == [on_sqlite, on_sqlite]
        assert (store.counts.inline, store.counts.queued) == ((1, 0) if on_sqlite else (0, 1))
    finally:
        await store.close()
        await asyncio.to_thread(store.dispose)
