"""The downsampling and retention job: raw -> 1-minute -> 1-hour buckets, then old rows deleted.

Each run computes the whole buckets between a tier's watermark (or the earliest late sample since)
and ``now - lag``, replacing what was there, then moves the watermark. The value before the first
bucket comes from the 1-minute tier's last bucket before it (every older raw sample is in that tier).
Raw blocks are deleted only once all their samples are downsampled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import CursorResult, Table, delete, func, select, tuple_
from sqlalchemy.orm import Session

from ff_telemetry.core.downsample import Bucket, bucket_start, downsample_arrays, roll_up
from ff_telemetry.core.model import HOUR, MINUTE, Kind
from ff_telemetry.store import blocks, schema
from ff_telemetry.store.rows import from_db, to_db

# How far back the value before a pass is looked for: a counter silent for longer starts over at 0.
PREVIOUS_HORIZON_S = 86_400.0


@dataclass(frozen=True, kw_only=True)
class Retention:
    """How long each tier keeps its data (seconds): raw samples, 1-minute and 1-hour buckets."""

    raw_s: float = 86_400.0
    minute_s: float = 14 * 86_400.0
    hour_s: float = 400 * 86_400.0
    # Buckets are made this long after they end, so that in-flight pushes land first.
    lag_s: float = 120.0


@dataclass(frozen=True)
class JobReport:
    """What one retention pass did."""

    num_minute_buckets: int
    num_hour_buckets: int
    num_raw_deleted: int
    num_series_deleted: int
    # The pass stopped at MAX_PASS_S of raw samples: run another.
    more: bool = False

    def __add__(self, other: JobReport) -> JobReport:
        return JobReport(
            self.num_minute_buckets + other.num_minute_buckets,
            self.num_hour_buckets + other.num_hour_buckets,
            self.num_raw_deleted + other.num_raw_deleted,
            self.num_series_deleted + other.num_series_deleted,
            other.more,
        )


# One pass reads at most this much raw time (a collector catching up after a stop does it in slices, so
# its memory stays bounded); whole minutes.
MAX_PASS_S = 900.0


def run_job(session: Session, now: float, retention: Retention) -> JobReport:
    """One pass of downsampling and retention (one transaction)."""
    minute_until = bucket_start(now - retention.lag_s, MINUTE)
    num_minute, done_until = _downsample_raw(session, minute_until)
    num_hour = _roll_up_minutes(session, bucket_start(done_until, HOUR))
    num_raw, num_series = _expire(session, now, retention, done_until)
    return JobReport(num_minute, num_hour, num_raw, num_series, more=done_until < minute_until)


def _window(session: Session, tier: str, until: float, first: float | None) -> float | None:
    """Where this tier's pass starts (None: nothing to do), creating its watermark row if missing."""
    table = schema.watermarks
    row = session.execute(select(table.c.done_until, table.c.dirty_since).where(table.c.tier == tier)).first()
    if row is None:
        start = first if first is not None else until
        session.execute(table.insert().values(tier=tier, done_until=start, dirty_since=None))
        return start if start < until else None
    start = row.done_until if row.dirty_since is None else min(row.done_until, row.dirty_since)
    return float(start) if start < until else None


def _advance(session: Session, tier: str, until: float) -> None:
    table = schema.watermarks
    session.execute(table.update().where(table.c.tier == tier).values(done_until=until, dirty_since=None))


def _downsample_raw(session: Session, until: float) -> tuple[int, float]:
    """The 1-minute buckets made, and the time up to which they now are."""
    first = blocks.earliest(session)
    start = _window(session, "1m", until, None if first is None else bucket_start(first, MINUTE))
    if start is None:
        return 0, _done_until(session, "1m", until)
    start = bucket_start(start, MINUTE)
    until = min(until, start + MAX_PASS_S)
    raw = blocks.read(session, start, until, closed_low=True)
    ids = np.unique(raw.series_ids).tolist()
    kinds = _kinds(session, ids)
    known = np.isin(raw.series_ids, np.asarray(list(kinds), dtype=np.int64))  # not of a deleted series
    previous = _last_before(session, schema.samples_1m, ids, start)
    buckets = downsample_arrays(raw.series_ids[known], raw.ats[known], raw.values[known], kinds, previous, MINUTE)
    _replace(session, schema.samples_1m, start, until, buckets)
    _advance(session, "1m", until)
    _mark_dirty(session, "1h", start)
    return sum(len(b) for b in buckets.values()), until


def _done_until(session: Session, tier: str, default: float) -> float:
    table = schema.watermarks
    value = session.execute(select(table.c.done_until).where(table.c.tier == tier)).scalar()
    return default if value is None else min(default, float(value))


def _roll_up_minutes(session: Session, until: float) -> int:
    first = session.execute(select(func.min(schema.samples_1m.c.start))).scalar()
    start = _window(session, "1h", until, None if first is None else bucket_start(float(first), HOUR))
    if start is None:
        return 0
    start = bucket_start(start, HOUR)
    tier = schema.samples_1m
    rows = session.execute(
        select(tier).where(tier.c.start >= start, tier.c.start < until).order_by(tier.c.series_id, tier.c.start)
    ).all()
    minutes: dict[int, list[Bucket]] = {}
    for r in rows:
        minutes.setdefault(int(r.series_id), []).append(_bucket_of(r))
    buckets = {sid: roll_up(b, HOUR) for sid, b in minutes.items()}
    _replace(session, schema.samples_1h, start, until, buckets)
    _advance(session, "1h", until)
    return sum(len(b) for b in buckets.values())


def _mark_dirty(session: Session, tier: str, since: float) -> None:
    table = schema.watermarks
    row = session.execute(select(table.c.done_until, table.c.dirty_since).where(table.c.tier == tier)).first()
    if row is not None and since < row.done_until and (row.dirty_since is None or since < row.dirty_since):
        session.execute(table.update().where(table.c.tier == tier).values(dirty_since=since))


def _bucket_of(r: Any) -> Bucket:  # a row of samples_1m
    return Bucket(
        start=float(r.start),
        count=int(r.count),
        sum=from_db(r.sum),
        min=from_db(r.min),
        max=from_db(r.max),
        last=from_db(r.last),
        increase=from_db(r.increase),
    )


def _kinds(session: Session, ids: list[int]) -> dict[int, Kind]:
    table, kinds = schema.series, {}
    for i in range(0, len(ids), 900):
        stmt = select(table.c.series_id, table.c.kind).where(table.c.series_id.in_(ids[i : i + 900]))
        kinds.update({int(sid): Kind(k) for sid, k in session.execute(stmt)})
    return kinds


def _last_before(session: Session, tier: Table, ids: list[int], before: float) -> dict[int, float]:
    """Each series' last value in its latest bucket of ``tier`` that starts before ``before``."""
    latest = (
        select(tier.c.series_id, func.max(tier.c.start).label("start"))
        .where(tier.c.start < before, tier.c.start >= before - PREVIOUS_HORIZON_S)
        .group_by(tier.c.series_id)
        .subquery()
    )
    stmt = select(tier.c.series_id, tier.c.last).where(
        tuple_(tier.c.series_id, tier.c.start).in_(select(latest.c.series_id, latest.c.start))
    )
    wanted = set(ids)
    return {int(sid): from_db(last) for sid, last in session.execute(stmt) if int(sid) in wanted}


def _replace(session: Session, tier: Table, start: float, until: float, buckets: dict[int, list[Bucket]]) -> None:
    session.execute(delete(tier).where(tier.c.start >= start, tier.c.start < until))
    rows = [_bucket_row(sid, b) for sid, bs in buckets.items() for b in bs]
    if rows:
        session.execute(tier.insert(), rows)


def _bucket_row(series_id: int, b: Bucket) -> dict[str, object]:
    return {
        "series_id": series_id,
        "start": b.start,
        "count": b.count,
        "sum": to_db(b.sum),
        "min": to_db(b.min),
        "max": to_db(b.max),
        "last": to_db(b.last),
        "increase": to_db(b.increase),
    }


def _expire(session: Session, now: float, retention: Retention, downsampled_until: float) -> tuple[int, int]:
    num_raw = blocks.expire(session, min(now - retention.raw_s, downsampled_until))
    session.execute(delete(schema.samples_1m).where(schema.samples_1m.c.start < now - retention.minute_s))
    session.execute(delete(schema.samples_1h).where(schema.samples_1h.c.start < now - retention.hour_s))
    series = schema.series
    num_series = _rowcount(session.execute(delete(series).where(series.c.last_at < now - retention.hour_s)))
    return num_raw, num_series


def _rowcount(result: object) -> int:
    return int(result.rowcount) if isinstance(result, CursorResult) else 0
