"""Durable pending versions (``store/pending_rows.py``): a commit made in memory only, the process killed before its
rows reach the database, and the next ``open`` finds the version committed, from its durable pending row, when
its file is whole; never a version whose file is not."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ff_storage.store.chunk_engine import ChunkEngine

KEY = (7, 0)
UID = (b"u" * 16, 41)

# What each child runs first: an engine on sys.argv[1] with version 1 of KEY committed durably, and helpers.
_PRELUDE = """
import os, sys
from pathlib import Path
from ff_storage.store.chunk_engine import ChunkEngine
KEY, UID = (7, 0), (b"u" * 16, 41)
e = ChunkEngine(Path(sys.argv[1]), max_free_files=4, new_file_batch=1)
e.open()
[p] = e.write_pending([(KEY, 1, 1, b"one" * 100, None)])
e.commit([p])

def lazy(version, content, tag=(None, None), key=KEY):
    [p] = e.write_pending([(key, version, 1, content, None)], tags=[tag])
    return e.commit([p], [tag], durable=False)[0]

def stored(version, content, tag=(None, None)):
    [p] = e.write_pending([(KEY, version, 1, content, None)], tags=[tag])
    return p

def as_the_service(key, version, content, tag=(None, None)):  # reserved first, then stored (writes.py's order)
    reserved = e.reserve([(key, version, 1)])
    [p] = e.write_pending([(key, version, 1, content, None)], reserved, [tag])
    return p
"""


def _crash_after(root: Path, body: str) -> None:
    """Run ``body`` after the prelude in a child process that then dies without closing anything."""
    code = _PRELUDE + textwrap.dedent(body) + "\nos._exit(9)\n"
    died = subprocess.run([sys.executable, "-c", code, str(root)], check=False, capture_output=True, text=True)
    assert died.returncode == 9, died.stderr


def _reopen(root: Path) -> ChunkEngine:
    e = ChunkEngine(root, max_free_files=4, new_file_batch=1)
    e.open()
    return e


def _pending_rows(root: Path) -> int:
    with sqlite3.connect(root / "meta.sqlite") as db:
        return int(db.execute("SELECT count(*) FROM pending").fetchone()[0])


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "target"


def test_a_commit_made_in_memory_survives_a_crash_through_its_durable_pending_row(root: Path) -> None:
    _crash_after(root, 'lazy(2, b"two" * 100, (UID, None))')
    e = _reopen(root)
    try:
        assert e.read_committed(KEY) == (e.get(KEY), b"two" * 100)
        record = e.find_update(KEY, UID)
        assert record is not None and record.version == 2  # a retry of the update is still known
        assert e.pending(KEY) is None
    finally:
        e.close()
    assert _pending_rows(root) == 0


def test_a_reserved_version_keeps_its_row_while_other_chunks_write_theirs(root: Path) -> None:
    """The service reserves a version before storing it; storing it must not queue its own row's removal, which the
    next transaction (here another chunk's row, written while the forward is in flight) would make. Its old file
    is reused meanwhile: a lost row would leave the chunk row naming bytes that are not its own."""
    _crash_after(
        root,
        """
        p2 = as_the_service(KEY, 2, b"two" * 100, (UID, None))
        as_the_service((8, 0), 1, b"x" * 10)  # another chunk of the target, stored while KEY's forward runs
        e.commit([p2], [(UID, None)], durable=False)  # the successor acked: committed in memory, acked upstream
        reserved = e.reserve([((9, 0), 1, 1)])  # a repair's copy (no row of its own) reuses version 1's file
        e.write_pending([((9, 0), 1, 1, b"y" * 300, None)], reserved)
        """,
    )
    e = _reopen(root)
    try:
        assert e.read_committed(KEY) == (e.get(KEY), b"two" * 100)
        record = e.find_update(KEY, UID)
        assert record is not None and record.version == 2
    finally:
        e.close()


def test_a_copy_of_an_older_version_is_committed_durably(root: Path) -> None:
    """A recovery's copy may bring a version older than the committed one (the predecessor's copy is the truth):
    ``open`` would not promote it, so it is committed on disk, never in memory only."""
    _crash_after(
        root,
        """
        lazy(2, b"two" * 100)
        lazy(3, b"three" * 100)
        p = as_the_service(KEY, 2, b"copy" * 100)
        assert e.needs_durable_commit([p])
        e.commit([p], [(None, None)], durable=False)
        reserved = e.reserve([((9, 0), 1, 1)])  # a copy with no row of its own reuses version 3's file
        e.write_pending([((9, 0), 1, 1, b"y" * 400, None)], reserved)
        """,
    )
    e = _reopen(root)
    try:
        assert e.read_committed(KEY) == (e.get(KEY), b"copy" * 100)
        assert e.get(KEY).committed_version == 2  # type: ignore[union-attr]
    finally:
        e.close()


def test_the_newest_whole_version_wins_even_when_an_older_file_was_reused(root: Path) -> None:
    """Version 2's commit freed version 1's file, which version 3 then reused; none of it reached the database."""
    _crash_after(
        root,
        """
        lazy(2, b"two" * 100)
        lazy(3, b"three" * 100)
        stored(4, b"four" * 100)  # stored, not committed (its successor never answered): it may come back too
        """,
    )
    e = _reopen(root)
    try:
        assert e.read_committed(KEY) == (e.get(KEY), b"four" * 100)
        assert e.get(KEY).committed_version == 4  # type: ignore[union-attr]
    finally:
        e.close()


def test_a_pending_version_whose_file_is_not_whole_is_not_promoted(root: Path) -> None:
    _crash_after(
        root,
        """
        p = stored(2, b"two" * 100)
        with open(p.path, "r+b") as f:  # the file did not reach the disk whole
            f.write(b"torn")
        """,
    )
    e = _reopen(root)
    try:
        assert e.read_committed(KEY) == (e.get(KEY), b"one" * 100)
        assert e.get(KEY).committed_version == 1  # type: ignore[union-attr]
    finally:
        e.close()
    assert _pending_rows(root) == 0


def test_a_torn_newest_version_leaves_the_one_before_it(root: Path) -> None:
    _crash_after(
        root,
        """
        lazy(2, b"two" * 100)
        p = stored(3, b"three" * 100)
        with open(p.path, "r+b") as f:
            f.write(b"torn")
        """,
    )
    e = _reopen(root)
    try:
        assert e.read_committed(KEY) == (e.get(KEY), b"two" * 100)
    finally:
        e.close()


def test_an_aborted_version_is_not_promoted_once_its_row_is_dropped(root: Path) -> None:
    _crash_after(
        root,
        """
        e.abort([stored(2, b"two" * 100)])
        e.flush()
        """,
    )
    e = _reopen(root)
    try:
        assert e.read_committed(KEY) == (e.get(KEY), b"one" * 100)
    finally:
        e.close()


def test_a_removal_committed_in_memory_survives_a_crash(root: Path) -> None:
    _crash_after(root, "lazy(2, None)")
    e = _reopen(root)
    try:
        assert e.get(KEY) is None
    finally:
        e.close()


def test_a_durable_commit_writes_the_in_memory_ones_before_it(root: Path) -> None:
    """Order holds: chunk A's in-memory commit goes to disk in chunk B's durable transaction; no promotion needed."""
    _crash_after(
        root,
        """
        lazy(2, b"two" * 100)
        [p] = e.write_pending([((8, 0), 1, 1, b"bee" * 100, None)])
        e.commit([p])
        import sqlite3
        with sqlite3.connect(sys.argv[1] + "/meta.sqlite") as db:
            assert db.execute("SELECT count(*) FROM pending").fetchone()[0] == 0
        """,
    )
    e = _reopen(root)
    try:
        assert e.read_committed(KEY) == (e.get(KEY), b"two" * 100)
        assert e.read_committed((8, 0)) == (e.get((8, 0)), b"bee" * 100)
    finally:
        e.close()


def test_close_writes_the_commits_made_in_memory(root: Path) -> None:
    e = ChunkEngine(root, max_free_files=4, new_file_batch=1)
    e.open()
    [p] = e.write_pending([(KEY, 1, 1, b"one" * 100, None)], tags=[(UID, None)])
    e.commit([p], [(UID, None)], durable=False)
    assert _pending_rows(root) == 1  # on disk: the row; the commit is in memory only
    e.close()
    assert _pending_rows(root) == 0
    e = _reopen(root)
    try:
        assert e.read_committed(KEY) == (e.get(KEY), b"one" * 100)
        assert e.find_update(KEY, UID) is not None
    finally:
        e.close()


def test_a_flush_after_close_frees_nothing_a_reopened_engine_may_use(root: Path) -> None:
    """A flush runs in a worker thread some time after its commits (writes.py): it may run after ``close``. The
    files the closed engine's in-memory commits replaced are free in the folder's next engine; the late flush must
    not unlink them (a full free list unlinks what it is given) under that engine."""

    def write(e: ChunkEngine, key: tuple[int, int], version: int, data: bytes) -> None:
        uid = (b"c", version * 100 + key[0])
        [p] = e.write_pending([(key, version, 1, data, None)], tags=[(uid, None)])
        e.commit([p], [(uid, None)], durable=False)

    old = ChunkEngine(root, max_free_files=1, new_file_batch=1)
    old.open()
    write(old, KEY, 1, b"a" * 100)
    old.flush()
    write(old, (2, 0), 1, b"x" * 100)
    old.flush()
    write(old, KEY, 2, b"b" * 100)  # version 1's file waits for the flush
    [q] = old.write_pending([((5, 0), 1, 1, b"q" * 100, None)])
    old.abort([q])  # a given-up write: its file takes the one free place
    old.close()
    new = ChunkEngine(root, max_free_files=4, new_file_batch=1)
    new.open()
    try:
        old.flush()  # the closed engine's flush, due after its close
        write(new, (3, 0), 1, b"z" * 100)
        write(new, (4, 0), 1, b"w" * 100)  # reuses the free files: each still there
        assert new.read_committed((4, 0)) == (new.get((4, 0)), b"w" * 100)
        assert new.read_committed(KEY) == (new.get(KEY), b"b" * 100)
    finally:
        new.close()


def test_an_in_memory_commit_leaves_freeing_the_replaced_files_to_the_flush(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Freeing may stat and unlink files (past ``max_free_files``); the in-memory commit runs on the event loop."""
    e = ChunkEngine(root, max_free_files=4, new_file_batch=1)
    e.open()
    try:
        [p] = e.write_pending([(KEY, 1, 1, b"one" * 100, None)])
        e.commit([p])
        old = e.data_dir / e._files[KEY]
        freed: list[list[Path]] = []
        real = e._chunk_files.release
        monkeypatch.setattr(e._chunk_files, "release", lambda paths: (freed.append(list(paths)), real(paths)))
        [p] = e.write_pending([(KEY, 2, 1, b"two" * 100, None)], tags=[(None, None)])
        e.commit([p], [(None, None)], durable=False)
        assert old not in [path for paths in freed for path in paths]
        e.flush()
        assert old in [path for paths in freed for path in paths]
        assert e.read_committed(KEY) == (e.get(KEY), b"two" * 100)
    finally:
        e.close()
