"""FileOps flows over a real SQLite MetaStore, with mgmtd and storage left out (the chain tables given, no chunks)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from ff_cluster import MgmtdClient
from ff_meta.core.errors import FsCode, FsError
from ff_meta.core.model import Defaults, Inode, LayoutSpec, PathAt
from ff_meta.core.perms import Caller
from ff_meta.ops import MetaOps, MetaOptions
from ff_meta.ops.shared import SYSTEM
from ff_meta.ops.types import CloseArgs, CreateArgs, OpenArgs
from ff_meta.store.metastore import MetaStore
from ff_meta.store.schema import sessions

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


class Storage:
    """The file's end in storage (``StorageChunks.length`` and ``remove_tail``); once armed, the next length query
    answers what storage held when it was asked, but only when the test lets it (an answer in flight)."""

    def __init__(self) -> None:
        self.end = 0
        self.asks = 0
        self.armed = False
        self.asked = asyncio.Event()
        self.answer = asyncio.Event()

    async def length(self, inode: Inode) -> int | None:
        end = self.end
        self.asks += 1
        if self.armed:
            self.armed = False
            self.asked.set()
            await self.answer.wait()
        return end or None

    async def lengths(self, inodes: list[Inode]) -> list[int | None]:
        return [await self.length(inode) for inode in inodes]

    async def remove_tail(self, inode: Inode, length: int, *, known_longer: bool = False) -> None:
        self.end = min(self.end, length)


async def _written_unreported(meta: MetaOps, path: PathAt) -> tuple[Storage, Inode]:
    """A file with a write session ("a") that wrote 10,000 bytes to storage without telling meta."""
    storage = Storage()
    meta.shared.chunks.length = storage.length  # type: ignore[method-assign]
    meta.shared.chunks.lengths = storage.lengths  # type: ignore[method-assign]
    meta.shared.chunks.remove_tail = storage.remove_tail  # type: ignore[method-assign]
    await meta.files.create(ALICE, CreateArgs(path=path, mode=0o644, exclusive=True))
    a = await meta.files.open(ALICE, OpenArgs(path=path, read=False, write=True, session_id="a", client_id="A"))
    storage.end = 10_000
    return storage, a.inode


async def _cut_while_asked(meta: MetaOps, storage: Storage, path: PathAt, finishing: asyncio.Task[Any]) -> Any:
    """Truncate the file to 3,000 while ``finishing`` holds storage's answer (10,000), then let it go on."""
    await asyncio.wait_for(storage.asked.wait(), 10)
    cut = await meta.files.truncate(ALICE, path, 3_000, "")
    assert cut.length == 3_000 and storage.end == 3_000
    storage.answer.set()
    return await asyncio.wait_for(finishing, 10)


async def test_a_close_whose_storage_answer_predates_a_cut_does_not_regrow_the_file(
    ops: tuple[MetaOps, Gate],
) -> None:
    """A writer wrote 10,000 bytes (in storage, unreported) and closes; its Close asked storage (10,000) and, before
    it commits, another client truncates the file to 3,000 (storage cut, length committed, the session stamped).
    The Close must not commit the answer it got before the cut: the file regrew to 10,000 (zeros past 3,000)."""
    meta, _ = ops
    path = PathAt(0, "/cut")
    storage, inode = await _written_unreported(meta, path)
    storage.armed = True
    closing = asyncio.create_task(meta.files.close(ALICE, CloseArgs(inode.inode_id, "a", 10_000, None)))
    closed = await _cut_while_asked(meta, storage, path, closing)
    assert closed.length == 3_000
    assert (await meta.files.sync(ALICE, CloseArgs(inode.inode_id, "", 0, None))).length == 3_000


async def test_a_batch_close_whose_storage_answer_predates_a_cut_does_not_regrow_the_file(
    ops: tuple[MetaOps, Gate],
) -> None:
    """The same through BatchClose (the write-back path's closes), storage asked once for the batch."""
    meta, _ = ops
    path = PathAt(0, "/cut-batch")
    storage, inode = await _written_unreported(meta, path)
    storage.armed = True
    closing = asyncio.create_task(meta.files.batch_close(ALICE, [CloseArgs(inode.inode_id, "a", 10_000, None)]))
    closed = await _cut_while_asked(meta, storage, path, closing)
    assert [c.length for c in closed] == [3_000]
    assert (await meta.files.sync(ALICE, CloseArgs(inode.inode_id, "", 0, None))).length == 3_000


async def test_a_lapsed_session_collected_around_a_cut_does_not_regrow_the_file(ops: tuple[MetaOps, Gate]) -> None:
    """The writer went away (its lease lapsed); meta's collection asked storage (10,000), another client cut the file
    to 3,000 before the collection committed: the session is collected in a later round, at 3,000."""
    meta, _ = ops
    path = PathAt(0, "/cut-lapsed")
    storage, inode = await _written_unreported(meta, path)
    await meta.shared.store.write(SYSTEM, lambda t: t.session.execute(sa.update(sessions).values(lease_expires_at=0)))
    meta.background._started -= meta.shared.options.lease_s  # past the instance's first lease (collects nothing)
    storage.armed = True
    collecting = asyncio.create_task(meta.background.collect_sessions())
    assert await _cut_while_asked(meta, storage, path, collecting) == 0  # its answer predates the cut: not now
    assert await meta.background.collect_sessions() == 1
    assert (await meta.files.sync(ALICE, CloseArgs(inode.inode_id, "", 0, None))).length == 3_000


async def test_a_close_whose_file_only_grew_meanwhile_takes_storage_answer_at_once(ops: tuple[MetaOps, Gate]) -> None:
    """No truncate in between, only the writer's renewal (length and ctime move): an answer that takes the file no
    further than meta now knows stands, storage is asked once."""
    meta, _ = ops
    path = PathAt(0, "/grown")
    storage, inode = await _written_unreported(meta, path)
    storage.armed = True
    closing = asyncio.create_task(meta.files.close(ALICE, CloseArgs(inode.inode_id, "a", 10_000, None)))
    await asyncio.wait_for(storage.asked.wait(), 10)
    await meta.files.renew_sessions(ALICE, "A", [("a", inode.inode_id, 10_000)])
    storage.answer.set()
    closed = await asyncio.wait_for(closing, 10)
    assert closed.length == 10_000 and storage.asks == 1


async def test_a_writer_sync_takes_its_report_and_after_a_cut_storage_answer(ops: tuple[MetaOps, Gate]) -> None:
    """A writer's Sync commits the length its session reports without asking storage (one write, no read first); once
    its file was cut while it was open, its report no longer counts: that Sync asks storage, and takes its answer."""
    meta, _ = ops
    path = PathAt(0, "/synced")
    storage, inode = await _written_unreported(meta, path)
    synced = await meta.files.sync(ALICE, CloseArgs(inode.inode_id, "a", 4_000, 123))
    assert (synced.length, synced.mtime_ns, storage.asks) == (4_000, 123, 0)
    assert (await meta.files.truncate(ALICE, path, 3_000, "")).length == 3_000
    storage.end = 6_000  # written past the cut since
    synced = await meta.files.sync(ALICE, CloseArgs(inode.inode_id, "a", 8_000, None))
    assert (synced.length, storage.asks) == (6_000, 1)
    with pytest.raises(FsError) as lost:
        await meta.files.sync(ALICE, CloseArgs(inode.inode_id, "no-such-session", 9_000, None))
    assert lost.value.fs_code is FsCode.BAD_SESSION
    assert (await meta.files.sync(ALICE, CloseArgs(inode.inode_id, "", 0, None))).length == 6_000
