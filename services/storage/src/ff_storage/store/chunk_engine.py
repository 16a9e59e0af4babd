"""The chunk engine of one target: chunk data in files, metadata in an embedded SQLite, never a torn chunk.

Copy-on-write (write-new-then-commit): every new version of a chunk goes to a new file; the metadata row
that points to it is committed afterwards, in one SQLite transaction with the rest of the batch; the old
file is unlinked only after that commit. A crash at any point leaves either the old or the new version
whole, and at most orphan files, which ``open`` removes.

fsync discipline: (1) each new data file is fsynced before its metadata is committed; (2) each directory
that got new files is fsynced before the commit, so the names survive a crash; (3) SQLite runs in WAL
mode with ``synchronous=FULL``, so a commit is durable when it returns. Pending versions live in memory
only: a replica that crashes loses them, and every restarted target goes through recovery anyway.

All methods block (disk I/O): the service calls them from worker threads. A lock serializes metadata.
"""

from __future__ import annotations

import mmap
import os
import sqlite3
import threading
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from ff_storage.core.chunks import ChunkKey, ChunkMeta
from ff_storage.core.errors import ChunkCorrupt
from hf3fs.checksum import crc32c_of

SCHEMA = """
CREATE TABLE IF NOT EXISTS chunks (
    inode_id INTEGER NOT NULL,
    chunk_index INTEGER NOT NULL,
    chain_version INTEGER NOT NULL,
    committed_version INTEGER NOT NULL,
    length INTEGER NOT NULL,
    checksum INTEGER NOT NULL,
    file TEXT NOT NULL,
    PRIMARY KEY (inode_id, chunk_index)
);
"""


# (key, version, chain version, content or None to remove, CRC of the content if already known)
PendingItem = tuple[ChunkKey, int, int, bytes | memoryview | None, int | None]


@dataclass(frozen=True, kw_only=True)
class Pending:
    """A version written to its own file, not yet committed."""

    key: ChunkKey
    version: int
    chain_version: int
    path: Path | None  # None: the update removes the chunk
    length: int
    checksum: int


class ChunkEngine:
    def __init__(self, root: Path, *, fsync: bool = True) -> None:
        self.root = root
        self.data_dir = root / "chunks"
        self._fsync = fsync
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._meta: dict[ChunkKey, ChunkMeta] = {}
        self._files: dict[ChunkKey, str] = {}
        self._pending: dict[ChunkKey, Pending] = {}

    # ---- open / close ----

    def open(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.root / "meta.sqlite", check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.executescript(SCHEMA)
        self._db = db
        for row in db.execute("SELECT inode_id, chunk_index, chain_version, committed_version, length, checksum, file "
                              "FROM chunks"):  # fmt: skip
            meta = ChunkMeta(inode_id=row[0], chunk_index=row[1], chain_version=row[2], committed_version=row[3],
                             length=row[4], checksum=row[5])  # fmt: skip
            self._meta[meta.key] = meta
            self._files[meta.key] = row[6]
        self._remove_orphans()

    def _remove_orphans(self) -> None:
        """Files of versions that were never committed (a crash between write and commit)."""
        live = set(self._files.values())
        for path in self.data_dir.rglob("*"):
            if path.is_file() and str(path.relative_to(self.data_dir)) not in live:
                path.unlink()

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    # ---- reads ----

    def get(self, key: ChunkKey) -> ChunkMeta | None:
        meta = self._meta.get(key)
        pending = self._pending.get(key)
        if meta is not None and pending is not None:
            return replace(meta, pending_version=pending.version)
        if meta is None and pending is not None:
            return ChunkMeta(inode_id=key[0], chunk_index=key[1], chain_version=0, committed_version=0, length=0,
                             checksum=0, pending_version=pending.version)  # fmt: skip
        return meta

    def pending(self, key: ChunkKey) -> Pending | None:
        return self._pending.get(key)

    def all_metas(self) -> list[ChunkMeta]:
        with self._lock:
            keys = set(self._meta) | set(self._pending)
            return [m for k in sorted(keys) if (m := self.get(k)) is not None]

    def committed_metas(self) -> dict[ChunkKey, ChunkMeta]:
        with self._lock:
            return dict(self._meta)

    def read_committed(self, key: ChunkKey) -> tuple[ChunkMeta, bytes] | None:
        """The committed content, verified against its checksum.

        Raises:
            ChunkCorrupt: the bytes on disk do not match the checksum.
        """
        with self._lock:
            meta, name = self._meta.get(key), self._files.get(key)
        if meta is None or name is None:
            return None
        data = _read_file(self.data_dir / name)
        if len(data) != meta.length or crc32c_of(data) != meta.checksum:
            raise ChunkCorrupt(f"chunk {key} on {self.root.name}: stored bytes do not match the checksum")
        return meta, data

    def map_committed(self, key: ChunkKey) -> tuple[ChunkMeta, memoryview] | None:
        """The committed content as a read-only view of the chunk file's pages (no copy), verified.

        Chunk files are immutable (every version is a new file), so the mapping stays valid after a newer
        version replaces the file or the file is unlinked; the pages go when the last view is dropped. A
        file truncated from outside while mapped would fault on access: nothing in the service does that.

        Raises:
            ChunkCorrupt: the bytes on disk do not match the checksum.
        """
        for attempt in range(3):
            try:
                got = self._map_current(key)
                break
            except FileNotFoundError:  # a newer version was committed and the old file unlinked meanwhile
                if attempt == 2:
                    raise
        if got is None:
            return None
        meta, data = got
        if len(data) != meta.length or crc32c_of(data) != meta.checksum:
            raise ChunkCorrupt(f"chunk {key} on {self.root.name}: stored bytes do not match the checksum")
        return meta, data

    def _map_current(self, key: ChunkKey) -> tuple[ChunkMeta, memoryview] | None:
        with self._lock:
            meta, name = self._meta.get(key), self._files.get(key)
        if meta is None or name is None:
            return None
        return meta, _map_file(self.data_dir / name)

    def read_pending(self, key: ChunkKey) -> tuple[Pending, bytes] | None:
        pending = self._pending.get(key)
        if pending is None or pending.path is None:
            return None
        return pending, _read_file(pending.path)

    def chunk_file(self, key: ChunkKey) -> Path | None:
        name = self._files.get(key)
        return self.data_dir / name if name else None

    def last_chunk(self, inode_id: int, begin: int, end: int) -> tuple[ChunkMeta | None, int, bool]:
        """The committed chunk with the highest index in [begin, end) (end 0: unbounded), the number of
        chunks there, and whether the last one has a pending version."""
        with self._lock:
            metas = [m for k, m in self._meta.items() if k[0] == inode_id and k[1] >= begin and (not end or k[1] < end)]
        if not metas:
            return None, 0, False
        last = max(metas, key=lambda m: m.chunk_index)
        return last, len(metas), last.key in self._pending

    def keys_of_inode(self, inode_id: int, begin: int, end: int) -> list[ChunkKey]:
        with self._lock:
            return sorted(k for k in self._meta if k[0] == inode_id and k[1] >= begin and (not end or k[1] < end))

    def usage(self) -> tuple[int, int]:
        with self._lock:
            return len(self._meta), sum(m.length for m in self._meta.values())

    # ---- writes ----

    def write_pending(self, items: Iterable[PendingItem]) -> list[Pending]:
        """Store new versions as pending: ``(key, version, chain version, content or None to remove, CRC)``.

        The CRC is the content's when the caller has just verified it (None: computed here). Each content
        goes to a new file, fsynced (and its directory) before this returns.
        """
        made: list[Pending] = []
        dirs: set[Path] = set()
        for key, version, chain_version, content, known_checksum in items:
            if content is None:
                made.append(Pending(key=key, version=version, chain_version=chain_version, path=None, length=0,
                                    checksum=0))  # fmt: skip
                continue
            folder = self.data_dir / f"{key[0]:016x}"
            if folder not in dirs and not folder.exists():
                folder.mkdir(parents=True, exist_ok=True)
                dirs.add(self.data_dir)
            path = folder / f"{key[1]}.{version}.{uuid.uuid4().hex[:8]}"
            _write_file(path, content, self._fsync)
            dirs.add(folder)
            checksum = crc32c_of(content) if known_checksum is None else known_checksum
            made.append(Pending(key=key, version=version, chain_version=chain_version, path=path, length=len(content),
                                checksum=checksum))  # fmt: skip
        if self._fsync:
            for folder in dirs:
                _fsync_dir(folder)
        with self._lock:
            for p in made:
                old = self._pending.get(p.key)
                if old is not None and old.path is not None and old.path != p.path:
                    old.path.unlink(missing_ok=True)
                self._pending[p.key] = p
        return made

    def commit(self, pendings: Iterable[Pending]) -> list[ChunkMeta | None]:
        """Make pending versions the committed ones, in one transaction; then drop the old files."""
        todo = list(pendings)
        old_files: list[Path] = []
        results: list[ChunkMeta | None] = []
        with self._lock:
            assert self._db is not None, "engine is closed"
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                for p in todo:
                    if p.path is None:
                        db.execute("DELETE FROM chunks WHERE inode_id=? AND chunk_index=?", p.key)
                        continue
                    name = str(p.path.relative_to(self.data_dir))
                    db.execute(
                        "INSERT OR REPLACE INTO chunks VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (p.key[0], p.key[1], p.chain_version, p.version, p.length, p.checksum, name),
                    )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            for p in todo:
                old = self._files.get(p.key)
                if p.path is None:
                    self._meta.pop(p.key, None)
                    self._files.pop(p.key, None)
                    results.append(None)
                else:
                    name = str(p.path.relative_to(self.data_dir))
                    meta = ChunkMeta(inode_id=p.key[0], chunk_index=p.key[1], chain_version=p.chain_version,
                                     committed_version=p.version, length=p.length, checksum=p.checksum)  # fmt: skip
                    self._meta[p.key], self._files[p.key] = meta, name
                    results.append(meta)
                if old is not None and (p.path is None or old != str(p.path.relative_to(self.data_dir))):
                    old_files.append(self.data_dir / old)
                if self._pending.get(p.key) is p:
                    del self._pending[p.key]
        for path in old_files:
            path.unlink(missing_ok=True)
        return results

    def abort(self, pendings: Iterable[Pending]) -> None:
        """Forget pending versions that will not be committed."""
        with self._lock:
            for p in pendings:
                if self._pending.get(p.key) is p:
                    del self._pending[p.key]
                    if p.path is not None:
                        p.path.unlink(missing_ok=True)

    def iter_keys(self) -> Iterator[ChunkKey]:
        with self._lock:
            keys = sorted(self._meta)
        yield from keys


def _read_file(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _map_file(path: Path) -> memoryview:
    """The whole file as a read-only memoryview of a shared mapping, its pages faulted in at once."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return memoryview(b"")
        return memoryview(mmap.mmap(fd, size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=mmap.PROT_READ))
    finally:
        os.close(fd)


def _write_file(path: Path, content: bytes | memoryview, fsync: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(content)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
