"""Reads for queries: the series that match (and that the viewer may see), their rows from a tier."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Select, Table, select
from sqlalchemy.orm import Session

from ff_telemetry.core.downsample import step_increase
from ff_telemetry.core.evaluate import Row, SeriesRows
from ff_telemetry.core.model import HOUR, MINUTE, RAW, Kind, Matcher, MetricType, SeriesInfo, matches_all
from ff_telemetry.store import blocks, schema
from ff_telemetry.store.rows import chunks, from_db, labels_from_json

# For a rate at the first step, the raw sample before the window is looked for this far back.
PREVIOUS_SAMPLE_HORIZON_S = 60.0
# A raw query decoding more samples than this (every series' in its window) is refused: ask a tier.
MAX_RAW_SAMPLES_READ = 20_000_000


@dataclass(frozen=True)
class Viewer:
    """Whose series a query sees: ``user`` None sees all (admins, the cluster), else the cluster's and theirs."""

    user: str | None

    @classmethod
    def everything(cls) -> Viewer:
        """A viewer of every series (admins, the cluster, the alert rules)."""
        return cls(None)


def _visible(stmt: Select[tuple[object, ...]], viewer: Viewer) -> Select[tuple[object, ...]]:
    if viewer.user is None:
        return stmt
    return stmt.where(schema.series.c.owner.in_(["", viewer.user]))


def find_series(
    session: Session,
    name: str,
    matchers: tuple[Matcher, ...],
    viewer: Viewer,
    *,
    active_from: float | None = None,
    after_id: int = 0,
    limit: int | None = None,
) -> list[SeriesInfo]:
    """Series of ``name`` (every name if "") matching every matcher, in id order."""
    t = schema.series
    stmt = select(t).where(t.c.series_id > after_id).order_by(t.c.series_id)
    if name:
        stmt = stmt.where(t.c.name == name)
    if active_from is not None:
        stmt = stmt.where(t.c.last_at >= active_from)
    found = []
    for r in session.execute(_visible(stmt, viewer)):
        labels = labels_from_json(r.labels)
        if matches_all(matchers, dict(labels)):
            info = SeriesInfo(
                series_id=int(r.series_id),
                name=str(r.name),
                labels=labels,
                kind=Kind(r.kind),
                type=MetricType(r.type),
                first_at=float(r.first_at),
                last_at=float(r.last_at),
            )
            found.append(info)
            if limit is not None and len(found) >= limit:
                break
    return found


def rows_for(
    session: Session,
    series: list[SeriesInfo],
    resolution_s: float,
    lo: float,
    hi: float,
    max_raw_samples: int = MAX_RAW_SAMPLES_READ,
) -> list[SeriesRows]:
    """The rows of ``series`` in (lo, hi] from one tier (buckets count at their end).

    LimitExceeded when the raw tier would decode more than ``max_raw_samples``.
    """
    if resolution_s == RAW:
        by_id = _raw_rows(session, series, lo, hi, max_raw_samples)
    else:
        by_id = _bucket_rows(
            session,
            schema.samples_1m if resolution_s == MINUTE else schema.samples_1h,
            [s.series_id for s in series],
            resolution_s,
            lo,
            hi,
        )
    return [SeriesRows(s.name, s.labels, by_id.get(s.series_id, [])) for s in series]


def _raw_rows(
    session: Session, series: list[SeriesInfo], lo: float, hi: float, max_samples: int
) -> dict[int, list[Row]]:
    """Raw rows in (lo, hi]; each row's increase is from the sample before it.

    The sample before is looked for up to PREVIOUS_SAMPLE_HORIZON_S before the window.
    """
    kinds = {s.series_id: s.kind for s in series}
    points = blocks.read(session, lo - PREVIOUS_SAMPLE_HORIZON_S, hi, kinds, max_samples=max_samples).by_series()
    out: dict[int, list[Row]] = {}
    for sid, pts in points.items():
        previous: float | None = None
        rows = []
        for at, value in pts:
            if at > lo:
                rows.append(Row(at, value, step_increase(previous, value, kinds[sid])))
            previous = value
        if rows:
            out[sid] = rows
    return out


def _bucket_rows(
    session: Session, tier: Table, ids: list[int], width_s: float, lo: float, hi: float
) -> dict[int, list[Row]]:
    out: dict[int, list[Row]] = {}
    for part in chunks(ids):
        stmt = (
            select(tier.c.series_id, tier.c.start, tier.c.last, tier.c.increase)
            .where(tier.c.series_id.in_(part), tier.c.start > lo - width_s, tier.c.start <= hi - width_s)
            .order_by(tier.c.series_id, tier.c.start)
        )
        for sid, start, last, inc in session.execute(stmt):
            out.setdefault(int(sid), []).append(Row(float(start) + width_s, from_db(last), from_db(inc)))
    return out


def choose_resolution(
    requested: float, start_at: float, span_s: float, now: float, raw_s: float, minute_s: float, raw_span_s: float
) -> float:
    """The requested tier, or the finest that still holds ``start_at``, raw only for spans up to ``raw_span_s``.

    A raw read decodes every series' samples of the window.
    """
    if requested:
        return requested
    if start_at >= now - raw_s and span_s <= raw_span_s:
        return RAW
    return MINUTE if start_at >= now - minute_s else HOUR
