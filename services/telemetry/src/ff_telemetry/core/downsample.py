"""Downsampling math (pure): raw samples into fixed-width buckets, and buckets into wider ones.

A bucket keeps count, sum, min, max and last of its samples, and the series' increase within it: the
change from the sample before each of its samples (for counters a drop is a reset: the increase is
the new value). Since every sample's increase lands in exactly one bucket, the increase over any span
of whole buckets is the same in every tier: that is what keeps a counter's totals.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ff_telemetry.core.model import Kind


@dataclass(frozen=True)
class Bucket:
    """One downsampled interval of one series from ``start`` (unix seconds): the aggregates of its raw points."""

    start: float
    count: int
    sum: float
    min: float
    max: float
    last: float
    increase: float


def step_increase(previous: float | None, value: float, kind: Kind) -> float:
    """What a sample adds to its series: 0 for the first one, a counter reset restarts from 0."""
    if previous is None or math.isnan(previous) or math.isnan(value):
        return 0.0
    if kind is Kind.COUNTER and value < previous:
        return value
    return value - previous


def bucket_start(at: float, width_s: float) -> float:
    """The start of the ``width_s`` bucket that holds time ``at`` (buckets are aligned on multiples of the width)."""
    return math.floor(at / width_s) * width_s


def downsample(
    points: Sequence[tuple[float, float]], previous: float | None, width_s: float, kind: Kind
) -> list[Bucket]:
    """Buckets of one series' raw points (time order); ``previous`` is the value just before them."""
    if not points:
        return []
    ats, values = zip(*points, strict=True)
    buckets = downsample_arrays(
        np.zeros(len(points), dtype=np.int64),
        np.asarray(ats, dtype=np.float64),
        np.asarray(values, dtype=np.float64),
        {0: kind},
        {} if previous is None else {0: previous},
        width_s,
    )
    return buckets[0]


def downsample_arrays(
    series_ids: npt.NDArray[np.int64],
    ats: npt.NDArray[np.float64],
    values: npt.NDArray[np.float64],
    kinds: Mapping[int, Kind],
    previous: Mapping[int, float],
    width_s: float,
) -> dict[int, list[Bucket]]:
    """Buckets of many series at once; the points sorted by (series id, time).

    ``previous`` holds each series' value just before them. Vectorized: the job's cost per sample is a few
    array operations.
    """
    n = len(series_ids)
    if n == 0:
        return {}
    first_of_series = np.ones(n, dtype=bool)
    first_of_series[1:] = series_ids[1:] != series_ids[:-1]
    before = np.empty(n)
    before[1:] = values[:-1]
    firsts = np.flatnonzero(first_of_series)
    before[firsts] = [previous.get(int(sid), math.nan) for sid in series_ids[firsts].tolist()]
    counters = np.fromiter((sid for sid, k in kinds.items() if k is Kind.COUNTER), dtype=np.int64)
    increase = values - before
    reset = np.isin(series_ids, counters) & (values < before)
    increase[reset] = values[reset]
    increase[np.isnan(before) | np.isnan(values)] = 0.0
    starts = np.floor(ats / width_s) * width_s
    group_start = first_of_series.copy()
    group_start[1:] |= starts[1:] != starts[:-1]
    idx = np.flatnonzero(group_start)
    ends = np.append(idx[1:], n)
    with np.errstate(invalid="ignore"):  # all-NaN buckets: min and max are NaN
        mins, maxes = np.fmin.reduceat(values, idx), np.fmax.reduceat(values, idx)
    columns = zip(
        series_ids[idx].tolist(),
        starts[idx].tolist(),
        (ends - idx).tolist(),
        np.add.reduceat(values, idx).tolist(),
        mins.tolist(),
        maxes.tolist(),
        values[ends - 1].tolist(),
        np.add.reduceat(increase, idx).tolist(),
        strict=True,
    )
    out: dict[int, list[Bucket]] = {}
    for sid, start, count, total, low, high, last, inc in columns:
        out.setdefault(sid, []).append(Bucket(start, count, total, low, high, last, inc))
    return out


def roll_up(buckets: Iterable[Bucket], width_s: float) -> list[Bucket]:
    """Wider buckets of narrower ones (time order): sums add, min of mins, max of maxes, the last last."""
    groups: dict[float, list[Bucket]] = {}
    for b in buckets:
        groups.setdefault(bucket_start(b.start, width_s), []).append(b)
    return [_merge(start, parts) for start, parts in groups.items()]


def _merge(start: float, parts: list[Bucket]) -> Bucket:
    mins = [b.min for b in parts if not math.isnan(b.min)]
    maxes = [b.max for b in parts if not math.isnan(b.max)]
    return Bucket(
        start=start,
        count=sum(b.count for b in parts),
        sum=math.fsum(b.sum for b in parts),
        min=min(mins) if mins else math.nan,
        max=max(maxes) if maxes else math.nan,
        last=parts[-1].last,
        increase=math.fsum(b.increase for b in parts),
    )
