"""Query evaluation (pure): last value or rate at each step, aggregation across series, histogram quantiles.

Every tier gives a series as rows (time, value, increase): raw samples, or buckets counted at their end.
At step t the window is (t - lookback, t]: the value is the last row's in it, the rate the sum of the
increases of its rows divided by the lookback (so a rate over whole buckets is the same in every tier).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate

from ff_telemetry.core.model import Aggregation, Labels, Point, RangeQuery, SeriesResult


@dataclass(frozen=True)
class Row:
    """One stored point of a series: its value, and its increase since the point before (counters)."""

    at: float
    value: float
    increase: float


@dataclass(frozen=True)
class SeriesRows:
    """One series' rows for a query, in time order."""

    name: str
    labels: Labels
    rows: Sequence[Row]  # time order


class _Window:
    """Answers "last value" and "increase" over windows of one series' rows by binary search."""

    def __init__(self, rows: Sequence[Row]) -> None:
        self._ats = [r.at for r in rows]
        self._values = [r.value for r in rows]
        self._sums = [0.0, *accumulate(r.increase for r in rows)]

    def _span(self, t: float, lookback_s: float) -> tuple[int, int]:
        return bisect.bisect_right(self._ats, t - lookback_s), bisect.bisect_right(self._ats, t)

    def last(self, t: float, lookback_s: float) -> float | None:
        lo, hi = self._span(t, lookback_s)
        return self._values[hi - 1] if hi > lo else None

    def increase(self, t: float, lookback_s: float) -> float | None:
        lo, hi = self._span(t, lookback_s)
        return self._sums[hi] - self._sums[lo] if hi > lo else None


def _series_points(rows: Sequence[Row], query: RangeQuery) -> list[Point]:
    """The query's points of one series: the last value (or the rate) at each step, steps without data left out."""
    window, lookback = _Window(rows), query.effective_lookback_s
    points = []
    for t in query.steps():
        if query.rate:
            inc = window.increase(t, lookback)
            value = None if inc is None else inc / lookback
        else:
            value = window.last(t, lookback)
        if value is not None:
            points.append(Point(t, value))
    return points


def evaluate(series: Iterable[SeriesRows], query: RangeQuery) -> list[SeriesResult]:
    """The answer to a last-value or rate query, aggregated as the query asks."""
    per_series = [SeriesResult(s.name, s.labels, tuple(_series_points(s.rows, query))) for s in series]
    if query.aggregation is Aggregation.NONE:
        return [s for s in per_series if s.points]
    groups: dict[Labels, list[SeriesResult]] = {}
    for s in per_series:
        groups.setdefault(_group_key(s.labels, query.group_by), []).append(s)
    return [_aggregate(query.name, key, members, query.aggregation) for key, members in sorted(groups.items())]


def _group_key(labels: Labels, group_by: Sequence[str]) -> Labels:
    mapping = dict(labels)
    return tuple((name, mapping.get(name, "")) for name in sorted(group_by))


def _aggregate(name: str, key: Labels, members: list[SeriesResult], how: Aggregation) -> SeriesResult:
    by_step: dict[float, list[float]] = {}
    for s in members:
        for p in s.points:
            by_step.setdefault(p.at, []).append(p.value)
    points = tuple(Point(at, _combine(values, how)) for at, values in sorted(by_step.items()))
    return SeriesResult(name, key, points)


def _combine(values: list[float], how: Aggregation) -> float:
    if how is Aggregation.SUM:
        return math.fsum(values)
    if how is Aggregation.AVG:
        return math.fsum(values) / len(values)
    if how is Aggregation.MIN:
        return min(values)
    if how is Aggregation.MAX:
        return max(values)
    return float(len(values))


def histogram_quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """Prometheus' histogram_quantile over cumulative bucket counts by upper bound (``le``).

    None without a +Inf bucket or without observations. Linear interpolation inside the bucket holding
    the rank; the lowest bucket starts at 0 (if its bound is positive); in the +Inf bucket, the highest
    finite bound.
    """
    bounds = sorted(buckets)
    if not bounds or bounds[-1] != math.inf:
        return None
    total = buckets[math.inf]
    if total <= 0:
        return None
    rank = q * total
    counts = [buckets[b] for b in bounds]
    i = next(i for i, c in enumerate(counts) if c >= rank)
    if bounds[i] == math.inf:
        return bounds[-2] if len(bounds) > 1 else None
    lower = bounds[i - 1] if i > 0 else min(0.0, bounds[0])
    below = counts[i - 1] if i > 0 else 0.0
    in_bucket = counts[i] - below
    if in_bucket <= 0:
        return bounds[i]
    return lower + (bounds[i] - lower) * (rank - below) / in_bucket


def quantile_series(series: Iterable[SeriesRows], query: RangeQuery) -> list[SeriesResult]:
    """Quantile of a histogram's _bucket series at each step, buckets summed per group_by combination."""
    groups: dict[Labels, list[tuple[float, _Window]]] = {}
    for s in series:
        labels = dict(s.labels)
        try:
            le = float(labels["le"])
        except (KeyError, ValueError):
            continue
        groups.setdefault(_group_key(s.labels, query.group_by), []).append((le, _Window(s.rows)))
    lookback, results = query.effective_lookback_s, []
    for key, members in sorted(groups.items()):
        points = []
        for t in query.steps():
            counts: dict[float, float] = {}
            for le, window in members:
                counts[le] = counts.get(le, 0.0) + (window.increase(t, lookback) or 0.0)
            value = histogram_quantile(query.quantile, counts)
            if value is not None:
                points.append(Point(t, value))
        if points:
            results.append(SeriesResult(query.name, key, tuple(points)))
    return results
