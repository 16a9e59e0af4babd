"""Update ids: a replica tells a re-sent update from a different one at the same version, and the chunk
engine remembers each chunk's recent updates (version and result) durably, within its count and age bounds."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ff_storage.core.chunks import ForwardDecision, UpdateRecord, check_update_id, decide_forward
from ff_storage.core.errors import InvalidRequest
from ff_storage.store.chunk_engine import ChunkEngine
from hf3fs.checksum import crc32c_of

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


def _commit(engine: ChunkEngine, content: bytes, update_id: tuple[bytes, int] | None,
            inherited: list[UpdateRecord] | None = None) -> None:  # fmt: skip
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
    theirs = UpdateRecord(update_id=B, version=1, length=6, checksum=crc32c_of(b"theirs"),
                          committed_at_ms=int(time.time() * 1000))  # fmt: skip
    _commit(engine, b"theirs", None, inherited=[theirs])
    assert engine.find_update(KEY, A) is None and engine.find_update(KEY, B) == theirs
