"""Chunk rules (pure): IO validation, updates of chunk content, CRAQ versions, recovery diff, local state.

That is: applying an update to chunk content, CRAQ version decisions at a replica, the recovery diff, and
what local state a target reports.
"""

from __future__ import annotations

import enum
import hashlib
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ff_storage.core.errors import InvalidRequest

ChunkKey = tuple[int, int]  # (inode id, chunk index); a chunk id is the inode id plus the index
UpdateKey = tuple[bytes, int]  # an update's id: (client id, request id), chosen by the client (3FS)
MAX_CLIENT_ID_BYTES = 64
MAX_INODE_ID = 2**63 - 1
MAX_CHUNK_INDEX = 2**40
MAX_CHUNK_SIZE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class ChunkMeta:
    """Per-chunk metadata, committed atomically with the chunk data."""

    inode_id: int
    chunk_index: int
    chain_version: int
    committed_version: int
    length: int
    checksum: int
    pending_version: int = 0

    @property
    def key(self) -> ChunkKey:
        """``(inode_id, chunk_index)``."""
        return (self.inode_id, self.chunk_index)


@dataclass(frozen=True, kw_only=True)
class UpdateRecord:
    """An update a replica remembers for a chunk: its id, the version it created, the chunk after it."""

    update_id: UpdateKey
    version: int
    length: int
    checksum: int
    committed_at_ms: int


def check_update_id(what: str, client_id: bytes, request_id: int) -> UpdateKey | None:
    """An update id from the wire: None when unset (empty client id and request id 0)."""
    if not client_id and not request_id:
        return None
    if not 0 < len(client_id) <= MAX_CLIENT_ID_BYTES:
        raise InvalidRequest(f"{what}: update_id.client_id must have 1..{MAX_CLIENT_ID_BYTES} bytes")
    if request_id <= 0:
        raise InvalidRequest(f"{what}: update_id.request_id must be positive")
    return (client_id, request_id)


def chain_update_id(owner: str, client_update: UpdateKey, *what: int) -> UpdateKey:
    """The id the chain remembers for a client's update: the client's id bound to the caller and to the update.

    The caller is ``owner``, the authenticated principal; what the update does is ``what``: type, offset,
    length, checksum, chunk size.

    A retry (same caller, same id, same update) maps to the same id, so it gets the original result. Another
    caller sending the same client id and request id, or the same caller reusing an id for a different update,
    maps to another id: it is a new update, applied, and can neither take another's result nor make another's
    write be answered as done without being applied.
    """
    digest = hashlib.blake2b(digest_size=16)
    for part in (owner.encode(), client_update[0]):
        digest.update(struct.pack("<I", len(part)) + part)
    digest.update(struct.pack(f"<{len(what)}Q", *what))
    return (digest.digest(), client_update[1])


def check_chunk_id(inode_id: int, chunk_index: int) -> ChunkKey:
    """A chunk id from the wire, as a key; InvalidRequest when either part is out of range."""
    if not 0 < inode_id <= MAX_INODE_ID:
        raise InvalidRequest(f"chunk id: inode_id {inode_id} must be in 1..{MAX_INODE_ID}")
    if not 0 <= chunk_index < MAX_CHUNK_INDEX:
        raise InvalidRequest(f"chunk id: chunk_index {chunk_index} must be below {MAX_CHUNK_INDEX}")
    return (inode_id, chunk_index)


def check_range(what: str, chunk_size: int, offset: int, length: int, max_io_bytes: int) -> None:
    """An IO's range: inside the chunk, not empty, not larger than one IO may be."""
    if not 0 < chunk_size <= MAX_CHUNK_SIZE_BYTES:
        raise InvalidRequest(f"{what}: chunk_size_bytes {chunk_size} must be in 1..{MAX_CHUNK_SIZE_BYTES}")
    if length > max_io_bytes:
        raise InvalidRequest(f"{what}: length {length} is over the limit of {max_io_bytes} bytes per IO")
    if length <= 0:
        raise InvalidRequest(f"{what}: length must be positive")
    if offset + length > chunk_size:
        raise InvalidRequest(f"{what}: offset {offset} + length {length} is past the chunk size {chunk_size}")


def check_read_range(offset: int, length: int, max_io_bytes: int) -> None:
    """A read's range: not empty, at most ``max_io_bytes``, inside the largest chunk; InvalidRequest if not."""
    if length <= 0 or length > max_io_bytes:
        raise InvalidRequest(f"read: length {length} must be in 1..{max_io_bytes}")
    if offset + length > MAX_CHUNK_SIZE_BYTES:
        raise InvalidRequest(f"read: offset {offset} + length {length} is past the largest chunk")


def apply_write(old: bytes | None, offset: int, data: bytes | memoryview) -> bytes:
    """Chunk content after writing ``data`` at ``offset`` (a gap before it reads as zeros)."""
    base = old or b""
    if offset == 0 and len(data) >= len(base):
        return bytes(data)
    if offset > len(base):
        base = base + bytes(offset - len(base))
    return base[:offset] + bytes(data) + base[offset + len(data) :]


def apply_writes(old: bytes | None, writes: Sequence[tuple[int, bytes | memoryview]]) -> bytes:
    """Chunk content after each ``(offset, data)`` in turn, as ``apply_write`` one after another gives it.

    A later write goes over an earlier one where they overlap, gaps read as zeros; one copy of the chunk instead of
    one per write.
    """
    buf = bytearray(old or b"")
    for offset, data in writes:
        end = offset + len(data)
        if end > len(buf):
            buf.extend(bytes(end - len(buf)))
        buf[offset:end] = data
    return bytes(buf)


def apply_truncate(old: bytes | None, length: int) -> bytes:
    """Chunk content cut or zero-extended to ``length`` bytes."""
    base = old or b""
    return base[:length] if length <= len(base) else base + bytes(length - len(base))


class ForwardDecision(enum.Enum):
    """What a replica does with an update its predecessor forwards (CRAQ, 3FS flavour)."""

    APPLY = "apply"  # the next version: store it as pending, forward, commit on ack
    DUPLICATE = "duplicate"  # already committed (a re-forward after a failure): answer OK
    MISSING = "missing"  # a version is missing in between: the predecessor must send the whole chunk


def decide_forward(
    committed_version: int,
    update_version: int,
    full_chunk_replace: bool,
    same_update: bool | None = None,
    *,
    recovery_copy: bool = False,
) -> ForwardDecision:
    """Whether a forwarded update is a duplicate of one this replica committed.

    ``same_update``: whether this replica committed ``update_version`` from the very update forwarded now
    (same update id); None: update ids are off, a version at or below the committed one is a duplicate.

    A different update at a version this replica already committed is no duplicate: this replica took an
    update its predecessor then dropped (the ack was lost, the predecessor aborted), and the predecessor's
    copy is the chain's. It answers MISSING, and the predecessor sends the whole chunk.

    ``recovery_copy``: a sync's or repair's copy of the sender's committed chunk, sent under the sender's chunk
    lock: it always applies, as 3FS's syncing write does, even below the version held here. This replica may
    hold a newer version its predecessor never committed: the replicas committed a write, and the power went
    before the head did; restarted, the head is the chain's last serving copy and the others sync from it.
    Keeping the newer copy would leave the replicas holding other bytes than the head under the chain.
    """
    if recovery_copy:
        return ForwardDecision.APPLY
    if full_chunk_replace:
        return ForwardDecision.APPLY if update_version >= committed_version else ForwardDecision.DUPLICATE
    if update_version <= committed_version:
        return ForwardDecision.MISSING if same_update is False else ForwardDecision.DUPLICATE
    if update_version == committed_version + 1:
        return ForwardDecision.APPLY
    return ForwardDecision.MISSING


@dataclass(frozen=True)
class SyncPlan:
    """What the predecessor of a syncing target sends (full-chunk-replace) and removes there."""

    transfer: list[ChunkKey]
    remove: list[ChunkKey]


def sync_diff(local: Mapping[ChunkKey, ChunkMeta], remote: Mapping[ChunkKey, ChunkMeta]) -> SyncPlan:
    """3FS's recovery rules, from the predecessor's side (``local``) against the dump of the syncing target.

    - local only: transfer; remote only: remove remotely;
    - local chain version > remote: transfer;
    - same chain version: identical (same committed version and checksum) or in flight (the remote's
      pending version is our committed one: the forward running now brings it) -> nothing; otherwise
      transfer.
    - remote chain version > local (the remote saw a newer chain than our copy): transfer, the
      predecessor's committed chunk is the truth.
    """
    transfer: list[ChunkKey] = []
    for key, mine in local.items():
        theirs = remote.get(key)
        if theirs is None or mine.chain_version != theirs.chain_version:
            transfer.append(key)
            continue
        identical = theirs.committed_version == mine.committed_version and theirs.checksum == mine.checksum
        in_flight = theirs.pending_version != 0 and theirs.pending_version == mine.committed_version
        if not (identical or in_flight):
            transfer.append(key)
    remove = [key for key in remote if key not in local]
    return SyncPlan(sorted(transfer), sorted(remove))
