"""FileOps flows over a real SQLite MetaStore, with mgmtd and storage left out (the chain tables given, no chunks)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ff_cluster import MgmtdClient
from ff_meta.core.model import Defaults, Inode, LayoutSpec, PathAt
from ff_meta.core.perms import Caller
from ff_meta.ops import MetaOps, MetaOptions
from ff_meta.ops.types import CloseArgs, CreateArgs, OpenArgs
from ff_meta.store.metastore import MetaStore

ALICE = Caller(1000, (1000,), "alice")
DEFAULTS = Defaults(LayoutSpec(1, 1 << 20, 4), {1: (0, 6)}, 30.0)


class Gate:
    """``Shared.defaults`` that, once armed, waits for the test: it holds a call between its transactions."""

    def __init__(self) -> None:
        self.armed = False
        self.waiting = asyncio.Event()
        self.open = asyncio.Event()

    async def defaults(self) -> Defaults:
        if self.armed:
            self.waiting.set()
            await self.open.wait()
        return DEFAULTS


@pytest.fixture
async def ops(tmp_path: Path) -> AsyncIterator[tuple[MetaOps, Gate]]:
    store = MetaStore.open(f"sqlite:///{tmp_path / 'meta.db'}")
    mgmtd = MgmtdClient(["127.0.0.1:1"], token="unused")  # never called: the gate answers the chain tables
    meta = MetaOps.build(store, mgmtd, MetaOptions(cluster_token="t"))
    gate = Gate()

    async def no_chunks(inode: Inode) -> None:  # storage holds no chunk of any file
        return None

    meta.shared.defaults = gate.defaults  # type: ignore[method-assign]
    meta.shared.chunks.length = no_chunks  # type: ignore[method-assign]
    try:
        yield meta, gate
    finally:
        await meta.close()
        await store.close()
        await mgmtd.close()
        store.dispose()


async def test_an_append_lease_taken_as_its_holder_closes_answers_the_new_end(ops: tuple[MetaOps, Gate]) -> None:
    """hf3fs appends under a write session with a well-known id (the lease) at the length Open answers: B's Open,
    held between its first transaction and the session's while A closes the lease at 28 bytes, must answer 28
    (it answered 0, and B wrote over A's record: test_coherence's lost append under load)."""
    meta, gate = ops
    path = PathAt(0, "/log")
    await meta.files.create(ALICE, CreateArgs(path=path, mode=0o644, exclusive=True))
    lease = {"session_id": "append-lease", "read": False, "write": True}
    a = await meta.files.open(ALICE, OpenArgs(path=path, client_id="A", **lease))  # type: ignore[arg-type]
    assert a.session is not None and a.inode.length == 0
    gate.armed = True
    b_open = asyncio.create_task(meta.files.open(ALICE, OpenArgs(path=path, client_id="B", **lease)))  # type: ignore[arg-type]
    await asyncio.wait_for(gate.waiting.wait(), 10)  # B read the file (length 0) and waits to open the session
    closed = await meta.files.close(ALICE, CloseArgs(a.inode.inode_id, "append-lease", 28, None))
    assert closed.length == 28
    gate.open.set()
    b = await asyncio.wait_for(b_open, 10)
    assert b.session is not None and b.session.session_id == "append-lease"
    assert b.inode.length == 28  # where B's append goes
