"""The storage protocol's messages to and from the node's own types, at the edges (servicer, peers).

Every conversion between ``storage_pb2`` and the node's types is here; below the servicer and peers the node
sees only ``core`` types. A conversion copies no chunk bytes it does not have to: a memoryview into a data-path
call's buffer goes into the node's types as it is, and a ``bytes`` payload into a message as it is (only a view
going inline into a message is copied, since protobuf takes ``bytes`` only). It checks only what the node's
types cannot hold (an unknown update kind, a remembered update without an id), with the messages the node
used before; the rest of the checks are the node's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ff_storage.core.chunks import ChunkKey, ChunkMeta, UpdateKey, UpdateRecord, check_update_id
from ff_storage.core.errors import InvalidRequest
from ff_storage.core.requests import (
    ChunkUpdate,
    LastChunkQuery,
    LastChunkResult,
    ReadIO,
    ReadResult,
    RemoveRequest,
    RepairRequest,
    TransferRef,
    TruncateIO,
    UpdateKind,
    WriteIO,
)
from ff_storage.core.results import IoStatus, UpdateResult
from fireflyer.storage.v1 import storage_pb2 as spb

_CRC32C = spb.CHECKSUM_TYPE_CRC32C
_KINDS = {int(k): k for k in UpdateKind}


# ---- shared pieces ----


def _status(value: int) -> IoStatus:
    """A status from another node; one this node does not know reads as UNSPECIFIED (not OK: it is retried)."""
    try:
        return IoStatus(value)
    except ValueError:
        return IoStatus.UNSPECIFIED


def _key(m: spb.ChunkId) -> ChunkKey:
    return (m.inode_id, m.chunk_index)


def _chunk_id(key: ChunkKey) -> spb.ChunkId:
    return spb.ChunkId(inode_id=key[0], chunk_index=key[1])


def _claimed_id(m: spb.UpdateId) -> UpdateKey | None:
    """The update id as sent (checked by the node); None when unset (empty client id and request id 0)."""
    client_id, request_id = m.client_id, m.request_id
    return None if not client_id and not request_id else (client_id, request_id)


def _update_id(key: UpdateKey) -> spb.UpdateId:
    return spb.UpdateId(client_id=key[0], request_id=key[1])


def _transfer(m: spb.TransferRef) -> TransferRef:
    return TransferRef(m.transfer_id, m.offset_bytes)


# ---- update results and remembered updates ----


def update_result_pb(r: UpdateResult) -> spb.UpdateResult:
    """An update's result for the wire (the chunk checksum only when known)."""
    m = spb.UpdateResult(
        status=spb.ChunkIoStatus.ValueType(int(r.status)),
        message=r.message,
        committed_version=r.committed_version,
        chunk_length_bytes=r.chunk_length,
    )
    if r.chunk_checksum is not None:
        m.chunk_checksum.CopyFrom(spb.Checksum(type=_CRC32C, value=r.chunk_checksum))
    return m


def update_results_pb(results: Iterable[UpdateResult]) -> list[spb.UpdateResult]:
    """Each result for the wire, in order."""
    return [update_result_pb(r) for r in results]


def update_result_from_pb(m: spb.UpdateResult) -> UpdateResult:
    """A successor's answer; a status this node does not know reads as UNSPECIFIED (not OK: it is retried)."""
    return UpdateResult(
        status=_status(m.status),
        message=m.message,
        committed_version=m.committed_version,
        chunk_length=m.chunk_length_bytes,
        chunk_checksum=m.chunk_checksum.value if m.HasField("chunk_checksum") else None,
    )


def record_pb(r: UpdateRecord) -> spb.UpdateRecord:
    """A remembered update for the wire (carried with a full-chunk replace)."""
    return spb.UpdateRecord(
        update_id=_update_id(r.update_id),
        version=r.version,
        chunk_length_bytes=r.length,
        chunk_checksum=spb.Checksum(type=_CRC32C, value=r.checksum),
        committed_at_ms=r.committed_at_ms,
    )


def record_from_pb(m: spb.UpdateRecord) -> UpdateRecord:
    """A remembered update a predecessor sent; InvalidRequest when its id is missing or malformed."""
    got = check_update_id("recent_updates", m.update_id.client_id, m.update_id.request_id)
    if got is None:
        raise InvalidRequest("recent_updates: a record without an update id")
    return UpdateRecord(
        update_id=got,
        version=m.version,
        length=m.chunk_length_bytes,
        checksum=m.chunk_checksum.value,
        committed_at_ms=m.committed_at_ms,
    )


# ---- writes at the head ----


def write_io_from_pb(m: spb.WriteIO) -> WriteIO:
    """A BatchWrite IO (its IoCapability is the servicer's to check, before)."""
    which = m.WhichOneof("data")
    return WriteIO(
        chain_id=m.chain_id,
        chain_version=m.chain_version,
        key=_key(m.chunk_id),
        chunk_size=m.chunk_size_bytes,
        offset=m.offset_bytes,
        length=m.length_bytes,
        checksum=m.checksum.value,
        data=m.inline_data if which == "inline_data" else None,
        transfer=_transfer(m.transfer) if which == "transfer" else None,
        update_id=_claimed_id(m.update_id),
    )


def truncate_io_from_pb(m: spb.TruncateIO) -> TruncateIO:
    """A TruncateChunks IO."""
    return TruncateIO(
        chain_id=m.chain_id,
        chain_version=m.chain_version,
        key=_key(m.chunk_id),
        chunk_size=m.chunk_size_bytes,
        length=m.length_bytes,
        update_id=_claimed_id(m.update_id),
    )


def remove_from_pb(m: spb.RemoveChunksRequest) -> RemoveRequest:
    """A RemoveChunks request."""
    return RemoveRequest(
        chain_id=m.chain_id,
        chain_version=m.chain_version,
        inode_id=m.inode_id,
        begin_index=m.begin_chunk_index,
        end_index=m.end_chunk_index,
        max_chunks=m.max_chunks,
    )


# ---- the forward wire ----


def chunk_update_from_pb(n: int, m: spb.ChunkUpdate) -> ChunkUpdate:
    """The ``n``-th update of a ForwardUpdates.

    Raises:
        InvalidRequest: its update type is not a write, truncate or remove, or a remembered update has no id
            (or a malformed one).
    """
    kind = _KINDS.get(m.update_type)
    if kind is None:
        raise InvalidRequest(f"updates[{n}]: update_type {m.update_type} is not a write, truncate or remove")
    which = m.WhichOneof("data")
    return ChunkUpdate(
        chain_id=m.chain_id,
        chain_version=m.chain_version,
        key=_key(m.chunk_id),
        kind=kind,
        version=m.update_version,
        chunk_size=m.chunk_size_bytes,
        offset=m.offset_bytes,
        length=m.length_bytes,
        checksum=m.checksum.value,
        data=m.inline_data if which == "inline_data" else None,
        transfer=_transfer(m.transfer) if which == "transfer" else None,
        full=m.full_chunk_replace,
        no_forward=m.no_forward,
        update_id=_claimed_id(m.update_id),
        records=tuple(record_from_pb(r) for r in m.recent_updates),
    )


def chunk_updates_from_pb(m: spb.ForwardUpdatesRequest) -> list[ChunkUpdate]:
    """A ForwardUpdates request's updates, in order (see ``chunk_update_from_pb``)."""
    return [chunk_update_from_pb(n, u) for n, u in enumerate(m.updates)]


def chunk_update_pb(u: ChunkUpdate) -> spb.ChunkUpdate:
    """An update for the successor; inline data that is a view is copied into the message (protobuf takes bytes)."""
    m = spb.ChunkUpdate(
        chain_id=u.chain_id,
        chain_version=u.chain_version,
        chunk_id=_chunk_id(u.key),
        update_type=spb.UpdateType.ValueType(int(u.kind)),
        update_version=u.version,
        chunk_size_bytes=u.chunk_size,
        offset_bytes=u.offset,
        length_bytes=u.length,
        checksum=spb.Checksum(type=_CRC32C, value=u.checksum),
        full_chunk_replace=u.full,
        no_forward=u.no_forward,
        recent_updates=[record_pb(r) for r in u.records],
    )
    if u.update_id is not None:
        m.update_id.CopyFrom(_update_id(u.update_id))
    if u.transfer is not None:
        m.transfer.CopyFrom(spb.TransferRef(transfer_id=u.transfer.transfer_id, offset_bytes=u.transfer.offset))
    elif u.data is not None:
        m.inline_data = bytes(u.data)  # the very object when it is bytes already
    return m


def forward_request_pb(from_target: int, updates: Iterable[ChunkUpdate]) -> spb.ForwardUpdatesRequest:
    """A ForwardUpdates request of ``from_target`` (the predecessor)."""
    return spb.ForwardUpdatesRequest(from_target_id=from_target, updates=[chunk_update_pb(u) for u in updates])


def forward_answers_from_pb(m: spb.ForwardUpdatesResponse) -> list[UpdateResult]:
    """A successor's answers to ForwardUpdates, one per update."""
    return [update_result_from_pb(r) for r in m.results]


# ---- reads ----


def read_io_from_pb(m: spb.ReadIO) -> ReadIO:
    """A BatchRead IO (its IoCapability is the servicer's to check, before)."""
    return ReadIO(
        chain_id=m.chain_id,
        chain_version=m.chain_version,
        key=_key(m.chunk_id),
        offset=m.offset_bytes,
        length=m.length_bytes,
        relaxed=m.relaxed,
    )


def read_ios_from_pb(ios: Iterable[spb.ReadIO]) -> list[ReadIO]:
    """Each IO of a BatchRead, in order."""
    return [read_io_from_pb(m) for m in ios]


def read_io_pb(io: ReadIO) -> spb.ReadIO:
    """A read for another node (recovery's read of a good copy)."""
    return spb.ReadIO(
        chain_id=io.chain_id,
        chain_version=io.chain_version,
        chunk_id=_chunk_id(io.key),
        offset_bytes=io.offset,
        length_bytes=io.length,
        relaxed=io.relaxed,
    )


def _fill_read_result(m: spb.ReadResult, r: ReadResult, transfer_id: str) -> None:
    m.status = spb.ChunkIoStatus.ValueType(int(r.status))
    m.message, m.length_bytes, m.version, m.is_pending = r.message, r.length, r.version, r.is_pending
    if r.checksum is not None:
        m.checksum.type, m.checksum.value = _CRC32C, r.checksum
    if r.transfer_offset is not None:
        m.transfer.transfer_id, m.transfer.offset_bytes = transfer_id, r.transfer_offset
    elif r.inline_data is not None:
        m.inline_data = r.inline_data


def read_response_pb(
    results: Sequence[ReadResult], *, transfer_id: str = "", transfer_length: int = 0, transfer_ttl_s: float = 0.0
) -> spb.BatchReadResponse:
    """A BatchRead's answer: each result, built in place (inline bytes are copied into the message once)."""
    m = spb.BatchReadResponse(
        transfer_id=transfer_id, transfer_length_bytes=transfer_length, transfer_ttl_s=transfer_ttl_s
    )
    for r in results:
        _fill_read_result(m.results.add(), r, transfer_id)
    return m


def read_result_from_pb(m: spb.ReadResult) -> ReadResult:
    """Another node's answer to one read."""
    which = m.WhichOneof("data")
    return ReadResult(
        status=_status(m.status),
        message=m.message,
        length=m.length_bytes,
        version=m.version,
        is_pending=m.is_pending,
        checksum=m.checksum.value if m.HasField("checksum") else None,
        inline_data=m.inline_data if which == "inline_data" else None,
        transfer_offset=m.transfer.offset_bytes if which == "transfer" else None,
    )


def last_chunk_query_from_pb(m: spb.LastChunkQuery) -> LastChunkQuery:
    """A QueryLastChunk query."""
    return LastChunkQuery(
        chain_id=m.chain_id,
        chain_version=m.chain_version,
        inode_id=m.inode_id,
        begin_index=m.begin_chunk_index,
        end_index=m.end_chunk_index,
    )


def last_chunk_result_pb(r: LastChunkResult) -> spb.LastChunkResult:
    """A QueryLastChunk answer."""
    return spb.LastChunkResult(
        status=spb.ChunkIoStatus.ValueType(int(r.status)),
        last_chunk_index=r.last_index,
        last_chunk_length_bytes=r.last_length,
        num_chunks=r.num_chunks,
    )


# ---- recovery and repair ----


def repair_from_pb(m: spb.RepairChunksRequest) -> RepairRequest:
    """A RepairChunks request (its chunk ids as sent: the head checks them)."""
    return RepairRequest(chain_id=m.chain_id, chain_version=m.chain_version, keys=tuple(_key(c) for c in m.chunk_ids))


def repair_pb(r: RepairRequest) -> spb.RepairChunksRequest:
    """A RepairChunks request for a chain's head."""
    return spb.RepairChunksRequest(
        chain_id=r.chain_id, chain_version=r.chain_version, chunk_ids=[_chunk_id(k) for k in r.keys]
    )


def chunk_meta_pb(meta: ChunkMeta) -> spb.ChunkMeta:
    """A chunk's metadata for a recovery dump."""
    return spb.ChunkMeta(
        chunk_id=_chunk_id(meta.key),
        chain_version=meta.chain_version,
        committed_version=meta.committed_version,
        pending_version=meta.pending_version,
        length_bytes=meta.length,
        checksum=spb.Checksum(type=_CRC32C, value=meta.checksum),
    )


def chunk_meta_from_pb(m: spb.ChunkMeta) -> ChunkMeta:
    """A chunk's metadata from a syncing target's dump."""
    return ChunkMeta(
        inode_id=m.chunk_id.inode_id,
        chunk_index=m.chunk_id.chunk_index,
        chain_version=m.chain_version,
        committed_version=m.committed_version,
        length=m.length_bytes,
        checksum=m.checksum.value,
        pending_version=m.pending_version,
    )
