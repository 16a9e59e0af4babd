"""Stat and List answers kept while the database has had no commit: two meta stores on one SQLite file (two
instances), every commit of the other seen at the next call, permissions checked per caller, write sessions never
kept."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, cast

import pytest

from ff_meta.core.errors import FsCode, FsError
from ff_meta.core.model import AttrChange, Defaults, Inode, LayoutSpec, PathAt
from ff_meta.core.perms import Caller
from ff_meta.ops import MetaOps, MetaOptions
from ff_meta.store.fsops import files, namespace
from ff_meta.store.metastore import MetaStore
from ff_meta.store.tx import Tx

ALICE = Caller(1000, (1000,), "alice")
BOB = Caller(1001, (1001,), "bob")
DEFAULTS = Defaults(LayoutSpec(1, 1 << 20, 4), {1: (0, 6)}, 30.0)


def create(path: str, inode_id: int) -> Callable[[Tx], Inode]:
    return lambda t: files.create(t, PathAt(0, path), 0o644, True, False, None, inode_id, DEFAULTS)[0]


@pytest.fixture
async def two(tmp_path: Path) -> AsyncIterator[tuple[MetaOps, MetaStore]]:
    """This instance's operators, and another instance's store on the same file."""
    url = f"sqlite:///{tmp_path / 'meta.db'}"
    mine, other = await asyncio.to_thread(MetaStore.open, url), await asyncio.to_thread(MetaStore.open, url)
    ops = MetaOps.build(mine, cast(Any, None), MetaOptions(cluster_token="t"))  # stat and list need no mgmtd
    try:
        yield ops, other
    finally:
        await ops.close()
        for store in (mine, other):
            await store.close()
            store.dispose()


async def test_kept_answers_follow_every_commit_of_another_instance(two: tuple[MetaOps, MetaStore]) -> None:
    ops, other = two
    ns = ops.namespace
    await other.write(ALICE, lambda t: namespace.mkdirs(t, PathAt(0, "/d"), 0o755, False, None, [900]))
    made = await other.write(ALICE, create("/d/f1", 1001))
    first = await ns.stat(ALICE, PathAt(0, "/d/f1"), True)
    assert first[0].inode_id == made.inode_id and await ns.stat(ALICE, PathAt(0, "/d/f1"), True) is first  # kept
    await other.write(ALICE, lambda t: namespace.set_attr(t, PathAt(0, "/d/f1"), True, AttrChange(mode=0o600)))
    assert (await ns.stat(ALICE, PathAt(0, "/d/f1"), True))[0].mode & 0o777 == 0o600  # the other's chmod, at once
    page = await ns.list_dir(ALICE, PathAt(0, "/d"), 100, "", False)
    assert [e[0] for e in page.entries] == ["f1"] and await ns.list_dir(ALICE, PathAt(0, "/d"), 100, "", False) is page
    await other.write(ALICE, create("/d/f2", 1002))
    assert [e[0] for e in (await ns.list_dir(ALICE, PathAt(0, "/d"), 100, "", False)).entries] == ["f1", "f2"]
    # Per caller: alice's kept answer is not bob's, once her folder is closed to him.
    await other.write(ALICE, lambda t: namespace.set_attr(t, PathAt(0, "/d"), True, AttrChange(mode=0o700)))
    assert await ns.stat(ALICE, PathAt(0, "/d/f2"), True)
    assert await ns.list_dir(ALICE, PathAt(0, "/d"), 100, "", False)
    for call in (ns.stat(BOB, PathAt(0, "/d/f2"), True), ns.list_dir(BOB, PathAt(0, "/d"), 100, "", False)):
        with pytest.raises(FsError) as err:
            await call
        assert err.value.fs_code is FsCode.ACCESS_DENIED


async def test_an_answer_with_write_sessions_is_not_kept(two: tuple[MetaOps, MetaStore]) -> None:
    ops, other = two
    await other.write(ALICE, lambda t: namespace.mkdirs(t, PathAt(0, "/d"), 0o755, False, None, [900]))
    made = await other.write(ALICE, create("/d/f", 1001))
    expires_at = time.time() + 1.0
    await other.write(ALICE, lambda t: t.insert_session("s", "client", made, None, expires_at, []))
    first = await ops.namespace.stat(ALICE, PathAt(0, "/d/f"), True)
    assert first[1] == 1 and await ops.namespace.stat(ALICE, PathAt(0, "/d/f"), True) is not first
    await asyncio.sleep(max(0.0, expires_at - time.time()) + 0.05)  # the lease lapses: no commit, yet the count moves
    assert (await ops.namespace.stat(ALICE, PathAt(0, "/d/f"), True))[1] == 0
