"""Copies that a replica takes whatever version it holds ("store here only": a sync's, a repair's) come only from a
serving target ahead of it in its chain, as its routing has it; a CompleteSync only for its chain's version.

A head taken out of its chain whose routing is stale (partitioned from mgmtd, or paused) could otherwise repair the
chain's tail back to an older version than the chain acknowledged, and a predecessor taken out of the chain could end
a sync with an older copy. Real StorageNodes in one process: ForwardUpdates between them goes through the wire's
protobuf into the receiving node's ``forward_updates`` with the request's ``from_target_id``, as the servicer does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from ff_fsprotocol.checksum import crc32c_of
from ff_fsprotocol.routing import RoutingView
from ff_storage.core.errors import InvalidRequest
from ff_storage.core.requests import ChunkUpdate, RepairRequest, UpdateKind, WriteIO
from ff_storage.core.results import IoStatus
from ff_storage.core.target_role import Local
from ff_storage.dataserver import TransferBoxes
from ff_storage.node import StorageNode
from ff_storage.servicer import StorageServicer
from ff_storage.wire import chunk_updates_from_pb, update_results_pb
from fireflyer.mgmtd.v1 import mgmtd_pb2 as mpb
from fireflyer.storage.v1 import storage_pb2 as spb

from .conftest import NodeConfigOf

KEY = (9, 0)
SIZE = 4096
S, SY, OFF = mpb.PUBLIC_TARGET_STATE_SERVING, mpb.PUBLIC_TARGET_STATE_SYNCING, mpb.PUBLIC_TARGET_STATE_OFFLINE
WAIT = mpb.PUBLIC_TARGET_STATE_WAITING


class _Client:
    """What ``peers.client(node_id)`` gives: ForwardUpdates into the other node, through the wire's protobuf."""

    def __init__(self, node: StorageNode) -> None:
        self.node = node

    async def forward_updates(self, request: spb.ForwardUpdatesRequest) -> spb.ForwardUpdatesResponse:
        request = spb.ForwardUpdatesRequest.FromString(request.SerializeToString())
        updates = chunk_updates_from_pb(request)
        results = await self.node.writer.forward_updates(updates, "peer", {}, request.from_target_id)
        return spb.ForwardUpdatesResponse(results=update_results_pb(results))


def _routing(version: int, chain_version: int, members: list[tuple[int, int, int]]) -> RoutingView:
    targets = [mpb.Target(target_id=t, node_id=n, public_state=s, chain_id=1) for t, n, s in members]
    return RoutingView(
        mpb.RoutingInfo(version=version, chains=[mpb.Chain(chain_id=1, version=chain_version, targets=targets)])
    )


@pytest.fixture
async def nodes(node_config: NodeConfigOf, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[dict[int, StorageNode]]:
    made = {
        n: StorageNode(node_config(n, fsync=False, forward_timeout_s=2.0), TransferBoxes()) for n in (101, 102, 103)
    }
    for n, node in made.items():
        node.state.create_target(n - 100, 1, 0)  # targets 1, 2, 3 on nodes 101, 102, 103
        monkeypatch.setattr(node.peers, "client", lambda node_id: _Client(made[node_id]))
        node.state.on_routing(_routing(1, 1, [(1, 101, S), (2, 102, S), (3, 103, S)]))
    try:
        yield made
    finally:
        for node in made.values():
            node.close()


def _write(data: bytes, chain_version: int) -> WriteIO:
    return WriteIO(
        chain_id=1,
        chain_version=chain_version,
        key=KEY,
        offset=0,
        length=len(data),
        chunk_size=SIZE,
        checksum=crc32c_of(data),
        data=data,
    )


def _held(node: StorageNode) -> tuple[int, bytes]:
    engine = node.state.target_of_chain(1).engine  # type: ignore[union-attr]
    got = engine.read_committed(KEY)
    return (got[0].committed_version, bytes(got[1])) if got else (0, b"")


async def test_a_deposed_head_with_stale_routing_repairs_no_replica_back_to_an_older_version(
    nodes: dict[int, StorageNode],
) -> None:
    a, b, c = nodes[101], nodes[102], nodes[103]
    old, new = b"o" * SIZE, b"n" * SIZE
    [r] = await a.writer.batch_write([_write(old, 1)], "client")  # version 1 on A, B and C
    assert r.status == IoStatus.OK and r.committed_version == 1, r
    # mgmtd takes A out; B and C see it, A (partitioned from mgmtd, its lease not lapsed yet) does not.
    v2 = _routing(2, 2, [(2, 102, S), (3, 103, S), (1, 101, OFF)])
    b.state.on_routing(v2)
    c.state.on_routing(v2)
    [r] = await b.writer.batch_write([_write(new, 2)], "client")  # version 2 on B and C, acknowledged
    assert r.status == IoStatus.OK and r.committed_version == 2, r
    # A RepairChunks reaches A, which still heads the chain in its routing: it sends its version-1 copy.
    [got] = await a.recovery.repair(RepairRequest(chain_id=1, chain_version=1, keys=(KEY,)))
    assert _held(b) == (2, new), "the new head took the copy"
    assert _held(c) == (2, new), "the tail took a copy from a target no longer ahead of it"
    # The repair says so, naming each replica that refused, instead of answering "repaired".
    assert got.status == IoStatus.FORWARD_FAILED, got
    assert "target 2:" in got.message and "target 3:" in got.message, got.message


async def test_a_head_whose_lease_lapsed_repairs_nothing(nodes: dict[int, StorageNode]) -> None:
    a = nodes[101]
    [r] = await a.writer.batch_write([_write(b"o" * SIZE, 1)], "client")
    assert r.status == IoStatus.OK
    a.state.lease_lost()
    [got] = await a.recovery.repair(RepairRequest(chain_id=1, chain_version=1, keys=(KEY,)))
    assert got.status == IoStatus.TARGET_NOT_SERVING


def _full(data: bytes, version: int, chain_version: int, no_forward: bool) -> ChunkUpdate:
    return ChunkUpdate(
        chain_id=1,
        chain_version=chain_version,
        key=KEY,
        kind=UpdateKind.WRITE,
        version=version,
        chunk_size=SIZE,
        offset=0,
        length=len(data),
        checksum=crc32c_of(data),
        data=data,
        full=True,
        no_forward=no_forward,
    )


async def test_a_syncing_target_takes_copies_and_its_sync_s_end_only_from_its_predecessor(
    nodes: dict[int, StorageNode],
) -> None:
    """Chain v1 [A, B, C syncing] (B syncs C); v2 [A, C syncing, B offline]: A precedes C now. C sees v2, B does not."""
    c = nodes[103]
    c.state.on_routing(_routing(2, 2, [(1, 101, S), (3, 103, SY), (2, 102, OFF)]))
    old, new = b"o" * SIZE, b"n" * SIZE
    [r] = await c.writer.forward_updates([_full(new, 6, 2, no_forward=False)], "A", from_target=1)
    assert r.status == IoStatus.OK  # A's forward of a write: version 6 (a full replace: C is syncing)
    [r] = await c.writer.forward_updates([_full(old, 5, 1, no_forward=True)], "B", from_target=2)
    assert r.status == IoStatus.TARGET_NOT_SERVING  # B's sync copy, read before: refused
    assert _held(c) == (6, new)
    with pytest.raises(InvalidRequest, match="version 2 here, not 1"):
        c.recovery.complete_sync(3, 1)  # B's CompleteSync, for the chain as B's routing has it
    assert c.state.targets[3].role.report() is not Local.UPTODATE
    [r] = await c.writer.forward_updates([_full(old, 7, 2, no_forward=True)], "A", from_target=1)
    assert r.status == IoStatus.OK  # a copy from A, serving ahead of C, is taken
    c.recovery.complete_sync(3, 2)
    assert c.state.targets[3].role.report() is Local.UPTODATE


class _Syncee(_Client):
    """``_Client`` with the calls a sync makes: a chunk dump (slow, as a big target's) and CompleteSync."""

    async def dump_chunk_meta(
        self, request: spb.DumpChunkMetaRequest, timeout_s: float | None = None
    ) -> AsyncIterator[spb.DumpChunkMetaResponse]:
        await asyncio.sleep(0.5)
        async for batch in StorageServicer(self.node).DumpChunkMeta(request, None):  # type: ignore[arg-type]
            yield batch

    async def complete_sync(self, request: spb.CompleteSyncRequest) -> spb.CompleteSyncResponse:
        return await StorageServicer(self.node).CompleteSync(request, None)  # type: ignore[arg-type]


async def test_a_sync_ends_while_another_target_of_its_chain_keeps_changing(
    nodes: dict[int, StorageNode], monkeypatch: pytest.MonkeyPatch
) -> None:
    """B syncs from A while C crash-loops: the chain's version moves every 0.2 s, more often than one sync attempt
    (0.5 s of dump) takes. The sync ends with the chain's version of its end, not the one it began at."""
    a, b, c = nodes[101], nodes[102], nodes[103]
    for i in range(5):
        data = bytes([i]) * SIZE
        io = WriteIO(chain_id=1, chain_version=1, key=(9, i), offset=0, length=SIZE, chunk_size=SIZE,
                     checksum=crc32c_of(data), data=data)  # fmt: skip
        [r] = await a.writer.batch_write([io], "client")
        assert r.status == IoStatus.OK
    monkeypatch.setattr(a.peers, "client", lambda node_id: _Syncee(nodes[node_id]))

    def publish(version: int) -> None:
        flapping = (WAIT, OFF)[version % 2]
        for node in (a, b, c):
            node.state.on_routing(_routing(version, version, [(1, 101, S), (2, 102, SY), (3, 103, flapping)]))

    publish(10)
    stop = asyncio.Event()
    loop = asyncio.ensure_future(a.recovery.sync_loop(stop, 0.05))
    try:
        for version in range(11, 31):  # 4 s of churn
            await asyncio.sleep(0.2)
            publish(version)
            if b.state.targets[2].role.report() is Local.UPTODATE:
                break
        assert b.state.targets[2].role.report() is Local.UPTODATE, "B stayed syncing while the chain kept changing"
    finally:
        stop.set()
        await asyncio.wait_for(loop, 10)
