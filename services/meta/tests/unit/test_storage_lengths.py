"""``StorageChunks.length`` and ``lengths``: one QueryLastChunk per node serving the stripe, a chain alone on a miss.

Over a routing view built here and a stand-in for the nodes' QueryLastChunk that records each call (the nodes' own
answers are storage's tests'; what meta asks, of whom, and what it makes of the answers, are tested here).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from ff_fsprotocol.routing import RoutingView
from ff_meta.core.model import Inode, InodeType
from ff_meta.store.chunks import StorageChunks
from ff_rpc import RpcError
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2 as mpb
from fireflyer.storage.v1 import storage_pb2 as spb

MIB = 1 << 20
SERVING = mpb.PUBLIC_TARGET_STATE_SERVING
# (chain, inode) -> (last chunk index, its length); a pair not here: the chain holds no chunk of the inode
Chunks = dict[tuple[int, int], tuple[int, int]]
# What a node answers for a query instead of its chunk, by (node address, chain): a status, or an exception
Refusal = Callable[[str, int], "int | None"]


def _view(chain_nodes: dict[int, list[int]], chain_version: int = 4) -> RoutingView:
    """Chains (head first) over nodes 1.. (node n at "s:n"), all serving, in table 1."""
    nodes = sorted({n for ns in chain_nodes.values() for n in ns})
    return RoutingView(
        mpb.RoutingInfo(
            version=1,
            nodes=[
                mpb.Node(
                    node_id=n,
                    status=mpb.NODE_STATUS_ALIVE,
                    enabled=True,
                    endpoints=[common_pb2.Endpoint(name="grpc", address=f"s:{n}")],
                )
                for n in nodes
            ],
            chains=[
                mpb.Chain(
                    chain_id=c,
                    version=chain_version,
                    targets=[
                        mpb.Target(target_id=c * 10 + k, node_id=n, public_state=SERVING) for k, n in enumerate(ns)
                    ],
                )
                for c, ns in chain_nodes.items()
            ],
            chain_tables=[mpb.ChainTable(table_id=1, version=1, chain_ids=list(chain_nodes))],
        )
    )


@dataclass
class _Routing:
    view: RoutingView
    refreshed: int = 0

    async def get(self) -> RoutingView:
        return self.view

    async def refresh(self, *, force: bool = False) -> RoutingView:
        self.refreshed += 1
        return self.view


@dataclass
class _Storage:
    """The nodes' QueryLastChunk over ``chunks``; ``calls``: (address, [(chain, inode), ...]) of each call."""

    chunks: Chunks
    refuse: Refusal = lambda address, chain: None
    failing_calls: int = 0  # the first calls fail as a node that does not answer
    calls: list[tuple[str, list[tuple[int, int]]]] = field(default_factory=list)

    def get(self, address: str) -> _Node:
        return _Node(self, address)


@dataclass
class _Node:
    storage: _Storage
    address: str

    async def query_last_chunk(self, request: spb.QueryLastChunkRequest) -> spb.QueryLastChunkResponse:
        s = self.storage
        s.calls.append((self.address, [(q.chain_id, q.inode_id) for q in request.queries]))
        if len(s.calls) <= s.failing_calls:
            raise RpcError(grpc.StatusCode.UNAVAILABLE, "down")
        results = []
        for q in request.queries:
            status = s.refuse(self.address, q.chain_id)
            found = s.chunks.get((q.chain_id, q.inode_id))
            if status is not None:
                results.append(spb.LastChunkResult(status=status))  # type: ignore[arg-type]
            elif found is None:
                results.append(spb.LastChunkResult(status=spb.CHUNK_IO_STATUS_CHUNK_NOT_FOUND))
            else:
                results.append(
                    spb.LastChunkResult(
                        status=spb.CHUNK_IO_STATUS_OK, last_chunk_index=found[0], last_chunk_length_bytes=found[1]
                    )
                )
        return spb.QueryLastChunkResponse(results=results)


def _file(inode_id: int, stripe: int) -> Inode:
    return Inode(
        inode_id=inode_id,
        type=InodeType.FILE,
        mode=0o644,
        uid=0,
        gid=0,
        chain_table_id=1,
        chunk_size=MIB,
        stripe_size=stripe,
    )


def _chunks(routing: _Routing, storage: _Storage) -> StorageChunks:
    return StorageChunks(routing, storage)  # type: ignore[arg-type]


def test_a_stripe_whose_chains_share_a_node_is_one_call() -> None:
    """The test cluster's layout: two chains of three replicas over three nodes."""
    storage = _Storage({(1, 7): (0, 4096), (2, 7): (1, 100)})
    chunks = _chunks(_Routing(_view({1: [1, 2, 3], 2: [2, 3, 1]})), storage)
    assert asyncio.run(chunks.length(_file(7, 2))) == MIB + 100
    assert storage.calls == [("s:2", [(1, 7), (2, 7)])]  # node 2: the head of chain 2, next to chain 1's


def test_no_chunk_anywhere_is_no_length_and_a_directory_asks_nothing() -> None:
    storage = _Storage({})
    chunks = _chunks(_Routing(_view({1: [1, 2], 2: [2, 1]})), storage)
    assert asyncio.run(chunks.length(_file(7, 2))) is None
    assert len(storage.calls) == 1
    directory = Inode(inode_id=8, type=InodeType.DIRECTORY, mode=0o755, uid=0, gid=0)
    assert asyncio.run(chunks.length(directory)) is None
    assert len(storage.calls) == 1


def test_a_batch_asks_each_node_once_for_every_file() -> None:
    storage = _Storage({(1, 7): (0, 10), (2, 8): (2, 20), (3, 9): (0, 30)})
    chunks = _chunks(_Routing(_view({1: [1, 2], 2: [2, 3], 3: [3, 1]})), storage)
    got = asyncio.run(chunks.lengths([_file(7, 3), _file(8, 3), _file(9, 3)]))
    assert got == [10, 2 * MIB + 20, 30]
    assert sorted(len(qs) for _, qs in storage.calls) == [3, 6]  # two nodes: 2 chains x 3 files, 1 chain x 3


def test_a_chain_the_node_does_not_settle_is_asked_again_alone() -> None:
    """A stale version (or a pending one) at the node asked: that chain alone, again, with fresh routing."""
    stale_once = {("s:1", 2)}

    def refuse(address: str, chain: int) -> int | None:
        if (address, chain) in stale_once:
            stale_once.discard((address, chain))
            return spb.CHUNK_IO_STATUS_STALE_CHAIN_VERSION
        return None

    storage = _Storage({(1, 7): (0, 10), (2, 7): (3, 5)}, refuse=refuse)
    routing = _Routing(_view({1: [1, 2], 2: [1, 2]}))
    assert asyncio.run(_chunks(routing, storage).length(_file(7, 2))) == 3 * MIB + 5
    assert storage.calls == [("s:1", [(1, 7), (2, 7)]), ("s:1", [(2, 7)])]


def test_a_node_that_does_not_answer_leaves_each_chain_to_be_asked_alone() -> None:
    storage = _Storage({(1, 7): (0, 10), (2, 7): (0, 20)}, failing_calls=1)
    chunks = _chunks(_Routing(_view({1: [1, 2], 2: [1, 3]})), storage)
    assert asyncio.run(chunks.length(_file(7, 2))) == 20
    first, *alone = storage.calls
    assert first == ("s:1", [(1, 7), (2, 7)])
    assert sorted(alone) == [("s:1", [(1, 7)]), ("s:1", [(2, 7)])]  # each chain on its own, at its head
