"""The other storage nodes as this one calls them: typed gRPC clients, data-path connections, and the forward wire.

The forward wire is updates sent to a successor, the way ``ff_fsprotocol.transport`` chooses for every write-side
call: one data-path round trip (bytes inline or beside the request), or gRPC when the successor has no data endpoint.
One of the node's two edges (the servicer is the other): it takes and gives the node's types and converts them to and
from the protocol's messages with ``wire``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from google.protobuf.message import DecodeError

from ff_fsprotocol.checksum import crc32c_of
from ff_fsprotocol.datapath import DataConnectionPool, DataPathError, parse_message
from ff_fsprotocol.routing import Chain, Target
from ff_fsprotocol.transport import WriteBytes
from ff_rpc import RpcClient
from ff_rpc.client import NO_RETRY, ClientPool
from ff_storage.core.chunks import ChunkKey, ChunkMeta, UpdateRecord
from ff_storage.core.requests import ChunkUpdate, Payload, ReadIO, ReadResult, RepairRequest, TransferRef, UpdateKind
from ff_storage.core.results import UpdateResult
from ff_storage.core.target_role import Public
from ff_storage.node_state import NodeState, Update
from ff_storage.wire import (
    chunk_meta_from_pb,
    forward_answers_from_pb,
    forward_request_pb,
    read_io_pb,
    read_result_from_pb,
    repair_pb,
)
from fireflyer.storage.v1 import storage_pb2 as spb
from fireflyer.storage.v1.storage_client import StorageServiceClient


class Peers:
    """Calls from this node to the others (its successors, the heads it asks for repairs, the targets it syncs)."""

    def __init__(self, state: NodeState) -> None:
        self.state = state
        config = state.config
        self.rpc = RpcClient(token=config.cluster_token, timeout_s=config.forward_timeout_s, retry=NO_RETRY)
        self._clients = ClientPool(StorageServiceClient, self.rpc)  # one channel per address
        self.data = DataConnectionPool(config.cluster_token)

    def client(self, node_id: int) -> StorageServiceClient:
        """The StorageService client of ``node_id`` (one shared channel per address).

        Raises:
            ConnectionError: routing has no gRPC address for the node.
        """
        view = self.state.view
        node = view.node(node_id) if view else None
        if node is None or not node.grpc:
            raise ConnectionError(f"node {node_id} has no address in routing")
        return self._clients.get(node.grpc)

    async def close_channels(self) -> None:
        """Close the gRPC channels to other nodes."""
        await self._clients.close()

    def close(self) -> None:
        """Close the data-path connections to other nodes."""
        self.data.close()

    async def send_updates(
        self,
        chain: Chain,
        nxt: Target,
        updates: list[Update],
        full_keys: set[ChunkKey],
        from_target: int,
        *,
        no_forward: bool = False,
    ) -> list[UpdateResult]:
        """Send ``updates`` of ``from_target`` (one per chunk) to its successor ``nxt``; its answers, one per update.

        An update goes as a full-chunk replace when it is one, when ``nxt`` is syncing or when ``nxt`` said it
        misses an update of that chunk (``full_keys``); ``no_forward``: ``nxt`` stores it only, passes nothing on
        (a repair's or a sync's copy for that one replica). They go in one call, or in calls at once within what
        ``nxt`` takes in one (``max_batch_bytes``, ``max_batch_ios``): whole chunks sent for a few pages each (a
        batch's writes to one chunk, chunks a successor misses) can weigh far more than the client's batch did.

        Raises:
            RpcError, OSError, ConnectionError, DataPathError: a call failed (once every call has ended).
        """
        syncing = Public(nxt.public_state) is Public.SYNCING
        fulls = [u.full or syncing or u.key in full_keys for u in updates]
        payloads: list[Payload] = [
            (u.content or b"") if full else u.data for u, full in zip(updates, fulls, strict=True)
        ]
        kinds = [
            u.kind if not full or u.kind is UpdateKind.REMOVE else UpdateKind.WRITE
            for u, full in zip(updates, fulls, strict=True)
        ]
        items = list(zip(updates, fulls, payloads, kinds, strict=True))
        config = self.state.config
        parts = _parts(
            [len(p) if k is UpdateKind.WRITE else 0 for p, k in zip(payloads, kinds, strict=True)],
            config.max_batch_bytes,
            config.max_batch_ios,
        )
        if len(parts) == 1:  # the usual case: one call, awaited here (no task to start, no loop turn for it)
            return await self._send_part(chain, nxt, items, from_target, no_forward)
        answers = await asyncio.gather(
            *(self._send_part(chain, nxt, [items[i] for i in part], from_target, no_forward) for part in parts),
            return_exceptions=True,
        )
        out: list[UpdateResult] = []
        for got in answers:
            if isinstance(got, BaseException):  # after every call ended: none still in flight when the caller retries
                raise got
            out += got
        return out

    async def _send_part(
        self,
        chain: Chain,
        nxt: Target,
        items: list[tuple[Update, bool, Payload, UpdateKind]],
        from_target: int,
        no_forward: bool,
    ) -> list[UpdateResult]:
        """One ForwardUpdates call of ``items`` (update, sent whole, payload, kind as sent); its answers."""
        node = self.state.view.node(nxt.node_id) if self.state.view else None
        sent = [p for _, _, p, k in items if k is UpdateKind.WRITE]
        wire = WriteBytes.for_payloads(sent, node.data if node is not None else "")
        msgs: list[ChunkUpdate] = []
        for u, full, payload, kind in items:
            records: Sequence[UpdateRecord] = u.records or ()  # a merged run's span carries the chunk's records
            if full and u.records is None:
                records = self._records(from_target, u.key)
            place = wire.place(payload) if kind is UpdateKind.WRITE else None
            msgs.append(
                ChunkUpdate(
                    chain_id=chain.chain_id,
                    chain_version=u.chain_version if no_forward else chain.version,
                    key=u.key,
                    kind=kind,
                    version=u.version,
                    chunk_size=u.chunk_size,
                    offset=0 if full else u.offset,
                    length=len(payload) if kind is UpdateKind.WRITE else u.length,
                    checksum=_payload_checksum(u, payload),
                    data=payload if kind is UpdateKind.WRITE and place is None else None,
                    transfer=None if place is None else TransferRef(place.transfer_id, place.offset_bytes),
                    full=full,
                    no_forward=no_forward,
                    update_id=u.update_id,
                    records=tuple(records),
                )
            )
        request = forward_request_pb(from_target, msgs)
        if node is not None and wire.transport.on_data_path:
            # one round trip on the data path: the request and its bytes together, no gRPC call
            async with asyncio.timeout(self.state.config.forward_timeout_s):
                raw = await self.data.call(
                    node.data, "ForwardUpdates", request.SerializeToString(), wire.transfer_id, wire.parts
                )
            try:
                return forward_answers_from_pb(parse_message(spb.ForwardUpdatesResponse, raw))
            except DecodeError as exc:
                raise DataPathError(f"the successor's answer does not parse: {exc}") from None
        return forward_answers_from_pb(await self.client(nxt.node_id).forward_updates(request))

    def _records(self, target_id: int, key: ChunkKey) -> list[UpdateRecord]:
        return self.state.targets[target_id].engine.recent_updates(key)

    async def read_inline(self, node_id: int, io: ReadIO) -> ReadResult:
        """One read from ``node_id``, its bytes inline (recovery's read of a good copy)."""
        request = spb.BatchReadRequest(ios=[read_io_pb(io)], transport=spb.DATA_TRANSPORT_INLINE)
        response = await self.client(node_id).batch_read(request)
        return read_result_from_pb(response.results[0])

    async def repair_chunks(self, node_id: int, request: RepairRequest) -> None:
        """Ask ``node_id``, the head of the request's chain, to repair the chunks (RepairChunks)."""
        await self.client(node_id).repair_chunks(repair_pb(request))

    async def chunk_metas(self, chain: Chain, nxt: Target, timeout_s: float) -> dict[ChunkKey, ChunkMeta]:
        """Every chunk's metadata on ``nxt`` (a syncing target of ``chain``), from its dump (DumpChunkMeta)."""
        request = spb.DumpChunkMetaRequest(
            chain_id=chain.chain_id, chain_version=chain.version, target_id=nxt.target_id
        )
        metas: dict[ChunkKey, ChunkMeta] = {}
        async for batch in self.client(nxt.node_id).dump_chunk_meta(request, timeout_s=timeout_s):
            for m in batch.chunks:
                meta = chunk_meta_from_pb(m)
                metas[meta.key] = meta
        return metas

    async def complete_sync(self, chain: Chain, nxt: Target) -> None:
        """Tell ``nxt`` (a syncing target of ``chain``) that it holds everything now (CompleteSync)."""
        request = spb.CompleteSyncRequest(chain_id=chain.chain_id, chain_version=chain.version, target_id=nxt.target_id)
        await self.client(nxt.node_id).complete_sync(request)


def _payload_checksum(u: Update, payload: Payload) -> int:
    """CRC of what is forwarded, reusing one already computed over the very same object."""
    if payload is u.data and u.data_checksum is not None:
        return u.data_checksum
    if payload is u.content and u.content_checksum is not None:
        return u.content_checksum
    return crc32c_of(payload)


def _parts(sizes: list[int], max_bytes: int, max_count: int) -> list[list[int]]:
    """Indexes of ``sizes`` in order, in runs of at most ``max_count`` whose sizes add up to at most ``max_bytes``.

    A run holds one item at least (one over ``max_bytes`` goes alone: the successor refuses it as it would anyway).
    """
    parts: list[list[int]] = [[]]
    total = 0
    for i, size in enumerate(sizes):
        if parts[-1] and (total + size > max_bytes or len(parts[-1]) >= max_count):
            parts.append([])
            total = 0
        parts[-1].append(i)
        total += size
    return parts
