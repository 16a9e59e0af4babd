"""Where a target's chunk versions live on disk (``ChunkFiles``, held by its ``ChunkEngine``): files, writes, maps.

Copy-on-write (write-new-then-commit) over recycled files: every new version of a chunk is written to a
file that holds no live version (a free file left by an earlier version, else a new one); the metadata row
that points to it is committed afterwards, in one SQLite transaction with the rest of the batch; the file of
the replaced version becomes free only after that commit. A crash at any point leaves either the old or the
new version whole; files no committed row names are free when ``open`` runs again.

Why recycle: a chunk write then overwrites blocks the file system already allocated. A new file per
version allocated blocks on every write and freed the old version's on every commit, and on a disk mounted
with online discard each free is a TRIM inside the next journal commit, which every fsync waits for: on
the dev VM 4 MiB new-file-and-unlink writes ran at 0.9 GB/s against 2.3 GB/s for overwrites. A free file is
reused only when no reader maps it (mappings are tracked by weak references, and taken under the lock that
hands out free files), so a read never sees a file change under it. At most ``max_free_files`` free files
are kept; more are unlinked.

fsync discipline: (1) each new version's data is on disk before its metadata is committed: ``fdatasync`` for
an overwrite of the same size (the file's blocks and size do not change), ``fsync`` otherwise; (2) a new
file's folder is fsynced before the commit, and a new folder's parent before any file goes in it, so the names
survive a crash (new files are made ``new_file_batch`` at a time, empty, in one folder fsynced once before any
of them is written; the others wait in the free list, so a stream of new small chunks pays one folder fsync
per batch; the files of one batch are fsynced at once, from a few threads, so a batch of many small chunks
waits for about one journal commit) (``open`` fsyncs every folder once, for whatever an earlier crash left; a
new file whose write failed is unlinked, not kept as free); (3), the metadata's, is ``chunk_engine``'s.

This module holds ``ChunkFiles`` (the free list, new-file batches, writing contents, mappings), the file
helpers it uses, and ``Pending`` and ``PendingItem`` (what it writes and makes; ``chunk_engine`` exports them
too). ``ChunkFiles`` shares its engine's lock (the free list, the known folders, new mappings) and never takes
the engine's database lock, which is taken before that lock when both are.
"""

from __future__ import annotations

import mmap
import os
import threading
import uuid
import weakref
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ff_fsprotocol.checksum import crc32c_of
from ff_storage.core.chunks import ChunkKey

SYNC_THREADS = 8  # files of one write_pending batch fsynced at once
MAX_NEW_FILES = 1024  # new files made at once for one write batch
# A new file is made with up to this many - 1 more (empty, free), in one folder fsynced once for all of them: a
# stream of new small chunks pays one folder fsync per batch instead of one each.
NEW_FILE_BATCH = 16


# (key, version, chain version, content or None to remove, CRC of the content if already known)
PendingItem = tuple[ChunkKey, int, int, bytes | memoryview | None, int | None]


@dataclass(frozen=True, kw_only=True)
class Pending:
    """A version not yet committed: written to its own file, or only reserved (in flight, being written)."""

    key: ChunkKey
    version: int
    chain_version: int
    path: Path | None  # None: the update removes the chunk (or, reserved, nothing is written yet)
    length: int
    checksum: int
    stored: bool = True  # False: reserved; reads answer "pending" but there is no content to read yet


class ChunkFiles:
    """The files of one target's chunk versions under ``data_dir`` (see the module doc); thread-safe, blocking.

    ``lock`` is the engine's: it guards the free list, the known folders and new mappings here, and the
    engine's metadata with them (``map_locked`` is called with it held).
    """

    def __init__(
        self,
        data_dir: Path,
        lock: threading.Lock,
        *,
        fsync: bool,
        max_free_files: int,
        new_file_batch: int,
    ) -> None:
        self.data_dir = data_dir
        self._lock = lock
        self._fsync = fsync
        self._max_free = max_free_files
        self._new_batch = max(1, new_file_batch)
        self._free: dict[str, int] = {}  # file name (relative to data_dir) -> size; no version lives in it
        self._durable_dirs: set[Path] = set()  # folders whose own entry is known to be on disk
        self._maps: weakref.WeakValueDictionary[str, mmap.mmap] = weakref.WeakValueDictionary()

    def open(self, live: set[str]) -> None:
        """Make the names a crash left durable, then collect the free files: those not in ``live`` (committed)."""
        if self._fsync:  # whatever a crash left: names on disk before any of these files is reused
            for folder in [self.data_dir, *(d for d in self.data_dir.iterdir() if d.is_dir())]:
                _fsync_dir(folder)
        self._durable_dirs = {d for d in self.data_dir.iterdir() if d.is_dir()}
        self._collect_free(live)

    def _collect_free(self, live: set[str]) -> None:
        """Files no committed row names (replaced versions, or a crash between write and commit) are free."""
        for path in sorted(self.data_dir.rglob("*")):
            name = str(path.relative_to(self.data_dir))
            if not path.is_file() or name in live:
                continue
            if len(self._free) < self._max_free:
                self._free[name] = path.stat().st_size
            else:
                path.unlink()

    def map_locked(self, name: str) -> memoryview:
        """A read-only view of the whole file, sharing a mapping other readers already hold (lock held)."""
        mapped = self._maps.get(name)
        if mapped is None:
            fd = os.open(self.data_dir / name, os.O_RDONLY)
            try:
                size = os.fstat(fd).st_size
                if size == 0:
                    return memoryview(b"")
                mapped = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=mmap.PROT_READ)
            finally:
                os.close(fd)
            self._maps[name] = mapped
        return memoryview(mapped)

    def write_contents(
        self, items: list[PendingItem], alongside: Callable[[list[Pending]], None] | None = None
    ) -> list[Pending]:
        """Each content into a free file (or a new one), on disk with the new files' names; nothing installed.

        ``alongside`` (given the versions) runs while the files are synced, and must succeed too.
        """
        made: list[Pending] = []
        written: list[Path] = []  # free files taken: back to the free list if this fails
        created: list[Path] = []  # new files: unlinked instead (their names may not be on disk yet)
        to_sync: list[tuple[Path, Callable[[int], None]]] = []
        todo = list(items)
        try:
            for i, (key, version, chain_version, content, known_checksum) in enumerate(todo):
                if content is None:
                    made.append(
                        Pending(key=key, version=version, chain_version=chain_version, path=None, length=0, checksum=0)
                    )
                    continue
                with self._lock:
                    name = self._take_free(len(content))
                if name is None and self._new_batch > 1:  # enough new files for the rest of the batch at once
                    name = self._new_files(sum(1 for item in todo[i:] if item[3] is not None))
                if name is None:
                    path = self.data_dir / self._new_name()
                    created.append(path)
                    _write_file(path, content, os.O_CREAT | os.O_EXCL, sync=None)
                    to_sync.append((path, os.fsync))
                else:
                    path = self.data_dir / name
                    written.append(path)
                    same_size = os.stat(path).st_size == len(content)
                    _write_file(path, content, 0, sync=None)
                    to_sync.append((path, os.fdatasync if same_size else os.fsync))
                checksum = crc32c_of(content) if known_checksum is None else known_checksum
                made.append(
                    Pending(
                        key=key,
                        version=version,
                        chain_version=chain_version,
                        path=path,
                        length=len(content),
                        checksum=checksum,
                    )
                )
            side = None if alongside is None else _sync_pool().submit(alongside, made)
            try:
                if self._fsync:
                    _sync_files(to_sync)
                    for folder in sorted({p.parent for p in created}):
                        _fsync_dir(folder)
            finally:
                if side is not None:
                    side.result()
        except BaseException:
            for path in created:
                path.unlink(missing_ok=True)
            self.release(written)
            raise
        return made

    def _take_free(self, size: int) -> str | None:
        """A free file no reader maps, one of ``size`` bytes if there is one (lock held)."""
        fallback = None
        for name, have in self._free.items():
            if name in self._maps:
                continue
            if have == size:
                del self._free[name]
                return name
            fallback = fallback or name
        if fallback is not None:
            del self._free[fallback]
        return fallback

    def _new_files(self, want: int = 1) -> str | None:
        """A new empty file, made with more that go to the free list; None when the free list is full.

        Up to ``new_file_batch`` - 1 more are made (or ``want`` - 1, for the rest of one write batch, up to
        ``MAX_NEW_FILES``), all in one folder whose entries are on disk (one fsync of it) before any is used.
        When None, the caller makes one file alone.
        """
        with self._lock:
            count = max(min(self._new_batch, self._max_free - len(self._free) + 1), min(want, MAX_NEW_FILES))
        if count < 2:
            return None
        first = self._new_name()
        folder = first.split("/", 1)[0]
        names = [first, *(f"{folder}/{uuid.uuid4().hex[:24]}" for _ in range(count - 1))]
        made: list[str] = []
        try:
            for name in names:
                os.close(os.open(self.data_dir / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
                made.append(name)
            if self._fsync:
                _fsync_dir(self.data_dir / folder)
        except BaseException:
            for name in made:
                (self.data_dir / name).unlink(missing_ok=True)
            raise
        with self._lock:
            self._free.update((name, 0) for name in names[1:])
        return first

    def _new_name(self) -> str:
        """A fresh file name in a folder whose entry is on disk (made and fsynced here if it is new)."""
        tag = uuid.uuid4().hex[:24]
        folder = self.data_dir / tag[:2]
        if folder not in self._durable_dirs:
            folder.mkdir(parents=True, exist_ok=True)
            if self._fsync:
                _fsync_dir(self.data_dir)
            with self._lock:
                self._durable_dirs.add(folder)
        return f"{tag[:2]}/{tag}"

    def release(self, paths: Iterable[Path]) -> None:
        """Files that no longer hold a live version: free, or unlinked past ``max_free_files``."""
        extra: list[Path] = []
        with self._lock:
            for path in paths:
                if len(self._free) < self._max_free and path.exists():
                    self._free[str(path.relative_to(self.data_dir))] = path.stat().st_size
                else:
                    extra.append(path)
        for path in extra:
            path.unlink(missing_ok=True)


def _write_file(path: Path, content: bytes | memoryview, flags: int, sync: Callable[[int], None] | None) -> None:
    """Write ``content`` as the whole file from offset 0 (over the blocks it has), then ``sync`` it."""
    fd = os.open(path, os.O_WRONLY | flags, 0o600)
    try:
        view, offset = memoryview(content), 0
        while offset < len(view):
            offset += os.pwrite(fd, view[offset:], offset)
        if os.fstat(fd).st_size != len(view):
            os.ftruncate(fd, len(view))
        if sync is not None:
            sync(fd)
    finally:
        os.close(fd)


def _sync_file(item: tuple[Path, Callable[[int], None]]) -> None:
    path, sync = item
    fd = os.open(path, os.O_WRONLY)
    try:
        sync(fd)
    finally:
        os.close(fd)


def _sync_files(items: Sequence[tuple[Path, Callable[[int], None]]]) -> None:
    """Sync (fsync or fdatasync) the files written for one batch, several at once.

    The file system's journal takes concurrent syncs in one commit, so a batch of many small chunks waits for
    about one journal commit instead of one per chunk (a stream of small files written back in batches: issue
    16).
    """
    if len(items) <= 1:
        for item in items:
            _sync_file(item)
        return
    list(_sync_pool().map(_sync_file, items))


_POOL: list[ThreadPoolExecutor] = []
_POOL_LOCK = threading.Lock()


def _sync_pool() -> ThreadPoolExecutor:
    with _POOL_LOCK:
        if not _POOL:
            _POOL.append(ThreadPoolExecutor(max_workers=SYNC_THREADS, thread_name_prefix="ff-storage-fsync"))
        return _POOL[0]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
