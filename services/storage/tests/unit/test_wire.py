"""The node's own types against the wire's (``ff_storage.wire``): enum values match the proto's, each type goes to
the wire and back unchanged, a missing update id reads as None, and what the node's types cannot hold (an unknown
update kind, a remembered update without an id) is refused with the node's message."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ff_storage.core.chunks import ChunkMeta, UpdateRecord
from ff_storage.core.errors import InvalidRequest
from ff_storage.core.requests import (
    ChunkUpdate,
    LastChunkQuery,
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
from ff_storage.wire import (
    chunk_meta_from_pb,
    chunk_meta_pb,
    chunk_update_from_pb,
    chunk_update_pb,
    chunk_updates_from_pb,
    forward_request_pb,
    last_chunk_query_from_pb,
    read_io_from_pb,
    read_io_pb,
    read_response_pb,
    read_result_from_pb,
    record_from_pb,
    record_pb,
    remove_from_pb,
    repair_from_pb,
    repair_pb,
    truncate_io_from_pb,
    update_result_from_pb,
    update_result_pb,
    write_io_from_pb,
)
from ff_storage.writes import _transferred
from fireflyer.storage.v1 import storage_pb2 as spb

RECORD = UpdateRecord(update_id=(b"client", 7), version=3, length=10, checksum=0xABCD, committed_at_ms=1_700_000)


def _update(**kw: Any) -> ChunkUpdate:
    fields: dict[str, Any] = {
        "chain_id": 4,
        "chain_version": 9,
        "key": (12, 3),
        "kind": UpdateKind.WRITE,
        "version": 5,
        "chunk_size": 4096,
        "offset": 100,
        "length": 6,
        "checksum": 0x1234,
        "data": b"abcdef",
        "update_id": (b"c" * 16, 42),
    }
    return ChunkUpdate(**{**fields, **kw})


def _through_bytes(m: Any) -> Any:
    """``m`` serialized and parsed again, as the other side gets it."""
    return type(m).FromString(m.SerializeToString())


def test_io_status_is_the_protos_chunk_io_status() -> None:
    proto = {name.removeprefix("CHUNK_IO_STATUS_"): value for name, value in spb.ChunkIoStatus.items()}
    assert proto == {s.name: s.value for s in IoStatus}


def test_update_kind_is_the_protos_update_type() -> None:
    proto = {name.removeprefix("UPDATE_TYPE_"): value for name, value in spb.UpdateType.items()}
    assert proto == {"UNSPECIFIED": 0, **{k.name: k.value for k in UpdateKind}}


def test_a_result_crosses_the_wire_unchanged() -> None:
    for r in (
        UpdateResult(IoStatus.OK, "", 7, 4096, 0xDEADBEEF),
        UpdateResult(IoStatus.MISSING_UPDATE, "gap", 3),
        UpdateResult(IoStatus.OK, "checksum zero", 1, 0, 0),
    ):
        assert update_result_from_pb(_through_bytes(update_result_pb(r))) == r
    unknown = spb.UpdateResult(status=99, message="from a newer node")  # type: ignore[arg-type]
    assert update_result_from_pb(unknown).status is IoStatus.UNSPECIFIED  # not OK: the sender retries


@pytest.mark.parametrize(
    "update",
    [
        _update(),
        _update(update_id=None),  # no id: none on the wire, None back
        _update(data=b"", length=0),  # an empty inline write is inline data, not "no data"
        _update(data=None, transfer=TransferRef("t-1", 4096)),
        _update(data=None, transfer=TransferRef("", 0)),  # the data path's own call: offsets only
        _update(kind=UpdateKind.TRUNCATE, data=None, length=17, offset=0),
        _update(kind=UpdateKind.REMOVE, data=None, chunk_size=0, length=0, offset=0, update_id=None),
        _update(full=True, no_forward=True, offset=0, records=(RECORD, RECORD)),
    ],
    ids=["write", "no-id", "empty-inline", "transfer", "transfer-at-0", "truncate", "remove", "full-with-records"],
)
def test_a_chunk_update_crosses_the_wire_unchanged(update: ChunkUpdate) -> None:
    request = _through_bytes(forward_request_pb(8, [update, update]))
    assert request.from_target_id == 8
    assert chunk_updates_from_pb(request) == [update, update]


def test_a_chunk_updates_view_goes_inline_as_its_bytes() -> None:
    buffer = bytearray(b"..payload..")
    m = chunk_update_pb(_update(data=memoryview(buffer)[2:9], length=7))
    assert m.inline_data == b"payload"


@pytest.mark.parametrize(
    ("update_type", "n", "message"),
    [
        (spb.UPDATE_TYPE_UNSPECIFIED, 0, "updates[0]: update_type 0 is not a write, truncate or remove"),
        (99, 3, "updates[3]: update_type 99 is not a write, truncate or remove"),
    ],
)
def test_an_unknown_update_kind_is_refused_as_the_node_did(update_type: int, n: int, message: str) -> None:
    m = chunk_update_pb(_update())
    m.update_type = update_type  # type: ignore[assignment]
    with pytest.raises(InvalidRequest) as err:
        chunk_update_from_pb(n, m)
    assert str(err.value) == message


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (spb.UpdateRecord(version=1), "recent_updates: a record without an update id"),
        (
            spb.UpdateRecord(update_id=spb.UpdateId(client_id=b"c", request_id=0), version=1),
            "recent_updates: update_id.request_id must be positive",
        ),
    ],
)
def test_a_remembered_update_without_a_good_id_is_refused(record: spb.UpdateRecord, message: str) -> None:
    m = chunk_update_pb(_update(full=True))
    m.recent_updates.append(record)
    with pytest.raises(InvalidRequest) as err:
        chunk_update_from_pb(0, m)
    assert str(err.value) == message


def test_a_record_crosses_the_wire_unchanged() -> None:
    assert record_from_pb(_through_bytes(record_pb(RECORD))) == RECORD


# what the node receives only: each field where the node expects it; an update id as sent (the node checks it)
FROM_WIRE: list[tuple[str, Callable[[], Any], Callable[[Any], Any], Any]] = [
    (
        "write, inline",
        lambda: spb.WriteIO(
            chain_id=1,
            chain_version=2,
            chunk_id=spb.ChunkId(inode_id=3, chunk_index=4),
            chunk_size_bytes=4096,
            offset_bytes=5,
            length_bytes=3,
            checksum=spb.Checksum(type=spb.CHECKSUM_TYPE_CRC32C, value=77),
            inline_data=b"abc",
            io_capability=b"cap",
            update_id=spb.UpdateId(client_id=b"c", request_id=6),
        ),
        write_io_from_pb,
        WriteIO(
            chain_id=1,
            chain_version=2,
            key=(3, 4),
            chunk_size=4096,
            offset=5,
            length=3,
            checksum=77,
            data=b"abc",
            update_id=(b"c", 6),
        ),
    ),
    (
        "write, transfer, no update id",
        lambda: spb.WriteIO(chain_id=1, length_bytes=9, transfer=spb.TransferRef(transfer_id="x", offset_bytes=64)),
        write_io_from_pb,
        WriteIO(
            chain_id=1, chain_version=0, key=(0, 0), chunk_size=0, offset=0, length=9, checksum=0,
            transfer=TransferRef("x", 64),
        ),
    ),
    (
        "write, no data",
        lambda: spb.WriteIO(chain_id=1, length_bytes=9),
        write_io_from_pb,
        WriteIO(chain_id=1, chain_version=0, key=(0, 0), chunk_size=0, offset=0, length=9, checksum=0),
    ),
    (
        "write, half an update id (the node refuses it with its message)",
        lambda: spb.WriteIO(update_id=spb.UpdateId(request_id=6)),
        lambda m: write_io_from_pb(m).update_id,
        (b"", 6),
    ),
    (
        "truncate",
        lambda: spb.TruncateIO(
            chain_id=1, chain_version=2, chunk_id=spb.ChunkId(inode_id=3, chunk_index=4), chunk_size_bytes=64,
            length_bytes=10, update_id=spb.UpdateId(client_id=b"c", request_id=1),
        ),
        truncate_io_from_pb,
        TruncateIO(chain_id=1, chain_version=2, key=(3, 4), chunk_size=64, length=10, update_id=(b"c", 1)),
    ),
    (
        "truncate, no update id",
        lambda: spb.TruncateIO(chain_id=1),
        lambda m: truncate_io_from_pb(m).update_id,
        None,
    ),
    (
        "remove",
        lambda: spb.RemoveChunksRequest(
            chain_id=1, chain_version=2, inode_id=3, begin_chunk_index=4, end_chunk_index=5, max_chunks=6
        ),
        remove_from_pb,
        RemoveRequest(chain_id=1, chain_version=2, inode_id=3, begin_index=4, end_index=5, max_chunks=6),
    ),
    (
        "last chunk query",
        lambda: spb.LastChunkQuery(chain_id=1, chain_version=2, inode_id=3, begin_chunk_index=4, end_chunk_index=5),
        last_chunk_query_from_pb,
        LastChunkQuery(chain_id=1, chain_version=2, inode_id=3, begin_index=4, end_index=5),
    ),
]  # fmt: skip


@pytest.mark.parametrize(("build", "convert", "expected"), [c[1:] for c in FROM_WIRE], ids=[c[0] for c in FROM_WIRE])
def test_what_the_node_receives(build: Callable[[], Any], convert: Callable[[Any], Any], expected: Any) -> None:
    assert convert(_through_bytes(build())) == expected


ROUND_TRIPS: list[tuple[str, Any, Callable[[Any], Any], Callable[[Any], Any]]] = [
    ("read", ReadIO(chain_id=1, chain_version=2, key=(3, 4), offset=5, length=6, relaxed=True), read_io_pb,
     read_io_from_pb),
    ("repair", RepairRequest(chain_id=1, chain_version=2, keys=((3, 4), (3, 5))), repair_pb, repair_from_pb),
    (
        "chunk meta",
        ChunkMeta(
            inode_id=3, chunk_index=4, chain_version=2, committed_version=7, length=10, checksum=0, pending_version=8
        ),
        chunk_meta_pb,
        chunk_meta_from_pb,
    ),
]  # fmt: skip


@pytest.mark.parametrize(("value", "to_pb", "from_pb"), [c[1:] for c in ROUND_TRIPS], ids=[c[0] for c in ROUND_TRIPS])
def test_a_request_crosses_the_wire_unchanged(
    value: Any, to_pb: Callable[[Any], Any], from_pb: Callable[[Any], Any]
) -> None:
    assert from_pb(_through_bytes(to_pb(value))) == value


def test_read_results_cross_the_wire_unchanged_with_the_batchs_transfer_id() -> None:
    results = [
        ReadResult(status=IoStatus.OK, length=3, version=2, is_pending=True, checksum=0, inline_data=b"abc"),
        ReadResult(status=IoStatus.OK, length=5, version=1, checksum=99, transfer_offset=0),
        ReadResult(status=IoStatus.OK, length=5, version=1, checksum=98, transfer_offset=5),
        ReadResult(status=IoStatus.PENDING_VERSION, message="version 3 is pending"),
    ]
    m = _through_bytes(read_response_pb(results, transfer_id="t-9", transfer_length=10, transfer_ttl_s=30.0))
    assert [read_result_from_pb(r) for r in m.results] == results
    assert [r.transfer.transfer_id for r in m.results[1:3]] == ["t-9", "t-9"]
    assert (m.transfer_id, m.transfer_length_bytes, m.transfer_ttl_s) == ("t-9", 10, 30.0)
    assert not m.results[3].HasField("checksum") and m.results[3].WhichOneof("data") is None


def test_transferred_bytes_are_a_view_of_the_received_buffer() -> None:
    """No copy on the way in: the node's payload is a view into the buffer the call's bytes arrived in."""
    blob = bytearray(b"0123456789")
    view = _transferred(blob, TransferRef("t", 2), 5)
    assert view is not None and view.obj is blob and bytes(view) == b"23456"
    assert _transferred(blob, TransferRef("t", 8), 5) is None  # short
    assert _transferred(None, TransferRef("t", 0), 1) is None  # never came
