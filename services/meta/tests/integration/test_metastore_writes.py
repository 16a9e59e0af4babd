"""Meta's write paths on SQLite: inline on the event loop when the write lock is free, queued for the group
writer when it is not or when the body needs the ORM session; either way all or nothing. The WAL is
checkpointed off the loop; with synchronous FULL every write is queued (its fsync off the loop too)."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ff_cluster import MgmtdClient
from ff_meta.app import MetaApp, MetaOptions
from ff_meta.core.errors import FsCode, FsError, fs_error
from ff_meta.core.model import Inode
from ff_meta.core.perms import Caller
from ff_meta.server import MIGRATIONS
from ff_meta.store import fsops
from ff_meta.store.schema import VERSION_TABLE
from ff_meta.store.tx import Defaults, LayoutSpec, PathAt, Tx
from ff_store import open_store

ALICE = Caller(1000, (1000,), "alice")
DEFAULTS = Defaults(LayoutSpec(1, 1 << 20, 4), {1: (0, 6)}, 30.0)


class Spy:
    """Counts the writes that took the queued (group writer) path."""

    def __init__(self, app: MetaApp) -> None:
        self.queued = 0
        original = app._group_write

        async def counted(body: Any) -> Any:
            self.queued += 1
            return await original(body)

        app._group_write = counted  # type: ignore[method-assign]


@pytest.fixture
async def app(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[MetaApp]:
    store = open_store(f"sqlite:///{tmp_path / 'meta.db'}", MIGRATIONS, VERSION_TABLE)
    mgmtd = MgmtdClient(["127.0.0.1:1"], token="unused")  # never called: these writes need no routing
    synchronous = getattr(request, "param", "NORMAL")
    meta = MetaApp(store, mgmtd, MetaOptions(cluster_token="t", sqlite_synchronous=synchronous))
    await meta.tx(ALICE, lambda t: fsops.mkdirs(t, PathAt(0, "/d"), 0o777, False, None, [900]))
    try:
        yield meta
    finally:
        await meta.close()
        await mgmtd.close()
        store.dispose()


def create(path: str, inode_id: int) -> Any:
    return lambda t: fsops.create(t, PathAt(0, path), 0o644, True, False, None, inode_id, DEFAULTS)[0]


async def names(app: MetaApp) -> list[str]:
    entries = await app.tx(ALICE, lambda t: fsops.list_dir(t, PathAt(0, "/d"), 1000, "", False), read_only=True)
    return [e[0] for e in entries[0]]


async def test_a_write_with_the_lock_free_runs_inline(app: MetaApp) -> None:
    spy = Spy(app)
    made: Inode = await app.tx(ALICE, create("/d/a", 1 << 20))
    assert made.inode_id == 1 << 20 and spy.queued == 0
    assert await names(app) == ["a"]


async def test_a_write_waits_for_another_writer_and_then_commits(app: MetaApp, tmp_path: Path) -> None:
    spy = Spy(app)
    other = sqlite3.connect(tmp_path / "meta.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process's writer holds the lock
    try:
        task = asyncio.create_task(app.tx(ALICE, create("/d/b", (1 << 20) + 1)))
        await asyncio.sleep(0.3)
        assert not task.done() and spy.queued == 1
    finally:
        other.execute("COMMIT")
        other.close()
    await asyncio.wait_for(task, 10)
    assert await names(app) == ["b"]


async def test_a_body_that_needs_the_orm_is_rolled_back_and_run_again_once(app: MetaApp) -> None:
    spy = Spy(app)
    runs: list[bool] = []

    def body(t: Tx) -> Inode:
        runs.append(t.orm is not None)
        made = create("/d/c", (1 << 20) + 2)(t)  # written inline first...
        t.session  # noqa: B018 - ...then the ORM is needed: the inline attempt must leave nothing
        return made  # type: ignore[no-any-return]

    await app.tx(ALICE, body)
    assert runs == [False, True] and spy.queued == 1  # a leftover entry would have made the rerun EEXIST
    assert await names(app) == ["c"]


@pytest.mark.parametrize("lock_free", [True, False])
async def test_a_failing_body_changes_nothing(app: MetaApp, tmp_path: Path, lock_free: bool) -> None:
    def body(t: Tx) -> None:
        create("/d/e", (1 << 20) + 3)(t)
        raise fs_error(FsCode.QUOTA_EXCEEDED, "after a write")

    other = None if lock_free else sqlite3.connect(tmp_path / "meta.db", isolation_level=None)
    if other is not None:
        other.execute("BEGIN IMMEDIATE")
        asyncio.get_running_loop().call_later(0.2, lambda: (other.execute("COMMIT"), other.close()))
    started = time.monotonic()
    with pytest.raises(FsError) as err:
        await app.tx(ALICE, body)
    assert err.value.fs_code is FsCode.QUOTA_EXCEEDED
    assert lock_free or time.monotonic() - started >= 0.2
    assert await names(app) == []


async def test_writes_in_a_quota_tree_and_write_sessions_stay_inline(app: MetaApp) -> None:
    root = Caller(0, (0,), "root", is_root=True)
    await app.tx(root, lambda t: fsops.set_quota(t, PathAt(0, "/d"), 1 << 30, 10))
    spy = Spy(app)
    await app.tx(ALICE, create("/d/q", (1 << 20) + 4))
    inode = await app.tx(ALICE, lambda t: fsops.open_file(t, PathAt(0, "/d/q"), True, False))
    session = await app.tx(ALICE, lambda t: fsops.open_session(t, inode[0], inode[1], "s1", "c1", DEFAULTS, 1e12))
    assert spy.queued == 0 and session.inode_id == (1 << 20) + 4
    [(quota, _)] = await app.tx(ALICE, lambda t: fsops.get_quota(t, PathAt(0, "/d")), read_only=True)
    assert quota.used_inodes == 2  # the directory itself and the new file


async def test_the_inline_writer_leaves_the_wal_to_the_checkpoint(app: MetaApp, tmp_path: Path) -> None:
    for i in range(200):
        await app.tx(ALICE, create(f"/d/w{i}", (1 << 20) + 100 + i))
    wal = tmp_path / "meta.db-wal"
    assert wal.stat().st_size > 1000 * 4096  # past the 1000-page autocheckpoint: the writer did not checkpoint
    root = Caller(0, (0,), "root", is_root=True)
    assert await app.checkpoint_wal(root) > 1000
    assert len(await names(app)) == 200


@pytest.mark.parametrize("app", ["FULL"], indirect=True)
async def test_with_synchronous_full_every_write_is_queued(app: MetaApp) -> None:
    spy = Spy(app)
    await app.tx(ALICE, create("/d/f", (1 << 20) + 5))
    assert spy.queued == 1 and await names(app) == ["f"]
