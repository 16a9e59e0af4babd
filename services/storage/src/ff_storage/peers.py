"""The other storage nodes as this one calls them: typed gRPC clients, data-path connections, and the forward wire.

The forward wire is updates sent to a successor, the way ``ff_fsprotocol.transport`` chooses for every write-side
call: one data-path round trip (bytes inline or beside the request), or gRPC when the successor has no data endpoint.
"""

from __future__ import annotations

import asyncio

from ff_fsprotocol.checksum import crc32c_of
from ff_fsprotocol.datapath import DataConnectionPool, parse_message
from ff_fsprotocol.routing import Chain, Target
from ff_fsprotocol.transport import WriteBytes
from ff_rpc import RpcClient
from ff_rpc.client import NO_RETRY, ClientPool
from ff_storage.core.chunks import ChunkKey
from ff_storage.core.results import UpdateResult
from ff_storage.core.target_role import Public
from ff_storage.node_state import NodeState, Payload, Update
from ff_storage.wire import record_pb, update_result_from_pb
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
        """Send ``updates`` of ``from_target`` to its successor ``nxt`` in one call; its answers, one per update.

        An update goes as a full-chunk replace when it is one, when ``nxt`` is syncing or when ``nxt`` said it
        misses an update of that chunk (``full_keys``); ``no_forward``: ``nxt`` stores it only, passes nothing on
        (a repair's or a sync's copy for that one replica).
        """
        syncing = Public(nxt.public_state) is Public.SYNCING
        msgs: list[spb.ChunkUpdate] = []
        fulls = [u.full or syncing or u.key in full_keys for u in updates]
        payloads: list[Payload] = [
            (u.content or b"") if full else u.data for u, full in zip(updates, fulls, strict=True)
        ]
        kinds = [
            u.kind if not full or u.kind == spb.UPDATE_TYPE_REMOVE else spb.UPDATE_TYPE_WRITE
            for u, full in zip(updates, fulls, strict=True)
        ]
        node = self.state.view.node(nxt.node_id) if self.state.view else None
        sent = [p for p, k in zip(payloads, kinds, strict=True) if k == spb.UPDATE_TYPE_WRITE]
        wire = WriteBytes.for_payloads(sent, node.data if node is not None else "")
        for u, full, payload, kind in zip(updates, fulls, payloads, kinds, strict=True):
            msg = spb.ChunkUpdate(
                chain_id=chain.chain_id,
                chain_version=u.chain_version if no_forward else chain.version,
                chunk_id=spb.ChunkId(inode_id=u.key[0], chunk_index=u.key[1]),
                update_type=spb.UpdateType.ValueType(kind),
                update_version=u.version,
                chunk_size_bytes=u.chunk_size,
                offset_bytes=0 if full else u.offset,
                length_bytes=len(payload) if kind == spb.UPDATE_TYPE_WRITE else u.length,
                checksum=spb.Checksum(type=spb.CHECKSUM_TYPE_CRC32C, value=_payload_checksum(u, payload)),
                full_chunk_replace=full,
                no_forward=no_forward,
            )
            if u.update_id is not None:
                msg.update_id.CopyFrom(spb.UpdateId(client_id=u.update_id[0], request_id=u.update_id[1]))
            if full:
                records = u.records
                if records is None:
                    records = self.state.targets[from_target].engine.recent_updates(u.key)
                msg.recent_updates.extend(record_pb(r) for r in records)
            if kind == spb.UPDATE_TYPE_WRITE:
                place = wire.place(payload)
                if place is not None:
                    msg.transfer.CopyFrom(
                        spb.TransferRef(transfer_id=place.transfer_id, offset_bytes=place.offset_bytes)
                    )
                else:
                    msg.inline_data = bytes(payload)
            msgs.append(msg)
        request = spb.ForwardUpdatesRequest(from_target_id=from_target, updates=msgs)
        if node is not None and wire.transport.on_data_path:
            # one round trip on the data path: the request and its bytes together, no gRPC call
            async with asyncio.timeout(self.state.config.forward_timeout_s):
                raw = await self.data.call(
                    node.data, "ForwardUpdates", request.SerializeToString(), wire.transfer_id, wire.parts
                )
            return [update_result_from_pb(r) for r in parse_message(spb.ForwardUpdatesResponse, raw).results]
        resp = await self.client(nxt.node_id).forward_updates(request)
        return [update_result_from_pb(r) for r in resp.results]


def _payload_checksum(u: Update, payload: Payload) -> int:
    """CRC of what is forwarded, reusing one already computed over the very same object."""
    if payload is u.data and u.data_checksum is not None:
        return u.data_checksum
    if payload is u.content and u.content_checksum is not None:
        return u.content_checksum
    return crc32c_of(payload)
