"""Meta's IoCapability: made with the key from the cluster token, checked by storage for inode, mode, expiry and
where the file's layout puts the chunk."""

from __future__ import annotations

import hashlib
import hmac
import struct

from ff_fsprotocol.capability import CapLayout, ChunkAt, capability_key, check_capability, make_capability
from ff_fsprotocol.layout import file_chains

TABLE = (7, 8, 9, 10)
LAYOUT = CapLayout(chain_table_id=1, chunk_size=4096, stripe_size=3, chain_begin=2, shuffle_seed=99)


def chains_of(layout: CapLayout) -> list[int] | None:
    if layout.chain_table_id != 1:
        return None
    return file_chains(TABLE, layout.chain_begin, layout.stripe_size, layout.shuffle_seed)


def test_capability() -> None:
    key = capability_key("secret")
    cap = make_capability(key, 42, False, 2000, LAYOUT)
    assert check_capability(key, cap, 42, write=False, now_ns=1000) is None
    assert "read-only" in (check_capability(key, cap, 42, write=True, now_ns=1000) or "")
    assert "inode" in (check_capability(key, cap, 43, write=False, now_ns=1000) or "")
    assert "expired" in (check_capability(key, cap, 42, write=False, now_ns=3000) or "")
    assert "forged" in (check_capability(capability_key("other"), cap, 42, write=False, now_ns=1000) or "")
    forged = cap[:8] + b"\x01" + cap[9:]  # flip writable
    assert "forged" in (check_capability(key, forged, 42, write=True, now_ns=1000) or "")
    moved = cap[:17] + struct.pack(">I", 2) + cap[21:]  # another chain table
    assert "forged" in (check_capability(key, moved, 42, write=False, now_ns=1000) or "")
    assert "missing" in (check_capability(key, b"", 42, write=False, now_ns=1000) or "")


def test_a_chunk_must_be_where_the_file_s_layout_puts_it() -> None:
    key = capability_key("secret")
    cap = make_capability(key, 42, True, 2000, LAYOUT)
    chains = chains_of(LAYOUT)
    assert chains is not None
    for index in range(7):
        right = ChunkAt(chains[index % 3], index, 4096)
        assert check_capability(key, cap, 42, write=True, now_ns=1000, chunk=right, chains_of=chains_of) is None
        wrong = next(c for c in TABLE if c != right.chain_id)
        why = check_capability(
            key, cap, 42, write=True, now_ns=1000, chunk=ChunkAt(wrong, index, 4096), chains_of=chains_of
        )
        assert why == f"chunk {index} of the file is on chain {right.chain_id}, not {wrong}"
    bigger = ChunkAt(chains[0], 0, 8192)
    assert "4096 bytes, not 8192" in (
        check_capability(key, cap, 42, write=True, now_ns=1000, chunk=bigger, chains_of=chains_of) or ""
    )
    read = ChunkAt(chains[0], 0)  # a read gives no chunk size
    assert check_capability(key, cap, 42, write=False, now_ns=1000, chunk=read, chains_of=chains_of) is None
    unknown = make_capability(key, 42, True, 2000, CapLayout(5, 4096, 1, 0, 0))
    assert "chain table 5 is unknown" in (
        check_capability(key, unknown, 42, write=True, now_ns=1000, chunk=read, chains_of=chains_of) or ""
    )


def test_a_write_past_the_capability_s_limit_is_refused() -> None:
    """The limit is the write session's (the quota it reserved): a file offset, over chunk index, offset and length."""
    key = capability_key("secret")
    cap = make_capability(key, 42, True, 2000, LAYOUT, write_limit=4096 * 2 + 100)
    chains = chains_of(LAYOUT)
    assert chains is not None

    def why(index: int, end: int) -> str | None:
        at = ChunkAt(chains[index % 3], index, 4096, end)
        return check_capability(key, cap, 42, write=True, now_ns=1000, chunk=at, chains_of=chains_of)

    assert why(0, 4096) is None and why(2, 100) is None
    assert why(2, 101) == "a write past byte 8292 of the file, its write session's limit (reserve space first)"
    assert why(3, 1) is not None
    read = ChunkAt(chains[3 % 3], 3)  # reads are not limited
    assert check_capability(key, cap, 42, write=False, now_ns=1000, chunk=read, chains_of=chains_of) is None


def test_a_capability_without_the_layout_still_binds_its_inode() -> None:
    """The 49-byte form a meta before layouts were bound made: taken for its inode, mode and expiry alone."""
    key = capability_key("secret")
    head = struct.pack(">QBq", 42, 1, 2000)
    old = head + hmac.new(key, head, hashlib.sha256).digest()
    anywhere = ChunkAt(TABLE[0], 5, 1 << 20)
    assert check_capability(key, old, 42, write=True, now_ns=1000, chunk=anywhere, chains_of=chains_of) is None
    assert "inode" in (check_capability(key, old, 43, write=True, now_ns=1000) or "")
    assert "expired" in (check_capability(key, old, 42, write=True, now_ns=3000) or "")
