"""IoCapability: meta's proof for storage that a user may read (or write) one file's chunks.

A capability is 49 bytes: inode id (8), writable (1), expiry in ns since the epoch (8), and an
HMAC-SHA256 over those 17 bytes with a key both meta and storage derive from the cluster token. Meta
makes them at Open/Create/BatchStat; clients pass them opaque in every user ReadIO/WriteIO; storage
checks them. Cluster-token callers need none.
"""

from __future__ import annotations

import hashlib
import hmac
import struct

_HEAD = struct.Struct(">QBq")
CAPABILITY_BYTES = _HEAD.size + 32
_KEY_LABEL = b"fireflyer io-capability v1"


def capability_key(cluster_token: str) -> bytes:
    """The HMAC key (never the token itself, so a leaked capability tells nothing about the token)."""
    if not cluster_token:
        raise ValueError("a cluster token is needed to derive the capability key")
    return hmac.new(cluster_token.encode(), _KEY_LABEL, hashlib.sha256).digest()


def make_capability(key: bytes, inode_id: int, writable: bool, expires_at_ns: int) -> bytes:
    """A capability for ``inode_id`` (read, or read and write when ``writable``) valid until ``expires_at_ns``."""
    head = _HEAD.pack(inode_id, 1 if writable else 0, expires_at_ns)
    return head + hmac.new(key, head, hashlib.sha256).digest()


def check_capability(key: bytes, blob: bytes, inode_id: int, *, write: bool, now_ns: int) -> str | None:
    """Why ``blob`` does not allow the IO (a short reason), or None when it does."""
    if len(blob) != CAPABILITY_BYTES:
        return "missing or malformed io capability"
    head, mac = blob[: _HEAD.size], blob[_HEAD.size :]
    if not hmac.compare_digest(mac, hmac.new(key, head, hashlib.sha256).digest()):
        return "io capability is forged or from another cluster"
    cap_inode, writable, expires_at_ns = _HEAD.unpack(head)
    if cap_inode != inode_id:
        return f"io capability is for inode {cap_inode}, not {inode_id}"
    if write and not writable:
        return "io capability is read-only"
    if expires_at_ns <= now_ns:
        return "io capability expired (open the file again)"
    return None
