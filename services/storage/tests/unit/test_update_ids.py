"""Update ids: a replica tells a re-sent update from a different one at the same version, and the chunk
engine remembers each chunk's recent updates (version and result) durably, within its count and age bounds."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ff_fsprotocol.checksum import crc32c_of
from ff_fsprotocol.routing import RoutingView
from ff_storage.core.chunks import ForwardDecision, UpdateRecord, chain_update_id, check_update_id, decide_forward
from ff_storage.core.errors import InvalidRequest
from ff_storage.core.requests import ChunkUpdate, UpdateKind
from ff_storage.core.results import IoStatus
from ff_storage.node import StorageNode
from ff_storage.store import update_records
from ff_storage.store.chunk_engine import ChunkEngine
from fireflyer.mgmtd.v1 import mgmtd_pb2 as mpb

KEY = (7, 0)
A = (b"client-a", 1)
B = (b"client-b", 1)


def test_a_different_update_at_a_committed_version_is_no_duplicate() -> None:
    assert decide_forward(3, 3, False, same_update=True) is ForwardDecision.DUPLICATE
    assert decide_forward(3, 2, False, same_update=True) is ForwardDecision.DUPLICATE
    assert decide_forward(3, 3, False, same_update=False) is ForwardDecision.MISSING  # send the whole chunk
    assert decide_forward(3, 3, False, same_update=None) is ForwardDecision.DUPLICATE  # ids off: version alone
    assert decide_forward(3, 4, False, same_update=False) is ForwardDecision.APPLY


def test_update_ids_from_the_wire() -> None:
    assert check_update_id("x", b"", 0) is None
    assert check_update_id("x", b"c", 5) == (b"c", 5)
    for client_id, request_id in [(b"", 1), (b"c" * 65, 1), (b"c", 0)]:
        with pytest.raises(InvalidRequest):
            check_update_id("x", client_id, request_id)


def _commit(
    engine: ChunkEngine,
    content: bytes,
    update_id: tuple[bytes, int] | None,
    inherited: list[UpdateRecord] | None = None,
) -> None:
    meta = engine.get(KEY)
    version = (meta.committed_version if meta else 0) + 1
    [pending] = engine.write_pending([(KEY, version, 1, content, None)])
    engine.commit([pending], [(update_id, inherited)])


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[ChunkEngine]:
    e = ChunkEngine(tmp_path / "target", max_update_ids_per_chunk=3, update_id_ttl_s=60)
    e.open()
    yield e
    e.close()


def test_records_keep_the_version_and_result_and_survive_a_restart(engine: ChunkEngine, tmp_path: Path) -> None:
    _commit(engine, b"a" * 10, A)
    _commit(engine, b"b" * 20, B)
    got = engine.find_update(KEY, A)
    assert got is not None and (got.version, got.length, got.checksum) == (1, 10, crc32c_of(b"a" * 10))
    assert engine.update_at(KEY, 2) is not None and engine.update_at(KEY, 2).update_id == B  # type: ignore[union-attr]
    engine.close()
    again = ChunkEngine(tmp_path / "target", max_update_ids_per_chunk=3)
    again.open()
    try:
        assert again.find_update(KEY, A) == got
        assert [r.update_id for r in again.recent_updates(KEY)] == [A, B]
    finally:
        again.close()


def test_records_are_bounded_per_chunk_oldest_first(engine: ChunkEngine, tmp_path: Path) -> None:
    for n in range(1, 6):
        _commit(engine, bytes([n]) * 4, (b"c", n))
    assert [r.update_id[1] for r in engine.recent_updates(KEY)] == [3, 4, 5]
    engine.close()
    again = ChunkEngine(tmp_path / "target", max_update_ids_per_chunk=3)
    again.open()
    try:
        assert [r.update_id[1] for r in again.recent_updates(KEY)] == [3, 4, 5]  # the dropped rows went too
    finally:
        again.close()


def test_records_older_than_the_ttl_are_forgotten(engine: ChunkEngine) -> None:
    old = UpdateRecord(update_id=A, version=1, length=1, checksum=0, committed_at_ms=int(time.time() * 1000) - 61_000)
    _commit(engine, b"x", B, inherited=[old])  # a full replace carrying an old record
    assert engine.find_update(KEY, A) is None and engine.find_update(KEY, B) is not None


def test_a_full_replace_takes_the_senders_records(engine: ChunkEngine) -> None:
    _commit(engine, b"mine", A)
    theirs = UpdateRecord(
        update_id=B, version=1, length=6, checksum=crc32c_of(b"theirs"), committed_at_ms=int(time.time() * 1000)
    )
    _commit(engine, b"theirs", None, inherited=[theirs])
    assert engine.find_update(KEY, A) is None and engine.find_update(KEY, B) == theirs


@pytest.fixture
async def tail(whole_chain_node: Callable[[int, int, int], StorageNode]) -> StorageNode:
    """A node whose target is the tail of chain 1, after a head on another node: forwarded updates commit here."""
    node = whole_chain_node(101, 1, 1)
    members = [
        mpb.Target(target_id=t, node_id=n, public_state=mpb.PUBLIC_TARGET_STATE_SERVING, chain_id=1)
        for t, n in ((2, 100), (1, 101))
    ]
    node.state.on_routing(
        RoutingView(mpb.RoutingInfo(version=2, chains=[mpb.Chain(chain_id=1, version=1, targets=members)]))
    )
    return node


def _forward(data: bytes, version: int, update_id: tuple[bytes, int], *, full: bool = False) -> list[ChunkUpdate]:
    return [
        ChunkUpdate(
            chain_id=1,
            chain_version=1,
            key=KEY,
            kind=UpdateKind.WRITE,
            version=version,
            chunk_size=64,
            offset=0,
            length=len(data),
            checksum=crc32c_of(data),
            data=data,
            full=full,
            update_id=update_id,
        )
    ]


async def test_a_replica_takes_the_whole_chunk_for_another_update_at_its_version(tail: StorageNode) -> None:
    """The old gap: this replica committed v=1 from A, its predecessor dropped A and sends B at v=1. That is no
    duplicate: MISSING_UPDATE, and the whole chunk that follows replaces A's bytes. A re-sent A is a duplicate."""
    [first] = await tail.writer.forward_updates(_forward(b"A" * 10, 1, A), "cluster")
    assert (first.status, first.committed_version) == (IoStatus.OK, 1)
    [again] = await tail.writer.forward_updates(_forward(b"A" * 10, 1, A), "cluster")
    assert (again.status, again.message) == (IoStatus.OK, "duplicate")
    [other] = await tail.writer.forward_updates(_forward(b"B" * 10, 1, B), "cluster")
    assert other.status == IoStatus.MISSING_UPDATE
    [whole] = await tail.writer.forward_updates(_forward(b"B" * 10, 1, B, full=True), "cluster")
    assert whole.status == IoStatus.OK
    got = tail.state.targets[1].engine.read_committed(KEY)
    assert got is not None and got[1] == b"B" * 10
    assert tail.state.targets[1].engine.update_at(KEY, 1) is not None
    assert tail.state.targets[1].engine.update_at(KEY, 1).update_id == B  # type: ignore[union-attr]


def test_the_chain_id_of_an_update_is_bound_to_its_caller_and_content() -> None:
    """A retry maps to the same id; another user sending the same client id and request id, or the same client
    reusing an id for another update, maps to another one (it can neither take nor block the first's result)."""
    first = chain_update_id("alice", (b"client-a", 7), 1, 0, 100, 1234, 4096)
    assert first == chain_update_id("alice", (b"client-a", 7), 1, 0, 100, 1234, 4096)
    assert first[1] == 7 and 0 < len(first[0]) <= 64
    others = {
        chain_update_id("bob", (b"client-a", 7), 1, 0, 100, 1234, 4096),
        chain_update_id("alice", (b"client-a", 7), 1, 0, 100, 999, 4096),
        chain_update_id("alice", (b"client-a", 7), 1, 8, 100, 1234, 4096),
        chain_update_id("alice", (b"client-b", 7), 1, 0, 100, 1234, 4096),
        chain_update_id("alic", (b"eclient-a", 7), 1, 0, 100, 1234, 4096),  # no ambiguity at the seam
    }
    assert first not in others and len(others) == 5


def _after_commit_by_scanning(
    before: dict[tuple[bytes, int], UpdateRecord], tag: update_records.UpdateTag, **kw: Any
) -> tuple[dict[tuple[bytes, int], UpdateRecord], list[UpdateRecord], list[UpdateRecord]]:
    """What ``after_commit`` answered when it compared the whole of the records before and after."""
    update_id, inherited = tag
    base = before if inherited is None else {r.update_id: r for r in inherited}
    ids = [] if update_id is None else [update_id]
    records = update_records.with_updates(base, ids, **kw)
    gone = [r for k, r in before.items() if records.get(k) is not r]
    added = [r for k, r in records.items() if before.get(k) is not r]
    return records, gone, added


@pytest.mark.parametrize("seed", range(20))
def test_a_commits_records_are_those_a_whole_comparison_finds(seed: int) -> None:
    """``after_commit`` looks only at what a commit changes: the same records, gone and added as comparing all."""
    rng = random.Random(seed)
    keep = update_records.Retention(ttl_ms=rng.choice([0, 50, 10_000]), max_records=rng.choice([1, 3, 8, 1024]))
    before: dict[tuple[bytes, int], UpdateRecord] = {}
    now = 1_000
    for version in range(1, 200):
        now += rng.choice([0, 1, 7, 30])
        ids = [(b"c", n) for n in range(12)]
        update_id = rng.choice([None, *ids])
        inherited = None
        if rng.random() < 0.05:  # a full-chunk replace with records of its own
            inherited = [UpdateRecord(update_id=i, version=version - 1, length=1, checksum=2, committed_at_ms=now - 5)
                         for i in rng.sample(ids, 3)]  # fmt: skip
        kw = {"version": version, "length": version * 3, "checksum": version, "now_ms": now, "keep": keep}
        records, gone, added = update_records.after_commit(before, (update_id, inherited), **kw)
        want, want_gone, want_added = _after_commit_by_scanning(before, (update_id, inherited), **kw)
        assert list(records.items()) == list(want.items())  # the same records, oldest first
        assert {id(r) for r in gone} == {id(r) for r in want_gone} and len(gone) == len(want_gone)
        assert [r for r in added] == want_added
        before = records
