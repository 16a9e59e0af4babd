"""Downsampling math (pure): raw samples into fixed-width buckets, and buckets into wider ones.

A bucket keeps count, sum, min, max and last of its samples, and the series' increase within it: the
change from the sample before each of its samples (for counters a drop is a reset: the increase is
the new value). Since every sample's increase lands in exactly one bucket, the increase over any span
of whole buckets is the same in every tier: that is what keeps a counter's totals.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ff_telemetry.core.model import Kind


@dataclass(frozen=True)
class Bucket:
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
    return math.floor(at / width_s) * width_s


def downsample(
    points: Sequence[tuple[float, float]], previous: float | None, width_s: float, kind: Kind
) -> list[Bucket]:
    """Buckets of one series' raw points (time order); ``previous`` is the value just before them."""
    groups: dict[float, list[float]] = {}
    increases: dict[float, float] = {}
    for at, value in points:
        start = bucket_start(at, width_s)
        groups.setdefault(start, []).append(value)
        increases[start] = increases.get(start, 0.0) + step_increase(previous, value, kind)
        previous = value
    return [_bucket(start, values, increases[start]) for start, values in groups.items()]


def _bucket(start: float, values: list[float], increase: float) -> Bucket:
    finite = [v for v in values if not math.isnan(v)]
    return Bucket(
        start=start,
        count=len(values),
        sum=math.fsum(values),
        min=min(finite) if finite else math.nan,
        max=max(finite) if finite else math.nan,
        last=values[-1],
        increase=increase,
    )


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
