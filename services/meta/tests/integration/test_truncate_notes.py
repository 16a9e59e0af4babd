"""A shrinking truncate's note (``meta_truncates``) on SQLite and PostgreSQL: written before storage is cut, listed
for the background job once older than its cut-off, gone with the length's commit (or its file)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from ff_meta.core.model import Defaults, LayoutSpec, PathAt
from ff_meta.core.perms import Caller
from ff_meta.store.fsops import files, sessions
from ff_meta.store.metastore import MetaStore

ALICE = Caller(1000, (1000,), "alice")
DEFAULTS = Defaults(LayoutSpec(1, 1 << 20, 4), {1: (0, 6)}, 30.0)
FAR_FUTURE_NS = 2**62


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[MetaStore]:
    url = request.getfixturevalue(f"{request.param}_url")
    s = await asyncio.to_thread(MetaStore.open, url)
    try:
        yield s
    finally:
        await s.close()
        s.dispose()  # the engine's pooled connections (psycopg's, left open, warn in the next test of this worker)


async def test_a_truncate_note_lives_from_before_the_cut_to_the_commit(store: MetaStore) -> None:
    at = PathAt(0, "/f")
    inode = await store.write(ALICE, lambda t: files.create(t, at, 0o644, True, False, None, 900, DEFAULTS)[0])
    await store.write(ALICE, lambda t: sessions.set_length(t, t.must(900), 5000, []))
    await store.write(ALICE, lambda t: files.record_truncate(t, inode.inode_id, 100))
    assert await store.read(ALICE, lambda t: files.pending_truncates(t, FAR_FUTURE_NS)) == [(900, 100)]
    assert await store.read(ALICE, lambda t: files.pending_truncates(t, 0)) == []  # noted after the cut-off
    await store.write(ALICE, lambda t: files.record_truncate(t, inode.inode_id, 10))  # another one replaces it
    assert await store.read(ALICE, lambda t: files.pending_truncates(t, FAR_FUTURE_NS)) == [(900, 10)]
    await store.write(ALICE, lambda t: files.truncate_commit(t, at, 100, ""))  # not this one's commit: it stays
    assert await store.read(ALICE, lambda t: files.pending_truncates(t, FAR_FUTURE_NS)) == [(900, 10)]
    done = await store.write(ALICE, lambda t: files.truncate_commit(t, at, 10, ""))
    assert done.length == 10
    assert await store.read(ALICE, lambda t: files.pending_truncates(t, FAR_FUTURE_NS)) == []
    await store.write(ALICE, lambda t: files.record_truncate(t, inode.inode_id, 0))
    await store.write(ALICE, lambda t: files.forget_truncate(t, inode.inode_id))  # its file went
    assert await store.read(ALICE, lambda t: files.pending_truncates(t, FAR_FUTURE_NS)) == []
