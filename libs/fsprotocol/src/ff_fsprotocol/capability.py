"""IoCapability: meta's proof for storage that a user may read (or write) one file's chunks, where its layout puts them.

A capability is 85 bytes: inode id (8), writable (1), expiry in ns since the epoch (8), the file's layout (chain
table id 4, chunk size 4, stripe size 4, first chain's index 4, shuffle seed 8: ``CapLayout``), the end of the file a
writer may write up to (8: its write session's limit, the quota it reserved; 2^64-1 for none), and an HMAC-SHA256 over
those 53 bytes with a key both meta and storage derive from the cluster token. Meta makes them at Open/Create/BatchStat
and ReserveSpace; clients pass them opaque in every user ReadIO/WriteIO; storage checks them, and with the layout
that each chunk is on the chain the layout puts it on (and, written, of the layout's chunk size, and not past the
limit): a client cannot store a file's chunks where neither its length nor its removal would find them (outside its
quota, forever), nor write past what its quota reserved. Cluster-token callers need none.

The 49-byte form without the layout (meta before the layout was bound) is still taken, for the inode alone, until
those capabilities expire.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

_HEAD = struct.Struct(">QBq")
_LAYOUT = struct.Struct(">IIIIQQ")  # the layout, then the write limit
CAPABILITY_BYTES = _HEAD.size + _LAYOUT.size + 32
NO_WRITE_LIMIT = (1 << 64) - 1
_UNBOUND_BYTES = _HEAD.size + 32  # the form without the layout
_KEY_LABEL = b"fireflyer io-capability v1"


@dataclass(frozen=True)
class CapLayout:
    """The file's layout as its capability carries it (``ff_fsprotocol.layout.file_chains``'s arguments)."""

    chain_table_id: int
    chunk_size: int
    stripe_size: int
    chain_begin: int
    shuffle_seed: int


@dataclass(frozen=True)
class ChunkAt:
    """Where an IO says the chunk is: its chain and index.

    For a write also the chunk size it gives and the end of the bytes it writes within the chunk (None for a read).
    """

    chain_id: int
    chunk_index: int
    chunk_size: int | None = None
    write_end: int | None = None


def capability_key(cluster_token: str) -> bytes:
    """The HMAC key (never the token itself, so a leaked capability tells nothing about the token)."""
    if not cluster_token:
        raise ValueError("a cluster token is needed to derive the capability key")
    return hmac.new(cluster_token.encode(), _KEY_LABEL, hashlib.sha256).digest()


def make_capability(
    key: bytes,
    inode_id: int,
    writable: bool,
    expires_at_ns: int,
    layout: CapLayout,
    write_limit: int = NO_WRITE_LIMIT,
) -> bytes:
    """A capability for ``inode_id`` (read, or read and write when ``writable``) valid until ``expires_at_ns``.

    A writer may write the file's bytes below ``write_limit``.
    """
    head = _HEAD.pack(inode_id, 1 if writable else 0, expires_at_ns) + _LAYOUT.pack(
        layout.chain_table_id,
        layout.chunk_size,
        layout.stripe_size,
        layout.chain_begin,
        layout.shuffle_seed,
        write_limit,
    )
    return head + hmac.new(key, head, hashlib.sha256).digest()


def check_capability(
    key: bytes,
    blob: bytes,
    inode_id: int,
    *,
    write: bool,
    now_ns: int,
    chunk: ChunkAt | None = None,
    chains_of: Callable[[CapLayout], Sequence[int] | None] | None = None,
) -> str | None:
    """Why ``blob`` does not allow the IO (a short reason), or None when it does.

    With ``chunk`` and ``chains_of`` (the file's chain ids for a layout, None when its chain table is unknown), the
    chunk must be where the capability's layout puts it.
    """
    if len(blob) not in (CAPABILITY_BYTES, _UNBOUND_BYTES):
        return "missing or malformed io capability"
    head, mac = blob[:-32], blob[-32:]
    if not hmac.compare_digest(mac, hmac.new(key, head, hashlib.sha256).digest()):
        return "io capability is forged or from another cluster"
    cap_inode, writable, expires_at_ns = _HEAD.unpack_from(head)
    if cap_inode != inode_id:
        return f"io capability is for inode {cap_inode}, not {inode_id}"
    if write and not writable:
        return "io capability is read-only"
    if expires_at_ns <= now_ns:
        return "io capability expired (open the file again)"
    if len(head) == _HEAD.size or chunk is None or chains_of is None:
        return None
    *fields, write_limit = _LAYOUT.unpack_from(head, _HEAD.size)
    return _misplaced(CapLayout(*fields), write_limit, chunk, chains_of)


def _misplaced(
    layout: CapLayout, write_limit: int, chunk: ChunkAt, chains_of: Callable[[CapLayout], Sequence[int] | None]
) -> str | None:
    """Why ``chunk`` is not where ``layout`` puts it, or past the write limit; None when it is fine."""
    if chunk.chunk_size is not None and chunk.chunk_size != layout.chunk_size:
        return f"the file's chunks are {layout.chunk_size} bytes, not {chunk.chunk_size}"
    if chunk.write_end is not None and chunk.chunk_index * layout.chunk_size + chunk.write_end > write_limit:
        return f"a write past byte {write_limit} of the file, its write session's limit (reserve space first)"
    chains = chains_of(layout)
    if not chains:
        return f"chain table {layout.chain_table_id} is unknown here, or shorter than the file's stripe"
    expected = chains[chunk.chunk_index % len(chains)]
    if chunk.chain_id != expected:
        return f"chunk {chunk.chunk_index} of the file is on chain {expected}, not {chunk.chain_id}"
    return None
