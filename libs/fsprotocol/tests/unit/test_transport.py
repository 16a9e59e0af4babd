"""The one choice of how a write-side call travels, and where each payload lies in it."""

from __future__ import annotations

import pytest

from ff_fsprotocol.transport import INLINE_MAX_BYTES, TransferPlace, WriteBytes, WriteTransport, write_transport


@pytest.mark.parametrize(
    ("total", "address", "bulk", "expected"),
    [
        (0, "127.0.0.1:9", True, WriteTransport.CALL_INLINE),
        (INLINE_MAX_BYTES, "127.0.0.1:9", True, WriteTransport.CALL_INLINE),
        (INLINE_MAX_BYTES + 1, "127.0.0.1:9", True, WriteTransport.CALL_BULK),
        (INLINE_MAX_BYTES + 1, "", True, WriteTransport.GRPC),  # no data endpoint
        (INLINE_MAX_BYTES + 1, "127.0.0.1:9", False, WriteTransport.GRPC),  # the caller wants no bulk
        (1, "", True, WriteTransport.GRPC),
    ],
)
def test_write_transport(total: int, address: str, bulk: bool, expected: WriteTransport) -> None:
    assert write_transport(total, address, bulk=bulk) is expected
    assert expected.on_data_path is (expected is not WriteTransport.GRPC)


def test_bulk_payloads_lie_back_to_back_under_one_transfer_id() -> None:
    payloads = [b"a" * 40_000, b"b" * 30_000, b"c" * 5]
    wire = WriteBytes.for_payloads(payloads, "127.0.0.1:9")
    assert wire.transport is WriteTransport.CALL_BULK
    places = [wire.place(p) for p in payloads]
    tid = wire.transfer_id
    assert places == [TransferPlace(tid, 0), TransferPlace(tid, 40_000), TransferPlace(tid, 70_000)]
    assert wire.parts == payloads  # the very objects: nothing joined or copied


def test_small_payloads_go_inline() -> None:
    wire = WriteBytes.for_payloads([b"x" * 10, b"y" * 20], "127.0.0.1:9")
    assert wire.transport is WriteTransport.CALL_INLINE
    assert wire.place(b"x" * 10) is None and wire.parts == []
