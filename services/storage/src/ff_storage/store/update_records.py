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
    for update_id in update_ids:
        records.pop(update_id, None)
        records[update_id] = UpdateRecord(
            update_id=update_id, version=version, length=length, checksum=checksum, committed_at_ms=now_ms
        )
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
    """A chunk's records after a commit of ``version`` with ``tag``: all of them, the ones that go, the new ones."""
    update_id, inherited = tag
    base = before if inherited is None else {r.update_id: r for r in inherited}
    ids = [] if update_id is None else [update_id]
    records = with_updates(base, ids, version=version, length=length, checksum=checksum, now_ms=now_ms, keep=keep)
    gone = [r for k, r in before.items() if records.get(k) is not r]
    added = [r for k, r in records.items() if before.get(k) is not r]
    return records, gone, added


def prune(records: dict[UpdateKey, UpdateRecord], cutoff_ms: int, max_records: int) -> None:
    """Forget the oldest records: those committed before ``cutoff_ms``, and any beyond ``max_records``."""
    while records:
        oldest = next(iter(records))
        if len(records) <= max_records and records[oldest].committed_at_ms >= cutoff_ms:
            return
        del records[oldest]
