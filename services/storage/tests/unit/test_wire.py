"""The node's own result type against the wire's: the status values match the proto's enum, and a result goes
to the wire and back unchanged."""

from __future__ import annotations

from ff_storage.core.results import IoStatus, UpdateResult
from ff_storage.wire import update_result_from_pb, update_result_pb
from fireflyer.storage.v1 import storage_pb2 as spb


def test_io_status_is_the_protos_chunk_io_status() -> None:
    proto = {name.removeprefix("CHUNK_IO_STATUS_"): value for name, value in spb.ChunkIoStatus.items()}
    assert proto == {s.name: s.value for s in IoStatus}


def test_a_result_crosses_the_wire_unchanged() -> None:
    for r in (
        UpdateResult(IoStatus.OK, "", 7, 4096, 0xDEADBEEF),
        UpdateResult(IoStatus.MISSING_UPDATE, "gap", 3),
        UpdateResult(IoStatus.OK, "checksum zero", 1, 0, 0),
    ):
        assert update_result_from_pb(spb.UpdateResult.FromString(update_result_pb(r).SerializeToString())) == r
    unknown = spb.UpdateResult(status=99, message="from a newer node")  # type: ignore[arg-type]
    assert update_result_from_pb(unknown).status is IoStatus.UNSPECIFIED  # not OK: the sender retries
