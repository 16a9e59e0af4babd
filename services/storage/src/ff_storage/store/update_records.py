"""The update ids a chunk remembers (exactly once under retries): each with the version it made, oldest first.

Pure functions over a chunk's records (``ChunkEngine`` keeps them in memory and in ``update_ids``): what a commit
leaves of them, and what a full-chunk replace standing for some updates carries.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ff_storage.core.chunks import UpdateKey, UpdateRecord

# What a commit records per version: the update's id (None: none) and, for a full-chunk replace from a predecessor,
# the records that replace the chunk's (None: keep them).
UpdateTag = tuple[UpdateKey | None, Sequence[UpdateRecord] | None]


@dataclass(frozen=True)
class Retention:
    """How long a chunk remembers an update, and how many at most."""

    ttl_ms: int
    max_records: int


def with_updates(
    base: Mapping[UpdateKey, UpdateRecord],
    update_ids: Iterable[UpdateKey],
    *,
    version: int,
    length: int,
    checksum: int,
    now_ms: int,
    keep: Retention,
) -> dict[UpdateKey, UpdateRecord]:
    """``base`` after ``version`` (the chunk then ``length`` bytes, ``checksum``) was made by each of ``update_ids``.

    Each id's record moves to the end (the newest); then the records are pruned (``prune``).
    """
    records = dict(base)
    _record(records, update_ids, version, length, checksum, now_ms)
    prune(records, now_ms - keep.ttl_ms, keep.max_records)
    return records


def after_commit(
    before: Mapping[UpdateKey, UpdateRecord],
    tag: UpdateTag,
    *,
    version: int,
    length: int,
    checksum: int,
    now_ms: int,
    keep: Retention,
) -> tuple[dict[UpdateKey, UpdateRecord], list[UpdateRecord], list[UpdateRecord]]:
    """A chunk's records after a commit of ``version`` with ``tag``: all of them, the ones that go, the new ones.

    A commit that keeps the chunk's records costs what it changes, not what the chunk remembers (up to
    ``max_records``: a chunk rewritten by every transaction of a database keeps that many).
    """
    update_id, inherited = tag
    ids = [] if update_id is None else [update_id]
    if inherited is not None:  # a full-chunk replace: its records stand for the chunk's
        base = {r.update_id: r for r in inherited}
        records = with_updates(base, ids, version=version, length=length, checksum=checksum, now_ms=now_ms, keep=keep)
        gone = [r for k, r in before.items() if records.get(k) is not r]
        added = [r for k, r in records.items() if before.get(k) is not r]
        return records, gone, added
    records = dict(before)
    gone = _record(records, ids, version, length, checksum, now_ms)
    gone += prune(records, now_ms - keep.ttl_ms, keep.max_records)
    added = [r for r in (records.get(k) for k in ids) if r is not None and before.get(r.update_id) is not r]
    return records, [r for r in gone if before.get(r.update_id) is r], added


def _record(
    records: dict[UpdateKey, UpdateRecord],
    update_ids: Iterable[UpdateKey],
    version: int,
    length: int,
    checksum: int,
    now_ms: int,
) -> list[UpdateRecord]:
    """Each id's new record put last in ``records``; the records they replace."""
    replaced = []
    for update_id in update_ids:
        old = records.pop(update_id, None)
        if old is not None:
            replaced.append(old)
        records[update_id] = UpdateRecord(
            update_id=update_id, version=version, length=length, checksum=checksum, committed_at_ms=now_ms
        )
    return replaced


def prune(records: dict[UpdateKey, UpdateRecord], cutoff_ms: int, max_records: int) -> list[UpdateRecord]:
    """Forget the oldest records: those committed before ``cutoff_ms``, and any beyond ``max_records``; those."""
    forgotten = []
    while records:
        oldest = next(iter(records))
        if len(records) <= max_records and records[oldest].committed_at_ms >= cutoff_ms:
            break
        forgotten.append(records.pop(oldest))
    return forgotten
