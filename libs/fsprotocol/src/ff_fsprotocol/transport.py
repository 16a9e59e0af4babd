"""How a write-side call (BatchWrite, ForwardUpdates) and its bytes travel to a storage node: the one choice.

Three ways, chosen by ``write_transport`` alone (the client's writes and a node's forwards both ask it):

- ``GRPC``: the gRPC call, its bytes inline in the request (the node has no data endpoint, or the caller
  asked for no bulk transfers);
- ``CALL_INLINE``: one data-path ``call``, its bytes inline in the request (at most ``INLINE_MAX_BYTES`` in
  all, so the request stays small);
- ``CALL_BULK``: one data-path ``call``, its bytes beside the request, named by TransferRefs.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

Buffer = bytes | bytearray | memoryview
INLINE_MAX_BYTES = 64 * 1024  # a call's bytes up to this go inline in its request; more go beside it


class WriteTransport(enum.Enum):
    """How one write-side call travels (see the module docstring)."""

    GRPC = "grpc"
    CALL_INLINE = "call-inline"
    CALL_BULK = "call-bulk"

    @property
    def on_data_path(self) -> bool:
        """Whether the call goes as a data-path ``call`` (not a gRPC call)."""
        return self is not WriteTransport.GRPC


def write_transport(total_bytes: int, data_address: str, *, bulk: bool = True) -> WriteTransport:
    """How a call carrying ``total_bytes`` of payload goes to a node whose data endpoint is ``data_address``.

    ``bulk``: the caller allows data-path transfers (a client made with ``bulk=False`` does not).
    """
    if not bulk or not data_address:
        return WriteTransport.GRPC
    return WriteTransport.CALL_BULK if total_bytes > INLINE_MAX_BYTES else WriteTransport.CALL_INLINE


@dataclass(frozen=True)
class TransferPlace:
    """Where a payload lies among a call's bulk bytes: the call's transfer id and the payload's offset."""

    transfer_id: str
    offset_bytes: int


@dataclass
class WriteBytes:
    """The bytes of one write-side call, laid out as its transport says: inline, or back to back beside it."""

    transport: WriteTransport
    transfer_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    parts: list[Buffer] = field(default_factory=list)
    _offset: int = 0

    @classmethod
    def for_payloads(cls, payloads: Sequence[Buffer], data_address: str, *, bulk: bool = True) -> WriteBytes:
        """The layout for a call carrying ``payloads`` to a node whose data endpoint is ``data_address``."""
        return cls(write_transport(sum(len(p) for p in payloads), data_address, bulk=bulk))

    def place(self, payload: Buffer) -> TransferPlace | None:
        """Add ``payload``; where it lies among the bulk bytes, or None when it goes inline in the request."""
        if self.transport is not WriteTransport.CALL_BULK:
            return None
        where = TransferPlace(self.transfer_id, self._offset)
        self.parts.append(payload)
        self._offset += len(payload)
        return where
