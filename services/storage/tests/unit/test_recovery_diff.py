"""3FS's recovery diff rules and the replica's version decisions."""

from __future__ import annotations

from ff_storage.core.chunks import ChunkMeta, ForwardDecision, apply_truncate, apply_write, decide_forward, sync_diff


def m(idx: int, cv: int, v: int, crc: int = 1, pending: int = 0) -> ChunkMeta:
    return ChunkMeta(
        inode_id=1,
        chunk_index=idx,
        chain_version=cv,
        committed_version=v,
        length=4,
        checksum=crc,
        pending_version=pending,
    )


def test_diff_rules() -> None:
    local = {x.key: x for x in [m(0, 5, 3), m(1, 6, 2), m(2, 5, 4), m(3, 5, 4), m(4, 5, 4), m(5, 5, 4, crc=9)]}
    remote = {x.key: x for x in [
        m(1, 5, 2),              # local chain version newer: transfer
        m(2, 5, 4),              # identical: nothing
        m(3, 5, 3, pending=4),   # in flight (remote pending == local committed): nothing
        m(4, 5, 2),              # same chain version, committed differs, not in flight: transfer
        m(5, 5, 4, crc=1),       # same versions, different checksum: transfer
        m(9, 5, 1),              # remote only: remove there
    ]}  # fmt: skip
    plan = sync_diff(local, remote)
    assert plan.transfer == [(1, 0), (1, 1), (1, 4), (1, 5)]  # (1, 0): local only
    assert plan.remove == [(1, 9)]


def test_forward_decisions() -> None:
    assert decide_forward(3, 4, False) is ForwardDecision.APPLY
    assert decide_forward(3, 3, False) is ForwardDecision.DUPLICATE
    assert decide_forward(3, 6, False) is ForwardDecision.MISSING
    assert decide_forward(3, 6, True) is ForwardDecision.APPLY
    assert decide_forward(3, 3, True) is ForwardDecision.APPLY
    assert decide_forward(3, 2, True) is ForwardDecision.DUPLICATE


def test_apply_write_and_truncate() -> None:
    assert apply_write(b"abcdef", 2, b"XY") == b"abXYef"
    assert apply_write(b"ab", 4, b"Z") == b"ab\x00\x00Z"
    assert apply_write(None, 0, b"new") == b"new"
    assert apply_truncate(b"abcdef", 2) == b"ab" and apply_truncate(b"ab", 4) == b"ab\x00\x00"
