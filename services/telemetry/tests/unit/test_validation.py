"""Pushed samples are checked: names, labels, sizes, times, types, counter values; `user` is forced."""

from __future__ import annotations

import math

import pytest

from ff_telemetry.core.errors import InvalidRequest
from ff_telemetry.core.model import Kind, MetricType, Sample
from ff_telemetry.core.validation import Limits, RawSample, build_samples, check_value, classify, metric_type

NOW = 1_000_000.0
LIMITS = Limits(max_labels=3, max_sample_age_s=3600.0)


def build(*raw: RawSample, common: dict[str, str] | None = None, owner: str | None = None) -> tuple[Sample, ...]:
    return build_samples(list(raw), common or {}, owner=owner, now=NOW, limits=LIMITS)


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (RawSample("1bad", {}, 1.0, NOW), "bad metric name"),
        (RawSample("__reserved", {}, 1.0, NOW), "bad metric name"),
        (RawSample("ok", {"bad-label": "x"}, 1.0, NOW), "bad label name"),
        (RawSample("ok", {"__name__": "x"}, 1.0, NOW), "bad label name"),
        (RawSample("ok", {"a": "1", "b": "2", "c": "3", "d": "4"}, 1.0, NOW), "4 labels"),
        (RawSample("ok", {"a": "x" * 2000}, 1.0, NOW), "longer than 1024"),
        (RawSample("ok", {}, 1.0, NOW - 7200), "outside"),
        (RawSample("ok", {}, 1.0, NOW + 3600), "outside"),
        (RawSample("ok", {}, 1.0, math.nan), "outside"),
    ],
)
def test_malformed_samples_are_refused_with_the_reason(raw: RawSample, error: str) -> None:
    with pytest.raises(InvalidRequest, match=error):
        build(raw)


def test_common_labels_merge_a_samples_own_win_and_a_users_push_is_theirs() -> None:
    (s,) = build(
        RawSample("loss", {"rank": "0", "user": "root"}, 0.5, 0), common={"task": "7", "rank": "9"}, owner="alice"
    )
    assert s.labels == (("rank", "0"), ("task", "7"), ("user", "alice")) and s.at == NOW and s.value == 0.5


def test_too_many_samples_in_one_call() -> None:
    with pytest.raises(InvalidRequest, match="3 samples"):
        build_samples([RawSample("x", {}, 1.0, NOW)] * 3, {}, owner=None, now=NOW, limits=Limits(max_samples=2))


def test_types_decide_how_a_series_is_stored() -> None:
    types = {"req": MetricType.COUNTER, "lat": MetricType.HISTOGRAM, "q": MetricType.SUMMARY}
    assert classify("req", (), types) == (Kind.COUNTER, MetricType.COUNTER)
    assert classify("lat_bucket", (("le", "0.5"),), types) == (Kind.COUNTER, MetricType.HISTOGRAM)
    assert classify("lat_sum", (), types) == (Kind.COUNTER, MetricType.HISTOGRAM)
    assert classify("q", (("quantile", "0.9"),), types) == (Kind.GAUGE, MetricType.SUMMARY)
    assert classify("q_count", (), types) == (Kind.COUNTER, MetricType.SUMMARY)
    assert classify("loss", (), types) == (Kind.GAUGE, MetricType.GAUGE)
    with pytest.raises(InvalidRequest, match="numeric 'le'"):
        classify("lat_bucket", (), types)
    with pytest.raises(InvalidRequest, match="pushed as lat_bucket"):
        classify("lat", (), types)
    with pytest.raises(InvalidRequest, match="unknown metric type 9"):
        metric_type(9, "x")


def test_counters_must_be_finite_and_not_negative_gauges_may_be_nan() -> None:
    check_value(Sample("loss", (), math.nan, NOW), Kind.GAUGE)
    for bad in (math.nan, math.inf, -1.0):
        with pytest.raises(InvalidRequest, match="must be finite"):
            check_value(Sample("req", (), bad, NOW), Kind.COUNTER)
