"""The chunk engine on real files: versions go to free files, never to one a reader maps, and a crash
between write and commit leaves the committed version whole."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ff_fsprotocol.checksum import crc32c_of
from ff_storage.core.errors import ChunkCorrupt, PendingReplaced
from ff_storage.store import chunk_files
from ff_storage.store.chunk_engine import ChunkEngine

KEY = (7, 0)


def _files(engine: ChunkEngine) -> set[Path]:
    return {p for p in engine.data_dir.rglob("*") if p.is_file()}


def _put(engine: ChunkEngine, content: bytes, key: tuple[int, int] = KEY) -> None:
    meta = engine.get(key)
    version = (meta.committed_version if meta else 0) + 1
    [pending] = engine.write_pending([(key, version, 1, content, None)])
    engine.commit([pending])


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[ChunkEngine]:
    """New files one at a time (no batch of empty free ones), so that the tests can count files."""
    e = ChunkEngine(tmp_path / "target", max_free_files=4, new_file_batch=1)
    e.open()
    yield e
    e.close()


def test_overwrites_reuse_the_replaced_versions_files(engine: ChunkEngine) -> None:
    _put(engine, b"a" * 4096)
    _put(engine, b"b" * 4096)
    files = _files(engine)
    assert len(files) == 2  # the live version and the free one
    for n in range(10):
        _put(engine, bytes([n]) * 4096)
        assert _files(engine) == files
    meta, data = engine.read_committed(KEY) or (None, b"")
    assert data == bytes([9]) * 4096 and meta is not None and meta.committed_version == 12


def test_a_mapped_file_is_not_reused_until_its_reader_drops_it(engine: ChunkEngine) -> None:
    _put(engine, b"old" * 1000)
    mapped_name = engine._files[KEY]
    got = engine.map_committed(KEY)
    assert got is not None
    meta, view = got
    for n in range(5):
        _put(engine, bytes([n]) * 3000)
        assert engine._files[KEY] != mapped_name  # every version went elsewhere
    assert bytes(view) == b"old" * 1000 and crc32c_of(view) == meta.checksum  # the reader's bytes never moved
    del view, got
    _put(engine, b"new" * 1000)
    assert engine._files[KEY] == mapped_name  # free again (the oldest free file) and taken


def test_a_reserved_version_reads_as_pending_and_a_replaced_reservation_stores_nothing(engine: ChunkEngine) -> None:
    _put(engine, b"v1" * 100)
    [first] = engine.reserve([(KEY, 2, 1)])
    meta = engine.get(KEY)
    assert meta is not None and meta.pending_version == 2 and meta.committed_version == 1
    assert engine.read_pending(KEY) is None  # nothing to read yet: relaxed readers read the committed copy
    files = _files(engine)
    [second] = engine.reserve([(KEY, 2, 1)])  # a retry took over (the first one's caller gave up)
    with pytest.raises(PendingReplaced):
        engine.write_pending([(KEY, 2, 1, b"late" * 100, None)], [first])
    assert engine.pending(KEY) is second
    [stored] = engine.write_pending([(KEY, 2, 1, b"v2" * 100, None)], [second])
    assert len(_files(engine)) == len(files) + 1  # the late write's file went back to the free list, reused
    engine.commit([stored])
    assert engine.read_committed(KEY) == (engine.get(KEY), b"v2" * 100)


def test_a_version_that_is_no_longer_the_pending_one_is_not_committed(engine: ChunkEngine) -> None:
    _put(engine, b"v1" * 100)
    [old] = engine.write_pending([(KEY, 2, 1, b"abandoned" * 100, None)])
    [new] = engine.write_pending([(KEY, 2, 1, b"retried" * 100, None)])
    with pytest.raises(PendingReplaced):
        engine.commit([old])
    engine.commit([new])
    assert engine.read_committed(KEY) == (engine.get(KEY), b"retried" * 100)
    _put(engine, b"v3" * 100, (8, 0))  # the abandoned version's file is free, not shared by two chunks
    assert engine.read_committed(KEY) == (engine.get(KEY), b"retried" * 100)
    assert engine.read_committed((8, 0)) == (engine.get((8, 0)), b"v3" * 100)


def test_a_pending_version_is_served_from_a_view_until_committed(engine: ChunkEngine) -> None:
    _put(engine, b"x" * 100)
    [pending] = engine.write_pending([(KEY, 2, 1, b"y" * 50, None)])
    got = engine.read_pending(KEY)
    assert got is not None and bytes(got[1]) == b"y" * 50 and got[0].checksum == crc32c_of(b"y" * 50)
    engine.abort([pending])
    assert engine.read_pending(KEY) is None
    assert engine.read_committed(KEY) == (engine.get(KEY), b"x" * 100)


def test_crash_between_write_and_commit_keeps_the_committed_version(tmp_path: Path) -> None:
    root = tmp_path / "target"
    first = ChunkEngine(root, new_file_batch=1)
    first.open()
    _put(first, b"committed" * 100)
    first.close()
    # another process stores a new version and dies before committing it (no close, no cleanup)
    code = (
        "import os, sys; from pathlib import Path; from ff_storage.store.chunk_engine import ChunkEngine\n"
        "e = ChunkEngine(Path(sys.argv[1]), new_file_batch=1); e.open()\n"
        "e.write_pending([((7, 0), 2, 1, b'never committed' * 100, None)])\n"
        "os._exit(9)\n"
    )
    died = subprocess.run([sys.executable, "-c", code, str(root)], check=False)
    assert died.returncode == 9
    again = ChunkEngine(root, new_file_batch=1)
    again.open()
    assert again.pending(KEY) is None
    assert again.read_committed(KEY) == (again.get(KEY), b"committed" * 100)
    files = _files(again)
    assert len(files) == 2  # the committed version's file and the lost pending version's, now free
    _put(again, b"next" * 100)  # goes to the file the lost pending version had
    assert _files(again) == files
    again.close()


def test_free_files_past_the_cap_are_unlinked(engine: ChunkEngine) -> None:
    for index in range(8):
        _put(engine, b"v1" * 10, (1, index))
    for index in range(8):
        engine.commit([engine.write_pending([((1, index), 2, 1, None, None)])[0]])  # removes
    assert len(_files(engine)) == 4  # max_free_files
    assert engine.usage() == (0, 0)


def test_a_damaged_file_fails_the_check(engine: ChunkEngine) -> None:
    _put(engine, b"z" * 8192)
    [path] = _files(engine)
    with open(path, "r+b") as f:
        f.seek(10)
        f.write(b"!")
        f.flush()
        os.fsync(f.fileno())
    with pytest.raises(ChunkCorrupt):
        engine.map_committed(KEY)


def test_new_files_come_in_batches_with_one_folder_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight new chunks with batches of 8: one batch of files, its folder fsynced once (and the data folder once
    for the new folder), where one file at a time fsynced a folder for each chunk. Every chunk reads back."""
    synced: list[Path] = []
    real = chunk_files._fsync_dir
    monkeypatch.setattr(chunk_files, "_fsync_dir", lambda p: (synced.append(p), real(p))[1])
    e = ChunkEngine(tmp_path / "target", new_file_batch=8)
    e.open()
    synced.clear()
    for index in range(8):
        _put(e, bytes([index]) * 5000, (3, index))
    assert len(_files(e)) == 8 and len(synced) <= 2, synced
    assert all(e.read_committed((3, i)) == (e.get((3, i)), bytes([i]) * 5000) for i in range(8))
    _put(e, b"ninth" * 10, (3, 8))  # the batch is used up: a new one
    assert len(_files(e)) == 16
    e.close()


def test_unused_files_of_a_batch_are_free_after_a_restart(tmp_path: Path) -> None:
    root = tmp_path / "target"
    e = ChunkEngine(root, new_file_batch=4)
    e.open()
    _put(e, b"only" * 100)
    e.close()
    again = ChunkEngine(root, new_file_batch=4)
    again.open()
    files = _files(again)
    assert len(files) == 4 and again.read_committed(KEY) == (again.get(KEY), b"only" * 100)
    for index in range(1, 4):  # the three empty ones are taken before any new file is made
        _put(again, b"more" * 100, (7, index))
    assert _files(again) == files
    again.close()


def test_a_batch_of_new_chunks_is_synced_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sixteen new chunks in one write_pending (a write-back batch of small files): their files are made at once
    (one folder fsync, where batches of 4 fsynced a folder 4 times) and their data fsyncs overlap (the journal
    takes them in one commit), where one after another had at most one running. Every chunk reads back."""
    folders: list[Path] = []
    real_dir = chunk_files._fsync_dir
    monkeypatch.setattr(chunk_files, "_fsync_dir", lambda p: (folders.append(p), real_dir(p))[1])
    running, most = [0], [0]
    real_sync = os.fsync

    def slow_fsync(fd: int) -> None:
        running[0] += 1
        most[0] = max(most[0], running[0])
        try:
            time.sleep(0.02)  # long enough for the others to start (what is counted is overlap, not time)
            real_sync(fd)
        finally:
            running[0] -= 1

    e = ChunkEngine(tmp_path / "target", new_file_batch=4)
    e.open()
    folders.clear()
    monkeypatch.setattr(os, "fsync", slow_fsync)
    made = e.write_pending([((5, i), 1, 1, bytes([i]) * 5000, None) for i in range(16)])
    monkeypatch.setattr(os, "fsync", real_sync)
    e.commit(made)
    assert len(folders) <= 2, folders
    assert most[0] > 1
    assert all(e.read_committed((5, i)) == (e.get((5, i)), bytes([i]) * 5000) for i in range(16))
    e.close()


def test_a_files_last_chunk_comes_from_its_own_chunks(tmp_path: Path) -> None:
    """last_chunk and keys_of_inode answer from a per-inode index (a Close's length query no longer scans every
    chunk of the target): right after writes, after a chunk is removed, and after the target opens again."""
    root = tmp_path / "target"
    e = ChunkEngine(root, new_file_batch=8)
    e.open()
    for inode in (1, 2, 3):
        for index in range(4):
            _put(e, bytes([inode]) * (100 + index), (inode, index))
    last, count, pending = e.last_chunk(2, 0, 0)
    assert last is not None and (last.chunk_index, last.length, count, pending) == (3, 103, 4, False)
    [gone] = e.write_pending([((2, 3), 2, 1, None, None)])  # remove chunk 3 of inode 2
    e.commit([gone])
    last, count, _ = e.last_chunk(2, 0, 0)
    assert last is not None and (last.chunk_index, count) == (2, 3)
    assert e.keys_of_inode(2, 1, 3) == [(2, 1), (2, 2)] and e.last_chunk(9, 0, 0) == (None, 0, False)
    e.close()
    again = ChunkEngine(root, new_file_batch=8)
    again.open()
    assert again.keys_of_inode(2, 0, 0) == [(2, 0), (2, 1), (2, 2)] and again.keys_of_inode(3, 0, 0) == [
        (3, i) for i in range(4)
    ]
    last, count, _ = again.last_chunk(1, 1, 3)
    assert last is not None and (last.chunk_index, count) == (2, 2)
    again.close()


def test_commits_that_come_while_one_is_written_go_in_one_transaction_and_a_stale_one_fails_alone(
    engine: ChunkEngine,
) -> None:
    keys = [(9, i) for i in range(5)]
    pendings = [engine.write_pending([(k, 1, 1, bytes([i]) * 4096, None)])[0] for i, k in enumerate(keys)]
    [stale] = engine.write_pending([((9, 99), 1, 1, b"x" * 4096, None)])
    engine.write_pending([((9, 99), 2, 1, b"y" * 4096, None)])  # replaces it: its commit must fail
    outcomes: dict[int, object] = {}

    def commit(n: int, pending: object) -> None:
        try:
            outcomes[n] = engine.commit([pending])  # type: ignore[list-item]
        except PendingReplaced as exc:
            outcomes[n] = exc

    before = engine.transactions
    threads = [threading.Thread(target=commit, args=(n, p)) for n, p in enumerate([*pendings, stale])]
    with engine._lock:  # white box: the first commit's transaction waits, the others gather behind it
        threads[0].start()
        deadline = time.monotonic() + 10
        while not engine._committing and time.monotonic() < deadline:
            time.sleep(0.001)
        for t in threads[1:]:
            t.start()
        while len(engine._waiting) < len(threads) - 1 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert len(engine._waiting) == len(threads) - 1
    for t in threads:
        t.join(10)
    assert engine.transactions - before == 2  # the first alone, then all the others together
    assert isinstance(outcomes[len(pendings)], PendingReplaced)
    for n, key in enumerate(keys):
        [meta] = outcomes[n]  # type: ignore[misc]
        assert meta is not None and meta.key == key and meta.committed_version == 1
        got = engine.read_committed(key)
        assert got is not None and got[1] == bytes([n]) * 4096
    reopened = ChunkEngine(engine.root, max_free_files=4, new_file_batch=1)
    engine.close()
    reopened.open()  # what the transactions made durable
    try:
        assert [m.committed_version for k in keys if (m := reopened.get(k)) is not None] == [1] * len(keys)
        assert reopened.get((9, 99)) is None
    finally:
        reopened.close()
        engine.open()
