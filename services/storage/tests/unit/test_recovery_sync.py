"""A sync's plan and the updates in flight when it starts (one node in process, its peer a fake).

Found by the fault test (1 run in 20): a write routed while the returning target was only waiting found no
successor and committed at the predecessor after the sync had looked at its chunks; the plan missed it, and the
returning replica never got an acknowledged write.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

from ff_fsprotocol.checksum import crc32c_of
from ff_fsprotocol.routing import Chain, RoutingView
from ff_fsprotocol.routing import Target as RoutingTarget
from ff_storage.core.chunks import ChunkKey, ChunkMeta
from ff_storage.core.requests import WriteIO
from ff_storage.core.results import IoStatus, UpdateResult
from ff_storage.node_state import Update
from ff_storage.recovery import Recovery
from fireflyer.mgmtd.v1 import mgmtd_pb2 as mpb

from .conftest import WholeChainNode

KEY = (7, 0)


class FakePeer:
    """The returning target: empty, takes every update, and notes the chunks it was sent."""

    def __init__(self) -> None:
        self.sent: list[ChunkKey] = []
        self.dumped = asyncio.Event()

    async def chunk_metas(self, chain: Chain, nxt: RoutingTarget, timeout_s: float) -> dict[ChunkKey, ChunkMeta]:
        self.dumped.set()
        return {}

    async def send_updates(
        self, chain: Chain, nxt: RoutingTarget, ups: Sequence[Update], *args: object, **kwargs: object
    ) -> list[UpdateResult]:
        self.sent += [u.key for u in ups]
        return [UpdateResult(IoStatus.OK) for _ in ups]

    async def complete_sync(self, chain: Chain, nxt: RoutingTarget) -> None:
        pass


async def test_a_sync_plan_sees_a_write_that_found_no_successor_and_commits_later(
    whole_chain_node: WholeChainNode,
) -> None:
    node = whole_chain_node(101, 1, 1)
    target = node.state.targets[1]
    gate, entered = threading.Event(), threading.Event()
    write_pending = target.engine.write_pending

    def held_write_pending(*args: object, **kwargs: object) -> object:
        entered.set()
        gate.wait(10)  # (a worker thread: the event loop goes on)
        return write_pending(*args, **kwargs)  # type: ignore[arg-type]

    target.engine.write_pending = held_write_pending  # type: ignore[method-assign, assignment]
    data = b"acknowledged" * 4
    io = WriteIO(
        chain_id=1,
        chain_version=1,
        key=KEY,
        chunk_size=64,
        offset=0,
        length=len(data),
        checksum=crc32c_of(data),
        data=data,
    )
    write = asyncio.create_task(node.writer.batch_write([io], "cluster"))
    await asyncio.to_thread(entered.wait, 10)  # under way: it found no successor, it commits here alone
    serving = mpb.Target(target_id=1, node_id=101, public_state=mpb.PUBLIC_TARGET_STATE_SERVING, chain_id=1)
    syncing = mpb.Target(target_id=2, node_id=102, public_state=mpb.PUBLIC_TARGET_STATE_SYNCING, chain_id=1)
    chain_pb = mpb.Chain(chain_id=1, version=2, targets=[serving, syncing])
    node.state.on_routing(RoutingView(mpb.RoutingInfo(version=2, chains=[chain_pb])))  # the target returns
    peer = FakePeer()
    recovery = Recovery(node.state, peer)  # type: ignore[arg-type]
    succ = node.state.successor(target)
    assert succ is not None and succ[1] is not None
    sync = asyncio.create_task(recovery._sync(target, succ[0], succ[1], (1, 2, 2)))
    await peer.dumped.wait()  # (the fake peer never suspends: a sync that does not wait for the write is over now)
    gate.set()
    [result] = await write
    await sync
    assert result.ok
    assert peer.sent == [KEY], "the sync did not send the acknowledged write's chunk"


def test_a_target_in_recovery_syncs_no_one(whole_chain_node: WholeChainNode) -> None:
    """A sync's copy replaces whatever the returning target holds: only a predecessor that serves for real sends it
    (not one whose own copy may be behind: a local write failed after its successor took the update, or its lease
    lapsed), though routing still shows it serving."""
    node = whole_chain_node(101, 1, 1)
    target = node.state.targets[1]
    serving = mpb.Target(target_id=1, node_id=101, public_state=mpb.PUBLIC_TARGET_STATE_SERVING, chain_id=1)
    syncing = mpb.Target(target_id=2, node_id=102, public_state=mpb.PUBLIC_TARGET_STATE_SYNCING, chain_id=1)
    chain_pb = mpb.Chain(chain_id=1, version=2, targets=[serving, syncing])
    node.state.on_routing(RoutingView(mpb.RoutingInfo(version=2, chains=[chain_pb])))
    recovery = Recovery(node.state, FakePeer())  # type: ignore[arg-type]
    assert [job for *_, job in recovery.due_syncs()] == [(1, 2, 2)]
    node.state.lease_ok = False
    assert recovery.due_syncs() == []
    node.state.lease_ok = True
    target.role.needs_recovery()
    assert recovery.due_syncs() == []
