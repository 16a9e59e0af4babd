"""What the storage RPCs ask of the node and what reads answer, as the node's own types (``wire`` converts).

Fields hold what the caller sent, unchecked: the writer, reader and recovery check them in their order, with
their messages (chunk ids, ranges, sizes, update ids). Only what the node's types cannot hold is refused at the
wire: an update kind this node does not know, a remembered update without an id. Bytes stay the objects they
arrived as (``bytes`` from a request, ``memoryview`` into a data-path call's buffer): nothing here copies them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ff_storage.core.chunks import ChunkKey, UpdateKey, UpdateRecord
from ff_storage.core.results import IoStatus

# Chunk bytes: bulk payloads are views into the received buffer (4 MiB copies cost milliseconds).
Payload = bytes | memoryview


class UpdateKind(enum.IntEnum):
    """What a chain update does: the values of ``fireflyer.storage.v1.UpdateType`` (a unit test keeps them equal)."""

    WRITE = 1  # data at an offset (or the whole chunk, as a full-chunk replace)
    TRUNCATE = 2  # set the chunk's length
    REMOVE = 3


@dataclass(frozen=True, slots=True)
class TransferRef:
    """Where an IO's bytes are: at ``offset`` in the bytes sent with the call (or pushed) as ``transfer_id``."""

    transfer_id: str
    offset: int


@dataclass(frozen=True, slots=True, kw_only=True)
class WriteIO:
    """One IO of a BatchWrite, to a chain's head.

    ``data`` (inline bytes) or ``transfer`` (bytes beside the request) or neither (refused by the writer);
    ``update_id``: the client's id as sent, None when it sent none.
    """

    chain_id: int
    chain_version: int
    key: ChunkKey
    chunk_size: int
    offset: int
    length: int
    checksum: int
    data: Payload | None = None
    transfer: TransferRef | None = None
    update_id: UpdateKey | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TruncateIO:
    """One IO of a TruncateChunks: cut or zero-extend a chunk to ``length`` bytes."""

    chain_id: int
    chain_version: int
    key: ChunkKey
    chunk_size: int
    length: int
    update_id: UpdateKey | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RemoveRequest:
    """A RemoveChunks: the chunks of ``inode_id`` from ``begin_index`` to ``end_index`` (0: no end), a bounded batch."""

    chain_id: int
    chain_version: int
    inode_id: int
    begin_index: int
    end_index: int
    max_chunks: int = 0  # 0: the node's default


@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkUpdate:
    """An update a predecessor forwards (or a recovery predecessor sends) to the next target of a chain.

    ``version`` is the version it creates; ``full``: ``data`` or ``transfer`` is the whole chunk at that
    version, with the sender's remembered updates of the chunk (``records``); ``no_forward``: stored at the
    receiver only (a repair's or sync's copy for that one replica).
    """

    chain_id: int
    chain_version: int
    key: ChunkKey
    kind: UpdateKind
    version: int
    chunk_size: int
    offset: int
    length: int
    checksum: int
    data: Payload | None = None
    transfer: TransferRef | None = None
    full: bool = False
    no_forward: bool = False
    update_id: UpdateKey | None = None
    records: tuple[UpdateRecord, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadIO:
    """One IO of a BatchRead; ``relaxed``: a pending version may be read."""

    chain_id: int
    chain_version: int
    key: ChunkKey
    offset: int
    length: int
    relaxed: bool = False


@dataclass(slots=True, kw_only=True)
class ReadResult:
    """One read's outcome; its bytes go inline (``inline_data``) or at ``transfer_offset`` of the batch's transfer."""

    status: IoStatus
    message: str = ""
    length: int = 0
    version: int = 0
    is_pending: bool = False
    checksum: int | None = None  # CRC-32C of the bytes read; None: nothing read
    inline_data: bytes | None = None
    transfer_offset: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LastChunkQuery:
    """A QueryLastChunk query: the last chunk of ``inode_id`` from ``begin_index`` to ``end_index`` (0: no end)."""

    chain_id: int
    chain_version: int
    inode_id: int
    begin_index: int
    end_index: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LastChunkResult:
    """The answer to a ``LastChunkQuery`` (index, length and count only when found)."""

    status: IoStatus
    last_index: int = 0
    last_length: int = 0
    num_chunks: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class RepairRequest:
    """A RepairChunks, to a chain's head: rewrite ``keys`` everywhere from a good copy."""

    chain_id: int
    chain_version: int
    keys: tuple[ChunkKey, ...]
