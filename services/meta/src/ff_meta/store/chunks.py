"""Meta's calls to storage about a file's chunks.

Its exact length (the end of its last chunk), removing and cutting chunks. Every chain of a file's stripe is asked at
once (``core.lengths``), each call at a serving target of the chain built for the chain's current version and retried
with fresh routing while that is stale.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from ff_fsprotocol.layout import file_chains
from ff_fsprotocol.routing import RoutingCache, RoutingView
from ff_meta.core.errors import StorageUnavailable
from ff_meta.core.lengths import LastChunk, file_end, nodes_to_ask, on_every_chain
from ff_meta.core.model import Inode
from ff_rpc import RpcError
from ff_rpc.client import ClientPool
from fireflyer.storage.v1 import storage_pb2 as spb
from fireflyer.storage.v1.storage_client import StorageServiceClient

LAST_CHUNK_QUERIES = 512  # files per QueryLastChunk call of ``lengths``
ATTEMPTS = 8  # per chain call, with fresh routing between them
T = TypeVar("T")
RequestT = TypeVar("RequestT")
ResponseT = TypeVar("ResponseT")
_SETTLED = frozenset({spb.CHUNK_IO_STATUS_OK, spb.CHUNK_IO_STATUS_CHUNK_NOT_FOUND})


class StorageChunks:
    """The storage side of Close, Sync, Truncate and GC, for meta's operators."""

    def __init__(self, routing: RoutingCache, storage: ClientPool[StorageServiceClient]) -> None:
        self._routing = routing
        self._storage = storage

    async def chains(self, table_id: int, begin: int, stripe: int, seed: int) -> list[int]:
        """The chains of a file's stripe, in order (routing refreshed once if the table is unknown or short)."""
        view = await self._routing.get()
        table = view.tables.get(table_id)
        if table is None or len(table.chain_ids) < stripe:
            view = await self._routing.refresh()
            table = view.tables.get(table_id)
        if table is None:
            raise StorageUnavailable(f"chain table {table_id} is unknown")
        return file_chains(list(table.chain_ids), begin, stripe, seed)

    async def _file_chains(self, inode: Inode) -> list[int]:
        return await self.chains(inode.chain_table_id, inode.chain_begin, inode.stripe_size, inode.shuffle_seed)

    async def _call(
        self,
        chain_id: int,
        method: Callable[[StorageServiceClient], Callable[[RequestT], Awaitable[ResponseT]]],
        build: Callable[[int], RequestT],
        *,
        head: bool,
        ok: Callable[[ResponseT], bool],
    ) -> ResponseT:
        """One call at a serving target of a chain, retried on stale routing.

        One call to a serving target of the chain (its head for updates) built for the chain's current
        version; retried with fresh routing while it fails or ``ok(response)`` says the routing was stale.
        """
        last: object = None
        view = await self._routing.get()
        for attempt in range(ATTEMPTS):
            if attempt:
                await asyncio.sleep(min(1.0, 0.05 * 2**attempt))
                view = await self._routing.refresh(force=True)
            chain = view.chain(chain_id)
            if chain is None:
                last = f"chain {chain_id} is unknown"
                continue
            targets = [view.head(chain_id)] if head else view.serving(chain_id)
            nodes = [view.node(t.node_id) for t in targets if t is not None]
            node = next((n for n in nodes if n is not None and n.grpc), None)
            if node is None:
                last = f"chain {chain_id} has no serving target"
                continue
            try:
                resp = await method(self._storage.get(node.grpc))(build(chain.version))
            except RpcError as err:
                last = err
                continue
            if ok(resp):
                return resp
            last = resp
        raise StorageUnavailable(f"storage did not answer for chain {chain_id}: {last}")

    async def length(self, inode: Inode) -> int | None:
        """The file's exact length from storage: the end of its last chunk (None: no chunk at all).

        Every chain of the stripe is asked at once, and of as few nodes as serve them (``_last_chunks``): a Close
        waits for one storage round trip, not one per chain.
        """
        return (await self.lengths([inode]))[0]

    async def lengths(self, inodes: Sequence[Inode]) -> list[int | None]:
        """``length`` of many files at once: one QueryLastChunk per node asked for the batch (``_last_chunks``)."""
        chains_of = [
            list(dict.fromkeys(await self._file_chains(inode)))
            if inode.is_file and inode.chain_table_id and inode.stripe_size
            else []
            for inode in inodes
        ]
        answers = await self._last_chunks(
            [(c, inode.inode_id) for inode, chains in zip(inodes, chains_of, strict=True) for c in chains]
        )
        return [
            file_end((answers[(c, inode.inode_id)] for c in chains), inode.chunk_size)
            for inode, chains in zip(inodes, chains_of, strict=True)
        ]

    async def _last_chunks(self, asks: Sequence[tuple[int, int]]) -> dict[tuple[int, int], LastChunk]:
        """The last chunk of each (chain, inode) asked, all at once.

        First of few nodes (``_ask_nodes``); a chain whose answer did not settle there (stale routing, a pending
        version, the node did not answer) is then asked alone, retried with fresh routing (``_ask_chain``).
        """
        answers: dict[tuple[int, int], LastChunk] = {}
        inodes_of: dict[int, list[int]] = {}
        for chain_id, inode_id in dict.fromkeys(asks):
            inodes_of.setdefault(chain_id, []).append(inode_id)
        if inodes_of:
            await self._ask_nodes(await self._routing.get(), inodes_of, answers)
        unsettled = {c: [i for i in ids if (c, i) not in answers] for c, ids in inodes_of.items()}
        await asyncio.gather(
            *(self._ask_chain(c, part, answers) for c, ids in unsettled.items() for part in _batches(ids))
        )
        return answers

    async def _ask_nodes(
        self, view: RoutingView, inodes_of: dict[int, list[int]], answers: dict[tuple[int, int], LastChunk]
    ) -> None:
        """One QueryLastChunk per node of ``core.lengths.nodes_to_ask`` (up to ``LAST_CHUNK_QUERIES`` queries a call).

        Each node answers for every chain it serves; the settled answers go to ``answers``, the rest are left out.
        """
        serving: dict[int, list[int]] = {}
        for chain_id in inodes_of:
            nodes = (view.node(t.node_id) for t in view.serving(chain_id))
            serving[chain_id] = [n.node_id for n in nodes if n is not None and n.grpc]

        async def ask(address: str, queries: list[spb.LastChunkQuery]) -> None:
            try:
                resp = await self._storage.get(address).query_last_chunk(spb.QueryLastChunkRequest(queries=queries))
            except RpcError:
                return  # its chains are asked again alone
            if len(resp.results) == len(queries):
                for q, r in zip(queries, resp.results, strict=True):
                    if r.status in _SETTLED:
                        answers[(q.chain_id, q.inode_id)] = _last_chunk_of(r)

        calls = []
        for node_id, chains in nodes_to_ask(serving).items():
            queries = [
                spb.LastChunkQuery(chain_id=c, chain_version=view.chains[c].version, inode_id=i)
                for c in chains
                for i in inodes_of[c]
            ]
            calls += [ask(view.nodes[node_id].grpc, part) for part in _batches(queries)]
        await asyncio.gather(*calls)

    async def _ask_chain(self, chain_id: int, inode_ids: list[int], answers: dict[tuple[int, int], LastChunk]) -> None:
        """The last chunks of files on one chain, at a serving target of it, retried with fresh routing."""

        def build(version: int) -> spb.QueryLastChunkRequest:
            return spb.QueryLastChunkRequest(
                queries=[spb.LastChunkQuery(chain_id=chain_id, chain_version=version, inode_id=i) for i in inode_ids]
            )

        resp = await self._call(
            chain_id,
            lambda c: c.query_last_chunk,
            build,
            head=False,
            ok=lambda r: all(x.status in _SETTLED for x in r.results),
        )
        for i, r in zip(inode_ids, resp.results, strict=True):
            answers[(chain_id, i)] = _last_chunk_of(r)

    async def remove(
        self, inode_id: int, table_id: int, begin: int, stripe: int, seed: int, from_chunk: int = 0
    ) -> int:
        """Remove a file's chunks from ``from_chunk`` on.

        Remove the file's chunks from ``from_chunk`` on, on every chain of its stripe at once; the number
        removed.
        """
        chains = await self.chains(table_id, begin, stripe, seed)

        async def on_chain(chain_id: int) -> int:
            removed = 0
            while True:

                def build(version: int) -> spb.RemoveChunksRequest:
                    return spb.RemoveChunksRequest(
                        chain_id=chain_id, chain_version=version, inode_id=inode_id, begin_chunk_index=from_chunk
                    )

                resp = await self._call(chain_id, lambda c: c.remove_chunks, build, head=True, ok=lambda r: True)
                removed += int(resp.num_removed)
                if not resp.has_more:
                    return removed

        return sum(await on_every_chain(chains, on_chain))

    async def cut(self, inode: Inode, chunk_index: int, length: int) -> None:
        """Cut one chunk of the file to ``length`` bytes (a truncate that ends inside it)."""
        chains = await self._file_chains(inode)
        chain_id = chains[chunk_index % len(chains)]

        def build(version: int) -> spb.TruncateChunksRequest:
            return spb.TruncateChunksRequest(
                ios=[
                    spb.TruncateIO(
                        chain_id=chain_id,
                        chain_version=version,
                        chunk_size_bytes=inode.chunk_size,
                        length_bytes=length,
                        chunk_id=spb.ChunkId(inode_id=inode.inode_id, chunk_index=chunk_index),
                    )
                ]
            )

        await self._call(
            chain_id, lambda c: c.truncate_chunks, build, head=True, ok=lambda r: r.results[0].status in _SETTLED
        )

    async def remove_tail(self, inode: Inode, length: int, *, known_longer: bool = False) -> None:
        """Storage's part of truncating a file.

        To ``length``, shorter than it is (meta's length, or storage's: ``known_longer``, an open writer wrote further
        than meta knows): the chunks past the new end go, every chain at once, and the chunk it ends in is cut.
        """
        if (length >= inode.length and not known_longer) or not inode.chain_table_id or not inode.stripe_size:
            return
        chunk, within = divmod(length, inode.chunk_size)
        first_gone = chunk + 1 if within else chunk
        await self.remove(
            inode.inode_id,
            inode.chain_table_id,
            inode.chain_begin,
            inode.stripe_size,
            inode.shuffle_seed,
            from_chunk=first_gone,
        )
        if within:
            await self.cut(inode, chunk, within)


def _batches(items: list[T]) -> list[list[T]]:
    """``items`` in parts of up to ``LAST_CHUNK_QUERIES`` (a QueryLastChunk's)."""
    return [items[k : k + LAST_CHUNK_QUERIES] for k in range(0, len(items), LAST_CHUNK_QUERIES)]


def _last_chunk_of(result: spb.LastChunkResult) -> LastChunk:
    """A settled answer's last chunk: (index, length), or None where the chain holds no chunk of the file."""
    return (
        (result.last_chunk_index, result.last_chunk_length_bytes) if result.status == spb.CHUNK_IO_STATUS_OK else None
    )
