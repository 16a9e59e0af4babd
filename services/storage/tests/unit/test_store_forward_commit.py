"""One replica's steps on a real chunk engine, with what crosses to the successor faked.

A chain write (``ChainWriter._store_forward_commit``): reads see the version pending while it is in flight,
and every failure leaves the target consistent (nothing committed, nothing left pending) or, when its
successor already took the update, out of service until recovery; a caller going away does not stop it.
A relaxed read racing a commit, and a sync to a returning replica racing a write, see the chunk as it is.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from ff_fsprotocol.checksum import crc32c_of
from ff_fsprotocol.routing import Chain, RoutingView, TargetState
from ff_fsprotocol.routing import Target as RoutingTarget
from ff_storage import writes
from ff_storage.core.chunks import ChunkKey, ChunkMeta, sync_diff
from ff_storage.core.errors import ChunkCorrupt
from ff_storage.core.requests import ReadIO, ReadResult, RemoveRequest, RepairRequest, UpdateKind
from ff_storage.core.results import IoStatus, UpdateResult
from ff_storage.core.target_role import Local, Public
from ff_storage.dataserver import TransferBoxes
from ff_storage.node import StorageNode
from ff_storage.node_state import NodeConfig, Target, Update
from ff_storage.store.chunk_engine import ChunkEngine
from ff_testing.waiting import eventually
from fireflyer.mgmtd.v1 import mgmtd_pb2 as mpb

KEY = (3, 0)
Forward = Callable[[Target, list[Update]], Awaitable[list[Update]]]


@pytest.fixture
async def node(node_config: Callable[..., NodeConfig]) -> AsyncIterator[StorageNode]:
    n = StorageNode(node_config(101, fsync=True), TransferBoxes())
    target = n.state.create_target(1, 1, 0)
    target.role.observe(Public.SERVING, 1)
    try:
        yield n
    finally:
        n.close()


def _target(node: StorageNode) -> Target:
    return node.state.targets[1]


def _head_of_its_chain(node: StorageNode, successors: int = 0) -> None:
    """Routing in which the node's target heads its chain (a head starts updates only while it is one), and is its
    tail unless ``successors`` serve after it (targets 2, 3, ... on nodes 102, 103, ...)."""
    serving = [
        mpb.Target(target_id=1 + i, node_id=101 + i, public_state=mpb.PUBLIC_TARGET_STATE_SERVING, chain_id=1)
        for i in range(1 + successors)
    ]
    node.state.on_routing(
        RoutingView(mpb.RoutingInfo(version=1, chains=[mpb.Chain(chain_id=1, version=1, targets=serving)]))
    )


def _update(data: bytes, version: int) -> Update:
    return Update(
        key=KEY,
        kind=UpdateKind.WRITE,
        chunk_size=len(data),
        data=data,
        data_checksum=crc32c_of(data),
        length=len(data),
        full=True,
        version=version,
        chain_version=1,
        content=data,
        content_checksum=crc32c_of(data),
    )


def _fake_forward(node: StorageNode, monkeypatch: pytest.MonkeyPatch, forward: Forward) -> None:
    """A successor that answers as ``forward`` does (the node's routing has none: the target would be the tail)."""
    monkeypatch.setattr(node.writer, "_forward", forward)
    monkeypatch.setattr(node.writer, "_is_tail", lambda target, at_head: False)


async def _successor_takes_all(target: Target, updates: list[Update]) -> list[Update]:
    for u in updates:
        u.forwarded = True
    return []


async def _committed(node: StorageNode, data: bytes, version: int) -> None:
    await node.writer._store_forward_commit(_target(node), [_update(data, version)], forward=False)


def dropped(engine: ChunkEngine) -> Callable[[], Awaitable[bool]]:
    """A check: the chunk has no pending version left."""

    async def check() -> bool:
        return engine.pending(KEY) is None

    return check


async def test_the_version_reads_as_pending_while_it_is_stored_and_forwarded(
    node: StorageNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _committed(node, b"one" * 100, 1)
    release = asyncio.Event()

    async def forward(target: Target, updates: list[Update]) -> list[Update]:
        await release.wait()
        return await _successor_takes_all(target, updates)

    _fake_forward(node, monkeypatch, forward)
    u = _update(b"two" * 100, 2)
    step = asyncio.create_task(node.writer._store_forward_commit(_target(node), [u]))

    async def stored() -> bool:
        meta = _target(node).engine.get(KEY)
        return meta is not None and meta.pending_version == 2

    await eventually(stored, timeout_s=10, what="version 2 stored here, pending")
    meta = _target(node).engine.get(KEY)
    assert meta is not None and meta.committed_version == 1  # its forward is held: not committed yet
    release.set()
    await step
    meta = _target(node).engine.get(KEY)
    assert meta is not None and meta.committed_version == 2 and not meta.pending_version
    assert u.result.status == IoStatus.OK


@pytest.mark.parametrize("successor_took_it", [True, False])
async def test_a_failed_local_write_leaves_nothing_and_takes_the_target_out_only_if_the_successor_has_it(
    node: StorageNode, monkeypatch: pytest.MonkeyPatch, successor_took_it: bool
) -> None:
    await _committed(node, b"one" * 100, 1)
    engine = _target(node).engine

    async def forward(target: Target, updates: list[Update]) -> list[Update]:
        for u in updates:
            u.forwarded = successor_took_it  # False: this is the tail, nobody else has it
        return []

    def disk_full(*args: object, **kw: object) -> None:
        raise OSError(28, "No space left on device")

    _fake_forward(node, monkeypatch, forward)
    monkeypatch.setattr(engine, "write_pending", disk_full)
    with pytest.raises(OSError):
        await node.writer._store_forward_commit(_target(node), [_update(b"two" * 100, 2)])
    await eventually(dropped(engine), timeout_s=10, what="the failed write's version dropped")
    assert engine.read_committed(KEY) == (engine.get(KEY), b"one" * 100)
    assert _target(node).role.report() is (Local.OFFLINE if successor_took_it else Local.UPTODATE)


async def test_a_failed_commit_after_the_successor_committed_takes_the_target_out(
    node: StorageNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _committed(node, b"one" * 100, 1)
    engine = _target(node).engine

    def broken(*args: object, **kw: object) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    _fake_forward(node, monkeypatch, _successor_takes_all)
    monkeypatch.setattr(engine, "commit", broken)
    with pytest.raises(sqlite3.OperationalError):
        await node.writer._store_forward_commit(_target(node), [_update(b"two" * 100, 2)])
    assert engine.pending(KEY) is None
    assert _target(node).role.report() is Local.OFFLINE


@pytest.mark.parametrize("fails", ["write_pending", "commit"])
async def test_at_the_tail_a_failed_store_or_commit_leaves_the_committed_version_and_the_target_in(
    node: StorageNode, monkeypatch: pytest.MonkeyPatch, fails: str
) -> None:
    """The tail stores and commits in one trip to a worker thread; either failing drops the version, and the
    target, which passed nothing on, stays in its chain."""
    await _committed(node, b"one" * 100, 1)
    engine = _target(node).engine
    _head_of_its_chain(node)
    assert node.writer._is_tail(_target(node), False)

    def broken(*args: object, **kw: object) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(engine, fails, broken)
    with pytest.raises(OSError):
        await node.writer._store_forward_commit(_target(node), [_update(b"two" * 100, 2)])
    await eventually(dropped(engine), timeout_s=10, what="the failed update's version dropped")
    assert engine.read_committed(KEY) == (engine.get(KEY), b"one" * 100)
    assert _target(node).role.report() is Local.UPTODATE
    monkeypatch.undo()
    await _committed(node, b"three" * 100, 2)  # the chunk takes the next update as usual
    assert engine.read_committed(KEY) == (engine.get(KEY), b"three" * 100)


async def test_at_the_tail_an_update_commits_with_its_id(node: StorageNode) -> None:
    """The one-trip store-and-commit records the update's id with the version, as the two-trip path does."""
    await _committed(node, b"one" * 100, 1)
    _head_of_its_chain(node)
    u = _update(b"two" * 100, 2)
    u.update_id = (b"c" * 16, 7)
    await node.writer._store_forward_commit(_target(node), [u])
    assert u.result.status == IoStatus.OK and u.result.committed_version == 2
    record = _target(node).engine.find_update(KEY, (b"c" * 16, 7))
    assert record is not None and record.version == 2


async def test_an_update_the_successor_did_not_take_is_dropped(
    node: StorageNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _committed(node, b"one" * 100, 1)
    engine = _target(node).engine

    async def forward(target: Target, updates: list[Update]) -> list[Update]:
        for u in updates:
            u.result = UpdateResult(status=IoStatus.FORWARD_FAILED, message="successor down")
        return list(updates)

    _fake_forward(node, monkeypatch, forward)
    u = _update(b"two" * 100, 2)
    await node.writer._store_forward_commit(_target(node), [u])
    assert u.result.status == IoStatus.FORWARD_FAILED
    assert engine.pending(KEY) is None
    assert engine.read_committed(KEY) == (engine.get(KEY), b"one" * 100)
    assert _target(node).role.report() is Local.UPTODATE


async def test_a_cancelled_update_drops_what_it_stored(node: StorageNode, monkeypatch: pytest.MonkeyPatch) -> None:
    await _committed(node, b"one" * 100, 1)
    engine = _target(node).engine

    async def forward(target: Target, updates: list[Update]) -> list[Update]:
        await asyncio.sleep(3600)  # the successor never answers; the caller gives up
        return []

    _fake_forward(node, monkeypatch, forward)
    step = asyncio.create_task(node.writer._store_forward_commit(_target(node), [_update(b"two" * 100, 2)]))

    async def stored() -> bool:
        return engine.pending(KEY) is not None

    await eventually(stored, timeout_s=10, what="version 2 stored here before the cancel")
    step.cancel()
    with pytest.raises(asyncio.CancelledError):
        await step
    await eventually(dropped(engine), timeout_s=10, what="the abandoned update's version dropped")
    assert engine.read_committed(KEY) == (engine.get(KEY), b"one" * 100)
    await _committed(node, b"three" * 100, 2)  # the chunk takes the next update as usual
    assert engine.read_committed(KEY) == (engine.get(KEY), b"three" * 100)


async def test_a_chain_update_goes_on_to_its_end_when_its_caller_goes_away(
    node: StorageNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client timing out (or a predecessor dying) mid-update must not leave this replica behind a successor
    that already committed the version: a retry would then meet "duplicate" there and keep its old bytes."""
    await _committed(node, b"one" * 100, 1)
    engine = _target(node).engine
    taken, release = asyncio.Event(), asyncio.Event()

    async def forward(target: Target, updates: list[Update]) -> list[Update]:
        await _successor_takes_all(target, updates)  # the successor committed it...
        taken.set()
        await release.wait()  # ...and its answer is slow to come back
        return []

    _fake_forward(node, monkeypatch, forward)
    _head_of_its_chain(node)
    u = _update(b"two" * 100, 0)
    call = asyncio.create_task(node.writer._head_updates(_target(node), [u]))
    await taken.wait()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    release.set()
    await node.state.finish_updates()  # the update its caller left goes on to its end
    assert engine.read_committed(KEY) == (engine.get(KEY), b"two" * 100)
    assert engine.get(KEY).committed_version == 2  # type: ignore[union-attr]
    assert u.result.status == IoStatus.OK


async def test_a_caller_that_gives_up_while_waiting_for_the_chunk_leaves_nothing_behind(
    node: StorageNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _committed(node, b"one" * 100, 1)
    engine = _target(node).engine
    _fake_forward(node, monkeypatch, _successor_takes_all)
    async with node.state.locks.hold(1, [KEY]):  # an earlier update of the chunk is running
        call = asyncio.create_task(node.writer._head_updates(_target(node), [_update(b"two" * 100, 0)]))
        await asyncio.sleep(0)
        assert node.state.locks._users[(1, KEY)] == 2, "the update is not waiting for the chunk's lock"
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    await node.state.finish_updates()
    assert engine.read_committed(KEY) == (engine.get(KEY), b"one" * 100) and engine.pending(KEY) is None
    await _committed(node, b"three" * 100, 2)  # and the chunk's lock is free
    assert engine.read_committed(KEY) == (engine.get(KEY), b"three" * 100)


async def test_a_relaxed_read_racing_the_commit_of_a_new_chunk_finds_it(
    node: StorageNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = _target(node).engine
    [pending] = engine.write_pending([(KEY, 1, 1, b"new" * 100, None)])
    read_pending = engine.read_pending

    def committed_meanwhile(key: tuple[int, int]) -> object:
        engine.commit([pending])  # lands between the read's look at the chunk and its read of the pending copy
        return read_pending(key)

    monkeypatch.setattr(engine, "read_pending", committed_meanwhile)
    io = ReadIO(chain_id=1, chain_version=1, key=KEY, offset=0, length=300, relaxed=True)
    result, data = node.reader._read_one(io)
    assert result.status is IoStatus.OK, result.message
    assert bytes(data) == b"new" * 100 and result.version == 1  # type: ignore[arg-type]


async def test_a_sync_sends_what_the_chunk_is_when_its_turn_comes_not_what_the_plan_saw(
    node: StorageNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan lists a chunk the syncing replica had only pending (and this one not yet) for removal; by the
    time its batch goes, the write committed here and may be acknowledged: the sync sends it, never removes."""
    engine = _target(node).engine
    other = (3, 1)  # not here at all: removed there
    [pending] = engine.write_pending([(KEY, 1, 1, b"new" * 100, None)])
    # the syncing replica's dump: both chunks pending only
    dump = {
        k: ChunkMeta(
            inode_id=k[0],
            chunk_index=k[1],
            chain_version=1,
            committed_version=0,
            length=0,
            checksum=0,
            pending_version=1,
        )
        for k in (KEY, other)
    }
    plan = sync_diff(engine.committed_metas(), dump)
    assert plan.remove == [KEY, other] and not plan.transfer
    engine.commit([pending])  # the write goes on: committed here, and acknowledged upstream
    sent: list[Update] = []

    async def send_updates(
        chain: Chain, nxt: RoutingTarget, ups: list[Update], *args: object, **kw: object
    ) -> list[UpdateResult]:
        sent.extend(ups)
        return [UpdateResult(status=IoStatus.OK) for _ in ups]

    monkeypatch.setattr(node.peers, "send_updates", send_updates)
    unspecified = TargetState.UNSPECIFIED
    chain = Chain(1, 1, (RoutingTarget(1, 101, unspecified), RoutingTarget(2, 102, unspecified)))
    await node.recovery._sync_batch(_target(node), chain, chain.targets[1], plan.transfer + plan.remove)
    by_key = {u.key: u for u in sent}
    assert by_key[KEY].kind is UpdateKind.WRITE and by_key[KEY].full
    assert bytes(by_key[KEY].content or b"") == b"new" * 100 and by_key[KEY].version == 1
    assert by_key[other].kind is UpdateKind.REMOVE


async def test_a_target_that_is_no_longer_the_head_starts_no_update_and_forwards_none(
    node: StorageNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch admitted at the head goes round after round: once another target heads the chain (this one was taken
    out and came back behind it), the rounds left are refused for the client to retry, not versioned here and
    forwarded past the new head; and an update in flight is not forwarded again once this target is no longer the
    head."""
    await _committed(node, b"one" * 100, 1)
    engine = _target(node).engine
    forwarded: list[Update] = []

    async def forward_then_lose_the_head(target: Target, updates: list[Update]) -> list[Update]:
        forwarded.extend(updates)
        behind = [
            mpb.Target(target_id=9, node_id=109, public_state=mpb.PUBLIC_TARGET_STATE_SERVING, chain_id=1),
            mpb.Target(target_id=1, node_id=101, public_state=mpb.PUBLIC_TARGET_STATE_SERVING, chain_id=1),
        ]
        chain = mpb.Chain(chain_id=1, version=2, targets=behind)
        node.state.on_routing(RoutingView(mpb.RoutingInfo(version=2, chains=[chain])))
        return await real_forward(target, updates)

    real_forward = node.writer._forward
    _fake_forward(node, monkeypatch, forward_then_lose_the_head)
    _head_of_its_chain(node)
    first = _update(b"two" * 100, 0)
    second = Update(key=KEY, kind=UpdateKind.TRUNCATE, chunk_size=300, length=10)  # one chunk: two rounds
    await node.writer._head_updates(_target(node), [first, second])
    assert [u.result.status for u in (first, second)] == [IoStatus.TARGET_NOT_SERVING] * 2
    assert forwarded == [first]  # the second round never started
    assert engine.read_committed(KEY) == (engine.get(KEY), b"one" * 100)
    assert await dropped(engine)()


@pytest.mark.parametrize(("count", "on_the_loop"), [(1, True), (writes.INLINE_PREPARE_UPDATES + 1, False)])
async def test_a_round_is_prepared_on_the_loop_only_when_it_is_small(
    node: StorageNode, monkeypatch: pytest.MonkeyPatch, count: int, on_the_loop: bool
) -> None:
    """Each update of a round may read its committed chunk: many small ones would hold the node's loop."""
    threads: list[threading.Thread] = []
    real = writes.prepare

    def spy(*args: Any) -> list[Update]:
        threads.append(threading.current_thread())
        return real(*args)

    monkeypatch.setattr(writes, "prepare", spy)
    updates = []
    for n in range(count):
        u = _update(b"x" * 100, 1)
        u.key = (50 + n, 0)
        updates.append(u)
    await node.writer._prepared(_target(node), updates, False)
    assert (threads == [threading.current_thread()]) is on_the_loop


def _held_in_thread(
    monkeypatch: pytest.MonkeyPatch, engine: ChunkEngine, method: str
) -> tuple[threading.Event, threading.Event]:
    """Make ``engine.method`` wait in its worker thread: (set once a call waits, set to let it go on)."""
    entered, release = threading.Event(), threading.Event()
    real = getattr(engine, method)

    def held(*args: Any, **kw: Any) -> Any:
        entered.set()
        release.wait(30)
        return real(*args, **kw)

    monkeypatch.setattr(engine, method, held)
    return entered, release


async def test_a_forward_failing_unexpectedly_returns_only_once_the_local_write_is_done(
    node: StorageNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its caller releases the chunk's lock when it returns: the next update must not start beside the write."""
    await _committed(node, b"one" * 100, 1)
    engine = _target(node).engine

    async def forward(target: Target, updates: list[Update]) -> list[Update]:
        raise RuntimeError("a bug in the forward")

    _fake_forward(node, monkeypatch, forward)
    _, release = _held_in_thread(monkeypatch, engine, "write_pending")
    step = asyncio.create_task(node.writer._store_forward_commit(_target(node), [_update(b"two" * 100, 2)]))
    done, _ = await asyncio.wait([step], timeout=0.5)
    assert not done, "it returned while its write thread was still running"
    release.set()
    with pytest.raises(RuntimeError, match="a bug in the forward"):
        await step
    await eventually(dropped(engine), timeout_s=10, what="the failed update's version dropped")
    monkeypatch.undo()
    await _committed(node, b"three" * 100, 2)
    assert engine.read_committed(KEY) == (engine.get(KEY), b"three" * 100)


async def _a_head_with_a_bad_copy(
    node: StorageNode, monkeypatch: pytest.MonkeyPatch, good: bytes, successors: int
) -> list[Update]:
    """The node's target heads its chain with ``good`` committed but its own copy damaged; the replicas (faked) hold
    ``good`` and take what they are sent: returns the list of updates sent to them."""
    await _committed(node, good, 1)
    _head_of_its_chain(node, successors=successors)

    def damaged(key: ChunkKey) -> Any:
        raise ChunkCorrupt(f"chunk {key}: checksum mismatch")

    async def good_copy(node_id: int, io: ReadIO) -> ReadResult:
        return ReadResult(status=IoStatus.OK, length=len(good), version=1, checksum=crc32c_of(good), inline_data=good)

    sent: list[Update] = []

    async def send_updates(
        chain: Chain, nxt: RoutingTarget, ups: list[Update], *args: Any, **kw: Any
    ) -> list[UpdateResult]:
        sent.extend(ups)
        return [UpdateResult(IoStatus.OK)] * len(ups)

    monkeypatch.setattr(_target(node).engine, "read_committed", damaged)
    monkeypatch.setattr(node.peers, "read_inline", good_copy)
    monkeypatch.setattr(node.peers, "send_updates", send_updates)
    return sent


async def test_a_repair_whose_caller_goes_away_still_rewrites_the_copy_and_leaves_nothing_pending(
    node: StorageNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RepairChunks at a head whose own copy is bad: cancelled while it stores the good bytes, the repair goes on to
    its end (before: the stored version stayed pending, and reads answered PENDING_VERSION until the next write)."""
    good = b"good" * 100
    engine = _target(node).engine
    sent = await _a_head_with_a_bad_copy(node, monkeypatch, good, successors=1)
    entered, release = _held_in_thread(monkeypatch, engine, "write_pending")
    call = asyncio.create_task(node.recovery.repair(RepairRequest(chain_id=1, chain_version=1, keys=(KEY,))))

    async def storing() -> bool:
        return entered.is_set()

    await eventually(storing, timeout_s=10, what="the good copy being stored here")
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert node.state.locks._users.get((1, KEY)), "the chunk's lock was released while the repair was running"
    release.set()
    await node.state.finish_updates()
    monkeypatch.undo()
    assert engine.pending(KEY) is None
    assert engine.read_committed(KEY) == (engine.get(KEY), good)
    assert [u.key for u in sent] == [KEY]  # and the replica was sent the good copy


async def test_removing_an_inode_s_chunks_waits_for_a_first_write_in_flight_and_removes_it(
    node: StorageNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RemoveChunks racing the first write of a chunk: the chunk, pending only when the removal lists the inode's
    chunks, is removed once the write is done, not left behind as an orphan of a removed file."""
    engine = _target(node).engine
    _head_of_its_chain(node)
    _, release = _held_in_thread(monkeypatch, engine, "write_pending")
    write = asyncio.create_task(node.writer._head_updates(_target(node), [_update(b"new" * 100, 0)]))

    async def in_flight() -> bool:
        return engine.pending(KEY) is not None

    await eventually(in_flight, timeout_s=10, what="the first write in flight")
    assert engine.get(KEY) is None or not engine.get(KEY).committed_version  # type: ignore[union-attr]
    request = RemoveRequest(chain_id=1, chain_version=1, inode_id=KEY[0], begin_index=0, end_index=0, max_chunks=0)
    removal = asyncio.create_task(node.writer.remove(request))
    await asyncio.sleep(0.2)
    assert not removal.done(), "the removal did not wait for the write of the chunk"
    release.set()
    await write
    assert await removal == (1, False)
    assert engine.get(KEY) is None or not engine.get(KEY).committed_version  # type: ignore[union-attr]
    assert engine.keys_of_inode(KEY[0], 0, 0) == [] and engine.pending(KEY) is None


async def test_removing_an_inode_s_chunks_waits_for_a_first_write_that_holds_its_lock_before_reserving(
    node: StorageNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A big first write is prepared in a worker thread with its chunk's lock held, before its version is reserved:
    the removal lists the chunk by its lock, waits, and removes what the write committed."""
    engine = _target(node).engine
    _head_of_its_chain(node)
    entered, release = threading.Event(), threading.Event()
    real = writes.prepare

    def held(*args: Any, **kw: Any) -> Any:
        entered.set()
        release.wait(30)
        return real(*args, **kw)

    monkeypatch.setattr(writes, "prepare", held)
    big = b"x" * (writes.INLINE_PREPARE_BYTES + 1)  # prepared in a worker thread
    write = asyncio.create_task(node.writer._head_updates(_target(node), [_update(big, 0)]))

    async def preparing() -> bool:
        return entered.is_set()

    await eventually(preparing, timeout_s=10, what="the first write preparing")
    assert engine.pending(KEY) is None  # not reserved yet
    request = RemoveRequest(chain_id=1, chain_version=1, inode_id=KEY[0], begin_index=0, end_index=0, max_chunks=0)
    removal = asyncio.create_task(node.writer.remove(request))
    await asyncio.sleep(0.2)
    assert not removal.done(), "the removal did not wait for the write holding the chunk's lock"
    release.set()
    await write
    assert await removal == (1, False)
    assert engine.keys_of_inode(KEY[0], 0, 0) == [] and engine.pending(KEY) is None


async def test_removing_an_inode_s_chunks_waits_for_a_batch_write_waiting_for_another_of_its_chunks(
    node: StorageNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Write A of chunk 1 is in flight (a slow successor); batch B (chunks 0 and 1) holds chunk 0's lock and waits for
    chunk 1's. The removal lists both, and both are gone once A and B are done."""
    engine = _target(node).engine
    k0, k1 = (KEY[0], 0), (KEY[0], 1)
    gate = asyncio.Event()
    calls = [0]

    async def forward(target: Target, updates: list[Update]) -> list[Update]:
        calls[0] += 1
        if calls[0] == 1:
            await gate.wait()
        return await _successor_takes_all(target, updates)

    _fake_forward(node, monkeypatch, forward)
    _head_of_its_chain(node)

    def of(key: ChunkKey, data: bytes) -> Update:
        u = _update(data, 0)
        u.key = key
        return u

    a = asyncio.create_task(node.writer._head_updates(_target(node), [of(k1, b"a" * 1000)]))

    async def a_in_flight() -> bool:
        return engine.pending(k1) is not None

    await eventually(a_in_flight, timeout_s=10, what="A in flight")
    b = asyncio.create_task(node.writer._head_updates(_target(node), [of(k0, b"b" * 1000), of(k1, b"c" * 1000)]))
    await asyncio.sleep(0.05)
    assert sorted(node.state.locks.keys_in_use(1, KEY[0], 0, 0)) == [k0, k1] and engine.pending(k0) is None
    request = RemoveRequest(chain_id=1, chain_version=1, inode_id=KEY[0], begin_index=0, end_index=0, max_chunks=0)
    removal = asyncio.create_task(node.writer.remove(request))
    await asyncio.sleep(0.05)
    gate.set()
    await asyncio.gather(a, b)
    assert await removal == (2, False)
    assert engine.keys_of_inode(KEY[0], 0, 0) == []


async def test_a_repair_whose_target_stopped_heading_the_chain_while_it_waited_sends_nothing(
    node: StorageNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The head's copy is bad; while its repair waits for the chunk's lock, routing takes the target out of the chain.
    It must not send its copy, older maybe than what the new head holds."""
    sent = await _a_head_with_a_bad_copy(node, monkeypatch, b"good" * 100, successors=2)
    release = await node.state.locks.acquire(1, [KEY])  # an update of the chunk is running
    repair = asyncio.create_task(node.recovery.repair(RepairRequest(chain_id=1, chain_version=1, keys=(KEY,))))
    await asyncio.sleep(0.05)
    others = [
        mpb.Target(target_id=t, node_id=100 + t, public_state=mpb.PUBLIC_TARGET_STATE_SERVING, chain_id=1)
        for t in (2, 3)
    ]
    node.state.on_routing(
        RoutingView(mpb.RoutingInfo(version=2, chains=[mpb.Chain(chain_id=1, version=2, targets=others)]))
    )
    release()
    [result] = await repair
    assert result.status == IoStatus.TARGET_NOT_SERVING and not sent
