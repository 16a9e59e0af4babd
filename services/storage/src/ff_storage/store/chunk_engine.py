"""The chunk engine of one target: chunk data in files, metadata in an embedded SQLite, never a torn chunk.

This module holds the metadata side: the committed versions, their update ids and the pending versions (in
memory and in SQLite), commits and reads. Where the versions' contents live on disk is ``chunk_files``
(``ChunkFiles``, which the engine holds): copy-on-write over recycled files, new-file batches, writing and
syncing contents, mappings. Each new version is written to a file that holds no live version and is on disk
before the row that names it is committed; the file of the replaced version is free only after that commit.

Pending versions: ``reserve`` marks a version pending before its content is written (reads answer
"pending" from then on), ``write_pending`` stores it in place of its reservation (``PendingReplaced`` if a
newer update took the reservation over meanwhile, which the service's chunk locks keep from happening),
``commit`` makes it the committed version (only the current pending one: a stale one raises
``PendingReplaced``), ``abort`` drops it. They live in memory only: a replica that crashes loses them, and
every restarted target goes through recovery anyway; but for durable pending versions, whose rows
``write_pending`` writes too when given their tags: those a commit need not wait for the disk for
(``commit(durable=False)``), and ``open`` promotes them after a crash (``pending_rows``).

fsync discipline: the files' data and new names are on disk before a commit (``chunk_files``); SQLite runs in
WAL mode with ``synchronous=FULL``, so a commit is durable when it returns.

The methods that touch the disk (writes, commits, mappings) block: the service calls them from worker
threads. The metadata-only ones (``get``, ``reserve``, ``abort``, ``commit(durable=False)``) are cheap and
also run on its event loop, where they may wait for the lock while a commit holds it. A lock serializes
metadata, the free list and new mappings (``ChunkFiles`` shares it); another the database connection (taken
first when both are; ``ChunkFiles`` never takes it).
"""

from __future__ import annotations

import functools
import logging
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ff_fsprotocol.checksum import crc32c_of
from ff_storage.core.chunks import ChunkKey, ChunkMeta, UpdateKey, UpdateRecord
from ff_storage.core.errors import ChunkCorrupt, PendingReplaced
from ff_storage.store import pending_rows, update_records
from ff_storage.store.chunk_files import NEW_FILE_BATCH, ChunkFiles, Pending, PendingItem
from ff_storage.store.pending_rows import Op
from ff_storage.store.update_records import UpdateTag

# ``Pending`` and ``PendingItem`` live in ``chunk_files``; the service imports them from here.
__all__ = ["ChunkEngine", "Pending", "PendingItem", "UpdateTag"]

logger = logging.getLogger(__name__)

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
CREATE TABLE IF NOT EXISTS update_ids (
    inode_id INTEGER NOT NULL,
    chunk_index INTEGER NOT NULL,
    client_id BLOB NOT NULL,
    request_id INTEGER NOT NULL,
    version INTEGER NOT NULL,
    length INTEGER NOT NULL,
    checksum INTEGER NOT NULL,
    committed_at_ms INTEGER NOT NULL,
    PRIMARY KEY (inode_id, chunk_index, client_id, request_id)
);
"""

SWEEP_EVERY_COMMITS = 1024


class ChunkEngine:
    """One target's chunks on disk (see the module doc); thread-safe, its methods block (call them off the loop)."""

    def __init__(
        self,
        root: Path,
        *,
        fsync: bool = True,
        max_free_files: int = 64,
        update_id_ttl_s: float = 120.0,
        max_update_ids_per_chunk: int = 1024,
        new_file_batch: int = NEW_FILE_BATCH,
    ) -> None:
        self.root = root
        self._keep = update_records.Retention(int(update_id_ttl_s * 1000), max_update_ids_per_chunk)
        self._recent: dict[ChunkKey, dict[UpdateKey, UpdateRecord]] = {}  # oldest first
        self._commits = 0
        self.data_dir = root / "chunks"
        self._lock = threading.Lock()
        self._db_lock = threading.Lock()  # the database connection (taken before ``_lock`` when both are)
        self._unwritten: list[Op] = []  # commits made in memory, not yet written (``commit(durable=False)``)
        self._to_release: list[Path] = []  # the files those commits replaced, freed by ``flush``
        self._rows_of: dict[ChunkKey, set[int]] = {}  # versions with a durable pending row not yet dropped
        self._sweep_due = False
        # Group commit: commits waiting while one is written (``_waiting``) go in the next transaction together.
        self._group = threading.Condition(threading.Lock())
        self._waiting: list[_Commit] = []
        self._committing = False
        self.transactions = 0  # commit transactions written (group commit: fewer than ``commit`` calls)
        self._db: sqlite3.Connection | None = None
        self._meta: dict[ChunkKey, ChunkMeta] = {}
        self._by_inode: dict[int, set[int]] = {}  # inode id -> chunk indexes in _meta (a file's chunks at once)
        self._files: dict[ChunkKey, str] = {}
        self._pending: dict[ChunkKey, Pending] = {}
        # The versions' files: the free list, new files, writes and mappings, under ``_lock`` too.
        self._chunk_files = ChunkFiles(
            self.data_dir, self._lock, fsync=fsync, max_free_files=max_free_files, new_file_batch=new_file_batch
        )

    # ---- open / close ----

    def open(self) -> None:
        """Open (or create) the target's folder: load the committed metadata and update ids, collect free files."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.root / "meta.sqlite", check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.executescript(SCHEMA + pending_rows.SCHEMA)
        self._db = db
        for row in db.execute(
            "SELECT inode_id, chunk_index, chain_version, committed_version, length, checksum, file FROM chunks"
        ):
            meta = ChunkMeta(
                inode_id=row[0],
                chunk_index=row[1],
                chain_version=row[2],
                committed_version=row[3],
                length=row[4],
                checksum=row[5],
            )
            self._meta[meta.key] = meta
            self._by_inode.setdefault(meta.inode_id, set()).add(meta.chunk_index)
            self._files[meta.key] = row[6]
        rows = db.execute(
            "SELECT inode_id, chunk_index, client_id, request_id, version, length, checksum, "
            "committed_at_ms FROM update_ids ORDER BY committed_at_ms, version"
        )
        for row in rows:
            rec = UpdateRecord(
                update_id=(bytes(row[2]), row[3]),
                version=row[4],
                length=row[5],
                checksum=row[6],
                committed_at_ms=row[7],
            )
            self._recent.setdefault((row[0], row[1]), {})[rec.update_id] = rec
        self._promote(db)
        self._chunk_files.open(set(self._files.values()))

    def _promote(self, db: sqlite3.Connection) -> None:
        """Make each chunk's newest whole pending version newer than its committed one committed (``pending_rows``).

        Then no pending row is left: a version not promoted is dropped, and its file is free.
        """
        candidates = pending_rows.newest_first(db)
        if not candidates:
            return
        now_ms = int(time.time() * 1000)
        ops: list[Op] = []
        promoted = 0
        with self._lock:
            for key, rows in candidates.items():
                meta = self._meta.get(key)
                committed = meta.committed_version if meta else 0
                best = next((c for c in rows if c.version > committed and c.whole(self.data_dir)), None)
                if best is None:
                    continue
                p = Pending(
                    key=key,
                    version=best.version,
                    chain_version=best.chain_version,
                    path=None if best.file is None else self.data_dir / best.file,
                    length=best.length,
                    checksum=best.checksum,
                )
                records, more = self._commit_ops([p], [best.tag], now_ms)
                self._install([p], records, [])
                ops += more
                promoted += 1
            self._rows_of.clear()
        ops.append(("DELETE FROM pending", ()))
        self._run_in_transaction(db, ops)
        if promoted:
            logger.warning("%s: %d pending version(s) left by a crash, whole on disk, committed", self.root, promoted)

    def close(self) -> None:
        """Write what is committed in memory only, then close the database.

        Pending versions are lost, but for durable ones, which the next ``open`` promotes.
        """
        with self._db_lock, self._lock:
            if self._db is not None:
                if self._unwritten:
                    self._run_in_transaction(self._db, self._unwritten)
                    self._unwritten = []
                self._db.close()
                self._db = None
            # replaced files no committed row names: the next ``open`` finds them free; a flush due after this
            # must not free them (another engine may have opened the folder and listed them already)
            self._to_release = []

    # ---- reads ----

    def get(self, key: ChunkKey) -> ChunkMeta | None:
        """The chunk's committed metadata with its pending version, if any, in one consistent look.

        A commit moving a version from pending to committed in between two looks would otherwise hide a new chunk.
        """
        with self._lock:
            return self._get_locked(key)

    def _get_locked(self, key: ChunkKey) -> ChunkMeta | None:
        meta = self._meta.get(key)
        pending = self._pending.get(key)
        if meta is not None and pending is not None:
            return replace(meta, pending_version=pending.version)
        if meta is None and pending is not None:
            return ChunkMeta(
                inode_id=key[0],
                chunk_index=key[1],
                chain_version=0,
                committed_version=0,
                length=0,
                checksum=0,
                pending_version=pending.version,
            )
        return meta

    def pending(self, key: ChunkKey) -> Pending | None:
        """The chunk's pending version, stored or only reserved, if it has one."""
        return self._pending.get(key)

    def all_metas(self) -> list[ChunkMeta]:
        """Every chunk's metadata by key, chunks with only a pending version too (what recovery diffs)."""
        with self._lock:
            keys = set(self._meta) | set(self._pending)
            return [m for k in sorted(keys) if (m := self._get_locked(k)) is not None]

    def committed_metas(self) -> dict[ChunkKey, ChunkMeta]:
        """A snapshot of every committed chunk's metadata by key."""
        with self._lock:
            return dict(self._meta)

    def read_committed(self, key: ChunkKey) -> tuple[ChunkMeta, bytes] | None:
        """The committed content (a copy), verified against its checksum.

        Raises:
            ChunkCorrupt: the bytes on disk do not match the checksum.
        """
        got = self.map_committed(key)
        return None if got is None else (got[0], bytes(got[1]))

    def map_committed(self, key: ChunkKey) -> tuple[ChunkMeta, memoryview] | None:
        """The committed content as a read-only view of the chunk file's pages (no copy), verified.

        While the view (or anything made from it) lives, its file is not reused, even after a newer version
        replaced it; a file changed from outside while mapped (a damaged disk, a test) fails the check.

        Raises:
            ChunkCorrupt: the bytes on disk do not match the checksum.
        """
        with self._lock:
            meta, name = self._meta.get(key), self._files.get(key)
            if meta is None or name is None:
                return None
            data = self._chunk_files.map_locked(name)
        if len(data) != meta.length or crc32c_of(data) != meta.checksum:
            raise ChunkCorrupt(f"chunk {key} on {self.root.name}: stored bytes do not match the checksum")
        return meta, data

    def read_pending(self, key: ChunkKey) -> tuple[Pending, memoryview] | None:
        """The pending version's content, a view of its file (not reused while the view lives).

        None when there is no pending version, or it removes the chunk, or it is only reserved.
        """
        with self._lock:
            pending = self._pending.get(key)
            if pending is None or pending.path is None:
                return None
            return pending, self._chunk_files.map_locked(str(pending.path.relative_to(self.data_dir)))

    def _forget_index(self, key: ChunkKey) -> None:
        indexes = self._by_inode.get(key[0])
        if indexes is not None:
            indexes.discard(key[1])
            if not indexes:
                del self._by_inode[key[0]]

    def _indexes(self, inode_id: int, begin: int, end: int) -> list[int]:
        """The chunk indexes of ``inode_id`` in [begin, end) (end 0: unbounded), from the per-inode index.

        A Close's length query then costs the file's chunks, not every chunk of the target. Lock held.
        """
        return [i for i in self._by_inode.get(inode_id, ()) if i >= begin and (not end or i < end)]

    def last_chunk(self, inode_id: int, begin: int, end: int) -> tuple[ChunkMeta | None, int, bool]:
        """The committed chunk with the highest index in [begin, end) (end 0: unbounded), with two facts.

        Also returns the number of chunks there, and whether the last one has a pending version.
        """
        with self._lock:
            metas = [self._meta[(inode_id, i)] for i in self._indexes(inode_id, begin, end)]
        if not metas:
            return None, 0, False
        last = max(metas, key=lambda m: m.chunk_index)
        return last, len(metas), last.key in self._pending

    def keys_of_inode(self, inode_id: int, begin: int, end: int) -> list[ChunkKey]:
        """The committed chunks of ``inode_id`` in [begin, end) (end 0: unbounded), by index."""
        with self._lock:
            return sorted((inode_id, i) for i in self._indexes(inode_id, begin, end))

    def usage(self) -> tuple[int, int]:
        """``(number of committed chunks, their bytes)``."""
        with self._lock:
            return len(self._meta), sum(m.length for m in self._meta.values())

    # ---- update ids ----

    def find_update(self, key: ChunkKey, update_id: UpdateKey) -> UpdateRecord | None:
        """The remembered update of ``key`` with this id (committed here), if any."""
        with self._lock:
            return self._recent.get(key, {}).get(update_id)

    def update_at(self, key: ChunkKey, version: int) -> UpdateRecord | None:
        """The remembered update that created ``version`` of ``key``, if any."""
        with self._lock:
            return next((r for r in self._recent.get(key, {}).values() if r.version == version), None)

    def recent_updates(self, key: ChunkKey) -> list[UpdateRecord]:
        """The remembered updates of ``key``, oldest first (what a full-chunk replace carries along)."""
        with self._lock:
            return list(self._recent.get(key, {}).values())

    def records_after(
        self, key: ChunkKey, update_ids: Sequence[UpdateKey], version: int, length: int, checksum: int
    ) -> list[UpdateRecord]:
        """The records of ``key`` as a commit of ``version`` made by each of ``update_ids`` would leave them.

        Oldest first, pruned as a commit prunes: what a full-chunk replace standing for those updates carries
        (``length`` and ``checksum``: the chunk's after it).
        """
        now_ms = int(time.time() * 1000)
        with self._lock:
            base = dict(self._recent.get(key, {}))
        return list(
            update_records.with_updates(
                base, update_ids, version=version, length=length, checksum=checksum, now_ms=now_ms, keep=self._keep
            ).values()
        )

    def num_update_records(self) -> int:
        """How many update records the target remembers, over all chunks."""
        with self._lock:
            return sum(len(r) for r in self._recent.values())

    # ---- writes ----

    def reserve(self, items: Iterable[tuple[ChunkKey, int, int]]) -> list[Pending]:
        """Mark ``(key, version, chain version)`` pending before the content is written.

        From here on reads of the chunk answer "pending", as at every replica that already has the version.
        ``write_pending`` with these reservations stores the content, ``abort`` drops them.
        """
        made = [
            Pending(key=k, version=v, chain_version=cv, path=None, length=0, checksum=0, stored=False)
            for k, v, cv in items
        ]
        replaced: list[Path] = []
        with self._lock:
            for p in made:
                old = self._pending.get(p.key)
                if old is not None and old.path is not None:
                    replaced.append(old.path)  # left by an update that was given up
                self._pending[p.key] = p
                if old is not None:
                    self._drop_rows([(old.key, old.version)])
        self._chunk_files.release(replaced)
        return made

    def write_pending(
        self,
        items: Iterable[PendingItem],
        reserved: Sequence[Pending] | None = None,
        tags: Sequence[UpdateTag] | None = None,
    ) -> list[Pending]:
        """Store new versions as pending: ``(key, version, chain version, content or None to remove, CRC)``.

        The CRC is the content's when the caller has just verified it (None: computed here). Each content
        goes to a free file (or a new one) and is on disk, with the names of new files, before this returns.
        With ``reserved`` (``reserve``'s answer for the same items, in order), each version replaces its
        reservation, and only if that still stands. With ``tags`` (one per item, as ``commit`` takes them), the
        versions are durable pending ones: their rows are on disk too, and ``open`` promotes them after a crash
        (``pending_rows``), so ``commit(durable=False)`` may commit them.

        Raises:
            PendingReplaced: a reservation was replaced meanwhile (a newer update of the chunk took over);
                nothing of this call stays pending.
        """
        todo = list(items)
        if tags is not None and len(tags) != len(todo):
            raise ValueError(f"{len(tags)} tags for {len(todo)} items")
        try:
            made = self._chunk_files.write_contents(
                todo, None if tags is None else functools.partial(self._record_pending, tags)
            )
        except BaseException:
            with self._lock:
                self._drop_rows([(item[0], item[1]) for item in todo])
            raise
        if reserved is not None and len(reserved) != len(made):
            raise ValueError(f"{len(reserved)} reservations for {len(made)} items")
        dropped: list[Path] = []
        stale = False
        with self._lock:
            if reserved is not None and any(self._pending.get(r.key) is not r for r in reserved):
                stale = True
                dropped = [p.path for p in made if p.path is not None]
                for r in reserved:
                    if self._pending.get(r.key) is r:
                        del self._pending[r.key]
            else:
                for p in made:
                    old = self._pending.get(p.key)
                    if old is not None and old.path is not None and old.path != p.path:
                        dropped.append(old.path)
                    self._pending[p.key] = p
                    if old is not None:
                        self._drop_rows([(old.key, old.version)])
            if stale:
                self._drop_rows([(p.key, p.version) for p in made])
        self._chunk_files.release(dropped)
        if stale:
            raise PendingReplaced(f"{self.root.name}: a newer update took over while these were being written")
        return made

    def _record_pending(self, tags: Sequence[UpdateTag], made: list[Pending]) -> None:
        """Write the rows of durable pending versions, in a transaction synced to disk.

        It runs while their files are synced: a row whose file did not reach the disk is not promoted (its CRC).
        """
        ops = [
            pending_rows.insert_op(
                p.key,
                p.version,
                p.chain_version,
                p.length,
                p.checksum,
                None if p.path is None else str(p.path.relative_to(self.data_dir)),
                tag,
            )
            for p, tag in zip(made, tags, strict=True)
        ]
        self._write_ops(ops, durable=True)
        with self._lock:
            for p in made:
                self._rows_of.setdefault(p.key, set()).add(p.version)

    def _drop_rows(self, versions: Iterable[tuple[ChunkKey, int]]) -> None:
        """Queue the removal of the durable rows of versions that will not be committed (lock held).

        Not of the chunk's current pending version: a row of that key and version is its own (written again
        for it, or about to be), and goes with its commit or its abort.
        """
        for key, version in versions:
            current = self._pending.get(key)
            if current is not None and current.version == version:
                continue
            rows = self._rows_of.get(key)
            if rows is not None and version in rows:
                rows.discard(version)
                if not rows:
                    del self._rows_of[key]
                self._unwritten.append(pending_rows.delete_one_op(key, version))

    def flush(self) -> None:
        """Write what ``commit(durable=False)`` committed in memory (without waiting for the disk).

        Then free the files those commits replaced.
        """
        if self._unwritten:
            self._write_ops([], durable=False)
        with self._lock:
            old_files, self._to_release = self._to_release, []
        self._chunk_files.release(old_files)
        if self._sweep_due:
            self._sweep_due = False
            self.forget_expired_updates()

    def _write_ops(self, ops: list[Op], *, durable: bool) -> None:
        """Run what is unwritten, then ``ops``, in one transaction; synced to disk when ``durable``."""
        with self._db_lock:
            with self._lock:
                if self._db is None:
                    if durable:
                        raise RuntimeError(f"{self.root.name}: engine is closed")
                    return  # ``close`` wrote what was unwritten
                db, queued, self._unwritten = self._db, self._unwritten, []
            if not queued and not ops:
                return
            try:
                self._run_in_transaction(db, queued + ops, durable=durable)
            except BaseException:
                with self._lock:
                    self._unwritten[:0] = queued
                raise

    @staticmethod
    def _run_in_transaction(db: sqlite3.Connection, ops: list[Op], *, durable: bool = True) -> None:
        if not durable:  # WAL: the commit is on disk at the next synced one, or the checkpoint
            db.execute("PRAGMA synchronous=NORMAL")
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                pending_rows.run(db, ops)
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        finally:
            if not durable:
                db.execute("PRAGMA synchronous=FULL")

    def commit(
        self, pendings: Iterable[Pending], tags: Sequence[UpdateTag] | None = None, *, durable: bool = True
    ) -> list[ChunkMeta | None]:
        """Make pending versions the committed ones, in one transaction with the updates' ids; then free old files.

        ``tags`` has one entry per pending version: see ``UpdateTag``. Commits that come while another is being
        written go together in the next transaction (group commit: one WAL sync for all of them, each durable
        when its call returns, as alone); one whose versions are no longer pending fails alone.

        ``durable=False`` (for versions ``write_pending`` stored with their tags, durable pending ones): the commit
        is made in memory at once and its rows are written later (``flush``, or any transaction before), not
        waited for; it does not block on the disk, so the event loop may call it. A crash before they are written
        leaves the versions pending on disk, and ``open`` promotes them.

        Raises:
            PendingReplaced: a version to commit is no longer the pending one (nothing of this call commits).
        """
        todo = list(pendings)
        tags = list(tags) if tags is not None else [(None, None)] * len(todo)
        if len(tags) != len(todo):
            raise ValueError(f"{len(tags)} tags for {len(todo)} pending versions")
        if not durable and not self.needs_durable_commit(todo):
            return self._commit_in_memory(todo, tags)
        mine = _Commit(todo, tags)
        with self._group:
            self._waiting.append(mine)
        while True:
            with self._group:
                while not mine.done and self._committing:
                    self._group.wait()
                if mine.done:
                    break
                self._committing = True  # lead the next group: whoever waits (this one too, unless it must wait)
                group, self._waiting = _one_per_chunk(self._waiting)
            try:
                self._commit_group(group)
            except BaseException:
                if mine in group:  # its error is set too
                    raise
            finally:
                with self._group:
                    self._committing = False
                    self._group.notify_all()
        if mine.error is not None:
            raise mine.error
        return mine.results

    def needs_durable_commit(self, pendings: Iterable[Pending]) -> bool:
        """Whether a version to commit is not newer than the committed one (a recovery's copy of an older one).

        ``open`` promotes only versions newer than the committed one: committed in memory only, such a version
        would free the newer version's file while the committed row on disk still names it. ``commit(durable=False)``
        commits these durably (it blocks then: a caller on the event loop asks first).
        """
        with self._lock:
            return any(p.version <= getattr(self._meta.get(p.key), "committed_version", 0) for p in pendings)

    def _still_pending(self, group: list[_Commit]) -> list[_Commit]:
        """The commits of ``group`` whose versions are all still the pending ones; the others fail (lock held)."""
        ready = []
        for c in group:
            if any(self._pending.get(p.key) is not p or not p.stored for p in c.todo):
                c.error = PendingReplaced(f"{self.root.name}: a version to commit is no longer the pending one")
            else:
                ready.append(c)
        return ready

    def _commit_in_memory(self, todo: list[Pending], tags: list[UpdateTag]) -> list[ChunkMeta | None]:
        old_files: list[Path] = []
        with self._lock:
            assert self._db is not None, "engine is closed"
            if any(self._pending.get(p.key) is not p or not p.stored for p in todo):
                raise PendingReplaced(f"{self.root.name}: a version to commit is no longer the pending one")
            records, ops = self._commit_ops(todo, tags, int(time.time() * 1000))
            results = self._install(todo, records, old_files)
            self._unwritten += ops
            self._to_release += old_files  # by ``flush``: freeing may stat and unlink, not on the caller's loop
        self._commits += 1
        if self._commits % SWEEP_EVERY_COMMITS == 0:
            self._sweep_due = True
        return results

    def _commit_group(self, group: list[_Commit]) -> None:
        """Commit each of ``group`` (no two touch one chunk) in one transaction; their outcomes in their ``_Commit``."""
        old_files: list[Path] = []
        now_ms = int(time.time() * 1000)
        try:
            with self._db_lock, self._lock:
                assert self._db is not None, "engine is closed"
                ready = self._still_pending(group)
                if ready:
                    queued, self._unwritten = self._unwritten, []  # earlier in-memory commits go first
                    ops = list(queued)
                    records = []
                    for c in ready:
                        recs, more = self._commit_ops(c.todo, c.tags, now_ms)
                        records.append(recs)
                        ops += more
                    try:
                        self._run_in_transaction(self._db, ops)
                        self.transactions += 1
                    except BaseException:
                        self._unwritten[:0] = queued
                        raise
                    for c, recs in zip(ready, records, strict=True):
                        c.results = self._install(c.todo, recs, old_files)
        except BaseException as exc:
            for c in group:
                if c.error is None and not c.results and c.todo:
                    c.error = exc
            raise
        finally:
            for c in group:
                c.done = True
        self._chunk_files.release(old_files)
        self._commits += len(group)
        if self._commits // SWEEP_EVERY_COMMITS != (self._commits - len(group)) // SWEEP_EVERY_COMMITS:
            self.forget_expired_updates()

    def _install(
        self, todo: list[Pending], records: dict[ChunkKey, dict[UpdateKey, UpdateRecord]], old_files: list[Path]
    ) -> list[ChunkMeta | None]:
        """The in-memory side of a commit whose rows are durable (lock held); the replaced files go to ``old_files``."""
        results: list[ChunkMeta | None] = []
        self._recent.update(records)
        for key in [k for k, r in records.items() if not r]:
            del self._recent[key]
        for p in todo:
            old = self._files.get(p.key)
            if p.path is None:
                self._meta.pop(p.key, None)
                self._files.pop(p.key, None)
                self._forget_index(p.key)
                results.append(None)
            else:
                name = str(p.path.relative_to(self.data_dir))
                meta = ChunkMeta(
                    inode_id=p.key[0],
                    chunk_index=p.key[1],
                    chain_version=p.chain_version,
                    committed_version=p.version,
                    length=p.length,
                    checksum=p.checksum,
                )
                self._meta[p.key], self._files[p.key] = meta, name
                self._by_inode.setdefault(p.key[0], set()).add(p.key[1])
                results.append(meta)
            if old is not None and (p.path is None or old != str(p.path.relative_to(self.data_dir))):
                old_files.append(self.data_dir / old)
            if self._pending.get(p.key) is p:
                del self._pending[p.key]
        return results

    def _commit_ops(
        self, todo: list[Pending], tags: list[UpdateTag], now_ms: int
    ) -> tuple[dict[ChunkKey, dict[UpdateKey, UpdateRecord]], list[Op]]:
        """The SQL of a commit (lock held): the chunks' records after it, and the statements to run."""
        records: dict[ChunkKey, dict[UpdateKey, UpdateRecord]] = {}
        ops: list[Op] = []
        for p, tag in zip(todo, tags, strict=True):
            if p.path is None:
                ops.append(("DELETE FROM chunks WHERE inode_id=? AND chunk_index=?", p.key))
            else:
                name = str(p.path.relative_to(self.data_dir))
                ops.append(
                    (
                        "INSERT OR REPLACE INTO chunks VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (p.key[0], p.key[1], p.chain_version, p.version, p.length, p.checksum, name),
                    )
                )
            rows = self._rows_of.get(p.key)
            if rows is not None:  # its durable pending row, and any older one, go with the commit
                ops.append(pending_rows.delete_op(p.key, p.version))
                rows.difference_update([v for v in rows if v <= p.version])
                if not rows:
                    del self._rows_of[p.key]
            if tag == (None, None):
                continue
            after, gone, added = update_records.after_commit(
                self._recent.get(p.key, {}),
                tag,
                version=p.version,
                length=p.length,
                checksum=p.checksum,
                now_ms=now_ms,
                keep=self._keep,
            )
            records[p.key] = after
            ops += [
                (
                    "DELETE FROM update_ids WHERE inode_id=? AND chunk_index=? AND client_id=? AND request_id=?",
                    (*p.key, *r.update_id),
                )
                for r in gone
            ]
            ops += [
                (
                    "INSERT OR REPLACE INTO update_ids VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (*p.key, *r.update_id, r.version, r.length, r.checksum, r.committed_at_ms),
                )
                for r in added
            ]
        return records, ops

    def forget_expired_updates(self) -> int:
        """Drop every remembered update older than the ttl (commits prune only their own chunks)."""
        cutoff = int(time.time() * 1000) - self._keep.ttl_ms
        with self._lock:
            if self._db is None:
                return 0
            stale = [k for k, r in self._recent.items() if r and next(iter(r.values())).committed_at_ms < cutoff]
            for key in stale:
                update_records.prune(self._recent[key], cutoff, self._keep.max_records)
                if not self._recent[key]:
                    del self._recent[key]
        # after what is still unwritten, which may add rows as old as that
        self._write_ops([("DELETE FROM update_ids WHERE committed_at_ms < ?", (cutoff,))], durable=False)
        return len(stale)

    def abort(self, pendings: Iterable[Pending]) -> None:
        """Forget pending versions that will not be committed."""
        dropped: list[Path] = []
        with self._lock:
            for p in pendings:
                if self._pending.get(p.key) is p:
                    del self._pending[p.key]
                    self._drop_rows([(p.key, p.version)])
                    if p.path is not None:
                        dropped.append(p.path)
        self._chunk_files.release(dropped)

    def iter_keys(self) -> Iterator[ChunkKey]:
        """The committed chunks' keys in order, as of the call."""
        with self._lock:
            keys = sorted(self._meta)
        yield from keys


@dataclass(eq=False)
class _Commit:
    """One ``commit`` call in a group commit: what it commits, and (once ``done``) its results or error."""

    todo: list[Pending]
    tags: list[UpdateTag]
    done: bool = False
    results: list[ChunkMeta | None] = field(default_factory=list)
    error: BaseException | None = None


def _one_per_chunk(waiting: list[_Commit]) -> tuple[list[_Commit], list[_Commit]]:
    """The commits of one group (none shares a chunk with an earlier one of it) and those left for the next."""
    group: list[_Commit] = []
    rest: list[_Commit] = []
    keys: set[ChunkKey] = set()
    for c in waiting:
        mine = {p.key for p in c.todo}
        if keys & mine:
            rest.append(c)
        else:
            group.append(c)
            keys |= mine
    return group, rest
