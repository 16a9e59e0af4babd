"""Downsampling keeps a series' totals: a counter's increase over a day equals the sum of its 1-minute
and of its 1-hour increases, through resets; gauges keep min, max, avg and last."""

from __future__ import annotations

import itertools
import math
import random

from ff_telemetry.core.downsample import Bucket, downsample, roll_up, step_increase
from ff_telemetry.core.model import HOUR, MINUTE, Kind

DAY_S = 86_400.0


def a_day_of_counter(seed: int) -> list[tuple[float, float]]:
    """A counter sampled every 7-23 s for a day, with integer increments and three restarts (resets)."""
    rng = random.Random(seed)
    points, at, value = [], 1_000_000.0 + rng.random() * 60, 0.0
    resets = {rng.randrange(1000, 4000) for _ in range(3)}
    while at < 1_000_000.0 + DAY_S:
        value = float(rng.randrange(0, 5)) if len(points) in resets else value + rng.randrange(0, 50)
        points.append((at, value))
        at += rng.uniform(7, 23)
    return points


def true_increase(points: list[tuple[float, float]]) -> float:
    total = 0.0
    for (_, before), (_, after) in itertools.pairwise(points):
        total += after if after < before else after - before
    return total


def test_a_counters_day_increase_is_the_sum_of_its_minute_and_hour_increases() -> None:
    points = a_day_of_counter(seed=7)
    minutes = downsample(points, None, MINUTE, Kind.COUNTER)
    hours = roll_up(minutes, HOUR)
    expected = true_increase(points)
    assert expected > 0 and len(minutes) > 1400 and len(hours) in (24, 25)
    assert sum(b.increase for b in minutes) == expected  # integer-valued floats: exact
    assert sum(b.increase for b in hours) == expected
    assert sum(b.count for b in hours) == len(points)


def test_downsampling_in_passes_gives_the_same_buckets_as_in_one() -> None:
    points = a_day_of_counter(seed=3)
    whole = downsample(points, None, MINUTE, Kind.COUNTER)
    cut = next(i for i, (at, _) in enumerate(points) if at >= 1_000_000.0 + 36_000.0 and at % MINUTE < 30)
    cut_at = math.floor(points[cut][0] / MINUTE) * MINUTE
    first = [p for p in points if p[0] < cut_at]
    second = [p for p in points if p[0] >= cut_at]
    in_passes = downsample(first, None, MINUTE, Kind.COUNTER) + downsample(second, first[-1][1], MINUTE, Kind.COUNTER)
    assert in_passes == whole


def test_a_counter_reset_counts_the_new_value_and_the_first_sample_counts_nothing() -> None:
    assert step_increase(None, 10.0, Kind.COUNTER) == 0.0
    assert step_increase(10.0, 15.0, Kind.COUNTER) == 5.0
    assert step_increase(15.0, 3.0, Kind.COUNTER) == 3.0
    assert step_increase(15.0, 3.0, Kind.GAUGE) == -12.0


def test_gauge_buckets_keep_min_max_avg_and_last() -> None:
    points = [(0.0, 5.0), (10.0, 1.0), (20.0, 9.0), (70.0, 4.0), (80.0, math.nan)]
    first, second = downsample(points, None, MINUTE, Kind.GAUGE)
    assert (first.start, first.count, first.min, first.max, first.last) == (0.0, 3, 1.0, 9.0, 9.0)
    assert first.sum / first.count == 5.0
    assert second.count == 2 and second.min == second.max == 4.0 and math.isnan(second.last)
    (hour,) = roll_up([first, second], HOUR)
    assert (hour.count, hour.min, hour.max) == (5, 1.0, 9.0) and math.isnan(hour.last)


def test_roll_up_merges_by_the_wider_bucket() -> None:
    minute = Bucket(start=3540.0, count=2, sum=3.0, min=1.0, max=2.0, last=2.0, increase=1.0)
    later = Bucket(start=3600.0, count=1, sum=7.0, min=7.0, max=7.0, last=7.0, increase=5.0)
    first, second = roll_up([minute, later], HOUR)
    assert (first.start, first.increase, second.start, second.increase) == (0.0, 1.0, 3600.0, 5.0)
