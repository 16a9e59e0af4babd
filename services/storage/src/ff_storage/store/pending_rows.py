"""Durable pending versions: what lets a replica acknowledge an update before its commit is on disk.

A replica that passes an update on (the head and the middle of a chain) writes the new version's file and a row
naming it (``pending``: key, version, file, length, CRC, the update's id and inherited records) to disk while
the forward runs, and acknowledges once the successor did. Its commit (the ``chunks`` row, the update ids, the
pending row's removal) is then made in memory at once and written without an fsync of its own
(``ChunkEngine.commit(durable=False)``): the next durable transaction or the write-ahead log's checkpoint takes
it to disk. An acknowledged update is so on disk at every replica, committed at the tail and at least pending
elsewhere, after about one fsync in the chain instead of one commit per replica in a row.

After a crash, ``promote`` (at ``ChunkEngine.open``) makes the newest pending version of each chunk that is newer
than its committed one, and whose file is whole (its length and CRC as the row says), the committed version. A
version that was still in flight may so come back as committed at one replica; a restarted target goes through
recovery, which syncs it from its predecessor, and when it is the chain's last serving copy its content is one
the chain could have had (the writer's call had not returned). A version whose file a later write reused is not
whole and is skipped: the newer version that freed it has a durable row of its own.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ff_fsprotocol.checksum import crc32c_of
from ff_storage.core.chunks import ChunkKey, UpdateRecord
from ff_storage.store.update_records import UpdateTag

SCHEMA = """
CREATE TABLE IF NOT EXISTS pending (
    inode_id INTEGER NOT NULL,
    chunk_index INTEGER NOT NULL,
    version INTEGER NOT NULL,
    chain_version INTEGER NOT NULL,
    length INTEGER NOT NULL,
    checksum INTEGER NOT NULL,
    file TEXT,
    client_id BLOB,
    request_id INTEGER,
    records TEXT,
    PRIMARY KEY (inode_id, chunk_index, version)
);
"""

# An SQL statement and its parameters, run later in a transaction of the engine's.
Op = tuple[str, tuple[object, ...]]


def insert_op(
    key: ChunkKey, version: int, chain_version: int, length: int, checksum: int, file: str | None, tag: UpdateTag
) -> Op:
    """The row of a pending version (``file`` None: the update removes the chunk)."""
    update_id, records = tag
    encoded = None if records is None else json.dumps([_record_fields(r) for r in records])
    client_id, request_id = update_id if update_id is not None else (None, None)
    return (
        "INSERT OR REPLACE INTO pending VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (*key, version, chain_version, length, checksum, file, client_id, request_id, encoded),
    )


def delete_op(key: ChunkKey, version: int) -> Op:
    """Drop the rows of ``key`` up to ``version``: it is committed, or it will not be."""
    return "DELETE FROM pending WHERE inode_id=? AND chunk_index=? AND version<=?", (*key, version)


def delete_one_op(key: ChunkKey, version: int) -> Op:
    """Drop the row of one version that will not be committed (an abort)."""
    return "DELETE FROM pending WHERE inode_id=? AND chunk_index=? AND version=?", (*key, version)


def run(db: sqlite3.Connection, ops: Sequence[Op]) -> None:
    """Run ``ops`` in order (a transaction open)."""
    for sql, params in ops:
        db.execute(sql, params)


@dataclass(frozen=True)
class Candidate:
    """A pending row read back at open: a version that may be promoted."""

    key: ChunkKey
    version: int
    chain_version: int
    length: int
    checksum: int
    file: str | None  # None: the update removes the chunk
    tag: UpdateTag

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> Candidate:
        """The candidate of a ``pending`` row, its columns in table order."""
        update_id = None if row[7] is None else (bytes(row[7]), int(row[8]))
        records = None if row[9] is None else [_record(f) for f in json.loads(row[9])]
        return cls((row[0], row[1]), row[2], row[3], row[4], row[5], row[6], (update_id, records))

    def whole(self, data_dir: Path) -> bool:
        """Whether the version's file holds what the row says (a removal is always whole)."""
        if self.file is None:
            return True
        try:
            data = (data_dir / self.file).read_bytes()
        except OSError:
            return False
        return len(data) == self.length and crc32c_of(data) == self.checksum


def newest_first(db: sqlite3.Connection) -> dict[ChunkKey, list[Candidate]]:
    """Every pending row, by chunk, newest version first."""
    out: dict[ChunkKey, list[Candidate]] = {}
    for row in db.execute(
        "SELECT inode_id, chunk_index, version, chain_version, length, checksum, file, client_id, request_id, records "
        "FROM pending ORDER BY inode_id, chunk_index, version DESC"
    ):
        c = Candidate.from_row(row)
        out.setdefault(c.key, []).append(c)
    return out


def _record_fields(r: UpdateRecord) -> list[object]:
    return [r.update_id[0].hex(), r.update_id[1], r.version, r.length, r.checksum, r.committed_at_ms]


def _record(f: list[Any]) -> UpdateRecord:
    client_id, request_id, version, length, checksum, at_ms = f
    return UpdateRecord(
        update_id=(bytes.fromhex(client_id), request_id),
        version=version,
        length=length,
        checksum=checksum,
        committed_at_ms=at_ms,
    )
