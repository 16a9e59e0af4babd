"""The storage protocol's messages to and from the node's own types, at the edges (servicer, peers)."""

from __future__ import annotations

from ff_storage.core.chunks import UpdateRecord, check_update_id
from ff_storage.core.errors import InvalidRequest
from ff_storage.core.results import IoStatus, UpdateResult
from fireflyer.storage.v1 import storage_pb2 as spb


def update_result_pb(r: UpdateResult) -> spb.UpdateResult:
    """An update's result for the wire (the chunk checksum only when known)."""
    m = spb.UpdateResult(
        status=spb.ChunkIoStatus.ValueType(int(r.status)),
        message=r.message,
        committed_version=r.committed_version,
        chunk_length_bytes=r.chunk_length,
    )
    if r.chunk_checksum is not None:
        m.chunk_checksum.CopyFrom(spb.Checksum(type=spb.CHECKSUM_TYPE_CRC32C, value=r.chunk_checksum))
    return m


def update_result_from_pb(m: spb.UpdateResult) -> UpdateResult:
    """A successor's answer; a status this node does not know reads as UNSPECIFIED (not OK: it is retried)."""
    try:
        status = IoStatus(m.status)
    except ValueError:
        status = IoStatus.UNSPECIFIED
    return UpdateResult(
        status=status,
        message=m.message,
        committed_version=m.committed_version,
        chunk_length=m.chunk_length_bytes,
        chunk_checksum=m.chunk_checksum.value if m.HasField("chunk_checksum") else None,
    )


def record_pb(r: UpdateRecord) -> spb.UpdateRecord:
    """A remembered update for the wire (carried with a full-chunk replace)."""
    return spb.UpdateRecord(
        update_id=spb.UpdateId(client_id=r.update_id[0], request_id=r.update_id[1]),
        version=r.version,
        chunk_length_bytes=r.length,
        chunk_checksum=spb.Checksum(type=spb.CHECKSUM_TYPE_CRC32C, value=r.checksum),
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
