"""Query math: last value within the lookback, rate over windows, aggregation, histogram quantiles."""

from __future__ import annotations

import math

import pytest

from ff_telemetry.core.evaluate import Row, SeriesRows, evaluate, histogram_quantile, quantile_series
from ff_telemetry.core.model import Aggregation, Point, RangeQuery


def rows(values: list[tuple[float, float]], counter: bool = True) -> list[Row]:
    out, prev = [], None
    for at, v in values:
        inc = 0.0 if prev is None else (v if counter and v < prev else v - prev)
        out.append(Row(at, v, inc))
        prev = v
    return out


def test_last_value_within_the_lookback_and_gaps_left_out() -> None:
    series = [SeriesRows("g", (("a", "1"),), rows([(10.0, 1.0), (20.0, 2.0), (100.0, 3.0)], counter=False))]
    q = RangeQuery(name="g", start_at=10.0, end_at=100.0, step_s=30.0, lookback_s=15.0)
    (result,) = evaluate(series, q)
    assert result.points == (Point(10.0, 1.0), Point(100.0, 3.0))  # 40 and 70 see nothing in 15 s


def test_rate_is_the_increase_in_the_window_over_the_lookback_through_a_reset() -> None:
    data = [(0.0, 0.0), (10.0, 100.0), (20.0, 200.0), (30.0, 50.0), (40.0, 150.0)]
    series = [SeriesRows("c", (), rows(data))]
    q = RangeQuery(name="c", start_at=20.0, end_at=40.0, step_s=20.0, lookback_s=20.0, rate=True)
    (result,) = evaluate(series, q)
    # (0, 20]: 100 + 100; (20, 40]: reset to 50 counts 50, then +100
    assert result.points == (Point(20.0, 10.0), Point(40.0, 7.5))


def test_sum_and_avg_by_a_label() -> None:
    series = [
        SeriesRows("g", (("node", "1"), ("rank", str(r))), rows([(10.0, float(r))], counter=False)) for r in range(4)
    ] + [SeriesRows("g", (("node", "2"),), rows([(10.0, 10.0)], counter=False))]
    q = RangeQuery(name="g", start_at=10.0, end_at=10.0, step_s=1.0, aggregation=Aggregation.SUM, group_by=("node",))
    got = {r.labels: r.points[0].value for r in evaluate(series, q)}
    assert got == {(("node", "1"),): 6.0, (("node", "2"),): 10.0}
    q = RangeQuery(name="g", start_at=10.0, end_at=10.0, step_s=1.0, aggregation=Aggregation.AVG)
    assert [r.points[0].value for r in evaluate(series, q)] == [16.0 / 5]


def test_histogram_quantile_interpolates_as_prometheus_does() -> None:
    buckets = {0.1: 10.0, 0.5: 60.0, 1.0: 100.0, math.inf: 100.0}
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.1 + 0.4 * (50 - 10) / 50)
    assert histogram_quantile(0.05, buckets) == pytest.approx(0.05)
    assert histogram_quantile(1.0, {1.0: 5.0, math.inf: 9.0}) == 1.0  # in +Inf: the highest finite bound
    assert histogram_quantile(0.5, {1.0: 5.0}) is None  # no +Inf bucket
    assert histogram_quantile(0.5, {1.0: 0.0, math.inf: 0.0}) is None  # nothing observed


def test_quantile_over_the_increase_of_bucket_series_summed_across_instances() -> None:
    def bucket(le: str, inst: str, counts: list[float]) -> SeriesRows:
        return SeriesRows(
            "h_bucket", (("inst", inst), ("le", le)), rows([(float(i * 10), c) for i, c in enumerate(counts)])
        )

    # Before t=10 both instances had 1000 observations under 0.1 (outside the window), then 100 in (0.1, 1].
    series = [
        bucket("0.1", "a", [1000, 1000]), bucket("1", "a", [1000, 1050]), bucket("+Inf", "a", [1000, 1050]),
        bucket("0.1", "b", [1000, 1000]), bucket("1", "b", [1000, 1050]), bucket("+Inf", "b", [1000, 1050]),
    ]  # fmt: skip
    q = RangeQuery(name="h", start_at=10.0, end_at=10.0, step_s=1.0, lookback_s=5.0, quantile=0.5)
    (result,) = quantile_series(series, q)
    assert result.labels == () and result.points == (Point(10.0, pytest.approx(0.55)),)
