"""The store on SQLite and PostgreSQL: batched ingest with interned series, replacing retried samples,
the series limit, queries by tier, and the downsampling job keeping a counter's totals over a day."""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from ff_store import open_store
from ff_telemetry.core.errors import InvalidRequest, LimitExceeded
from ff_telemetry.core.model import HOUR, MINUTE, Matcher, MatchOp, MetricMeta, MetricType, RangeQuery
from ff_telemetry.core.packed import PackedSamples, decode
from ff_telemetry.core.validation import Limits, PushBatch, RawSample, build_samples
from ff_telemetry.store.api import TelemetryStore
from ff_telemetry.store.blocks import Block
from ff_telemetry.store.ingest import MAX_ROWS_PER_INSERT, write_packed
from ff_telemetry.store.query import Viewer
from ff_telemetry.store.retention import Retention
from ff_telemetry.store.schema import VERSION_TABLE
from ff_testing.fakes import FakeClock

MIGRATIONS = Path(__file__).parents[2] / "src" / "ff_telemetry" / "store" / "migrations"
T0 = 1_700_000_000.0 - (1_700_000_000.0 % 86_400)  # midnight
ALL = Viewer.everything()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def tstore(db_url: str, clock: FakeClock) -> Iterator[TelemetryStore]:
    store = open_store(db_url, MIGRATIONS, VERSION_TABLE)
    limits = Limits(max_series_per_metric=50, max_sample_age_s=2 * 86_400.0)
    tstore = TelemetryStore(store, limits=limits, retention=Retention(raw_s=86_400.0, lag_s=60.0), clock=clock)
    yield tstore
    tstore.close()
    store.dispose()


def push(ts: TelemetryStore, raw: list[RawSample], meta: tuple[MetricMeta, ...] = (), owner: str | None = None) -> int:
    samples = build_samples(raw, {}, owner=owner, now=ts.clock(), limits=ts.limits)
    return ts.push(PushBatch(samples, meta)).num_stored


COUNTER = (MetricMeta("req_total", MetricType.COUNTER, "requests", ""),)


def test_batches_store_every_sample_and_a_retry_replaces(tstore: TelemetryStore, clock: FakeClock) -> None:
    clock.now = T0 + 600
    batch = [RawSample("req_total", {"node": str(i % 5)}, float(i), T0 + i) for i in range(500)]
    assert push(tstore, batch, COUNTER) == 500
    assert push(tstore, batch, COUNTER) == 500  # the same samples again: replaced, not doubled
    q = RangeQuery(name="req_total", start_at=T0 + 499, end_at=T0 + 499, step_s=1, lookback_s=600)
    result = tstore.query_range(q, ALL)
    assert {dict(s.labels)["node"]: s.points[0].value for s in result.series} == {
        str(n): float(495 + n) for n in range(5)
    }
    assert len(tstore.list_series(None, ALL)) == 5


def test_over_the_series_limit_nothing_is_stored(tstore: TelemetryStore, clock: FakeClock) -> None:
    push(tstore, [RawSample("g", {"id": str(i)}, 1.0, T0) for i in range(40)])
    with pytest.raises(LimitExceeded, match="'g' would have 60 series"):
        push(tstore, [RawSample("ok", {}, 1.0, T0)] + [RawSample("g", {"id": str(i)}, 1.0, T0) for i in range(20, 60)])
    assert [s.name for s in tstore.list_series(None, ALL)] == ["g"] * 40
    with pytest.raises(InvalidRequest, match="must be finite"):
        push(tstore, [RawSample("ok", {}, 1.0, T0), RawSample("req_total", {}, -1.0, T0)], COUNTER)
    assert [s.name for s in tstore.list_series(None, ALL)] == ["g"] * 40


def test_a_user_sees_the_clusters_series_and_their_own(tstore: TelemetryStore) -> None:
    push(tstore, [RawSample("loss", {}, 1.0, T0)], owner="alice")
    push(tstore, [RawSample("loss", {}, 2.0, T0)], owner="bob")
    push(tstore, [RawSample("loss", {"node": "1"}, 3.0, T0)])
    q = RangeQuery(name="loss", start_at=T0, end_at=T0, step_s=1)
    seen = {s.points[0].value for s in tstore.query_range(q, Viewer("alice")).series}
    assert seen == {1.0, 3.0}
    assert len(tstore.query_range(q, ALL).series) == 3
    q = RangeQuery(
        name="loss", matchers=(Matcher.make("user", MatchOp.REGEX, "b.*"),), start_at=T0, end_at=T0, step_s=1
    )
    assert [s.points[0].value for s in tstore.query_range(q, ALL).series] == [2.0]


def test_a_counters_day_keeps_its_increase_in_every_tier_and_raw_expires(
    tstore: TelemetryStore, clock: FakeClock
) -> None:
    values, value = [], 0.0
    for i in range(0, 86_400, 30):  # a day every 30 s, a restart at noon
        value = 5.0 if i == 43_200 else value + float(i % 7)
        values.append((T0 + i, value))
    expected = sum(b - a if b >= a else b for (_, a), (_, b) in itertools.pairwise(values))
    for start in range(0, len(values), 500):
        clock.now = values[min(start + 499, len(values) - 1)][0]
        push(tstore, [RawSample("req_total", {"node": "1"}, v, at) for at, v in values[start : start + 500]], COUNTER)
        if start % 1500 == 0:
            tstore.run_retention()  # the job runs while the day goes on
    clock.now = T0 + 86_400 + 120
    report = tstore.run_retention()
    assert report.num_minute_buckets > 0

    def increase(resolution: float) -> float:
        q = RangeQuery(
            name="req_total",
            start_at=T0 + 86_400,
            end_at=T0 + 86_400,
            step_s=1,
            lookback_s=86_400,
            rate=True,
            resolution_s=resolution,
        )
        (series,) = tstore.query_range(q, ALL).series
        return series.points[0].value * 86_400

    assert expected > 0
    assert increase(MINUTE) == pytest.approx(expected, rel=1e-12)
    assert increase(HOUR) == pytest.approx(expected, rel=1e-12)
    # A day and a half later the raw samples are gone; the hour tier still has the day.
    clock.now = T0 + 86_400 * 2.5
    assert report.num_raw_deleted + tstore.run_retention().num_raw_deleted == len(values)
    q = RangeQuery(name="req_total", start_at=T0 + 86_400, end_at=T0 + 86_400, step_s=1, lookback_s=86_400)
    result = tstore.query_range(q, ALL)
    assert result.resolution_s == MINUTE and result.series[0].points[0].value == values[-1][1]


def test_a_late_sample_recomputes_its_buckets(tstore: TelemetryStore, clock: FakeClock) -> None:
    clock.now = T0 + 600
    push(tstore, [RawSample("req_total", {}, v, T0 + 10 * i) for i, v in enumerate([0.0, 10.0, 20.0])], COUNTER)
    tstore.run_retention()
    push(tstore, [RawSample("req_total", {}, 100.0, T0 + 25)], COUNTER)  # late, into a finished minute
    tstore.run_retention()
    q = RangeQuery(
        name="req_total", start_at=T0 + 60, end_at=T0 + 60, step_s=1, lookback_s=60, rate=True, resolution_s=MINUTE
    )
    (series,) = tstore.query_range(q, ALL).series
    assert series.points[0].value * 60 == 100.0  # 0 -> 10 -> 20 -> 100


def test_histogram_quantile_from_pushed_buckets(tstore: TelemetryStore, clock: FakeClock) -> None:
    meta = (MetricMeta("lat_seconds", MetricType.HISTOGRAM),)
    clock.now = T0 + 100
    cumulative = {"0.1": [0, 10], "0.5": [0, 60], "1": [0, 100], "+Inf": [0, 100]}
    raw = [
        RawSample("lat_seconds_bucket", {"le": le}, float(c), T0 + 10 * i)
        for le, counts in cumulative.items()
        for i, c in enumerate(counts)
    ]
    push(tstore, raw, meta)
    q = RangeQuery(name="lat_seconds", start_at=T0 + 10, end_at=T0 + 10, step_s=1, lookback_s=60, quantile=0.5)
    (series,) = tstore.query_range(q, ALL).series
    assert series.points[0].value == pytest.approx(0.1 + 0.4 * 40 / 50)
    with pytest.raises(InvalidRequest, match="numeric 'le'"):
        push(tstore, [RawSample("lat_seconds_bucket", {}, 1.0, T0)], meta)
    assert not math.isnan(series.points[0].value)


async def test_concurrent_pushes_commit_together_and_a_bad_one_fails_alone(tstore: TelemetryStore) -> None:
    def batch(i: int, value: float) -> PushBatch:
        raw = [RawSample("req_total", {"pusher": str(i), "n": str(n)}, value, T0 + n) for n in range(10)]
        return PushBatch(build_samples(raw, {}, owner=None, now=T0, limits=tstore.limits), COUNTER)

    tstore.push(PushBatch((), COUNTER))  # the metadata first: req_total is a counter
    results = await asyncio.gather(
        *(tstore.apush(batch(i, -1.0 if i == 2 else 5.0)) for i in range(5)), return_exceptions=True
    )
    assert isinstance(results[2], InvalidRequest), results
    assert [r.num_stored for i, r in enumerate(results) if i != 2] == [10] * 4  # type: ignore[union-attr]
    assert {dict(s.labels)["pusher"] for s in tstore.list_series(None, ALL)} == {"0", "1", "3", "4"}


async def test_packed_pushes_beside_a_samples_batch_all_commit_and_a_late_one_recomputes_buckets(
    tstore: TelemetryStore, clock: FakeClock
) -> None:
    clock.now = T0 + 600
    keys = [("req_total", (("pusher", str(i)),)) for i in range(8)]
    registered = tstore.register(keys, COUNTER)

    def packed(i: int, value: float, at: float) -> PackedSamples:
        return decode(
            np.asarray(registered.series_ids[i : i + 1], "<i8").tobytes(),
            np.asarray([value]).tobytes(),
            np.asarray([at]).tobytes(),
            now=clock.now,
            limits=tstore.limits,
        )

    # Eight pushes and a PushSamples batch at once: packed ones share raw transactions, the batch its session's.
    batch = PushBatch(
        build_samples([RawSample("g", {}, 1.0, T0 + 5)], {}, owner=None, now=clock.now, limits=tstore.limits), ()
    )
    results = await asyncio.gather(
        *(tstore.apush_packed(registered.epoch, packed(i, 10.0 * i, T0 + 10), None) for i in range(8)),
        tstore.apush(batch),
    )
    assert [r.num_stored for r in results] == [1] * 9
    tstore.run_retention()  # the minute [T0, T0 + 60) is done
    await tstore.apush_packed(registered.epoch, packed(0, 5.0, T0 + 20), None)  # later in that minute
    tstore.run_retention()
    q = RangeQuery(
        name="req_total",
        start_at=T0 + 60,
        end_at=T0 + 60,
        step_s=1,
        lookback_s=60,
        rate=True,
        resolution_s=MINUTE,
        matchers=(Matcher("pusher", MatchOp.EQUAL, "0"),),
    )
    (series,) = tstore.query_range(q, ALL).series
    assert series.points[0].value * 60 == 5.0  # 0 -> 5: the late sample's bucket was computed again
    (rows,) = tstore.samples("req_total", (Matcher("pusher", MatchOp.EQUAL, "3"),), ALL, T0, T0 + 60)
    assert [(r.at, r.value) for r in rows.rows] == [(T0 + 10, 30.0)]
    # A group past one INSERT's rows (MAX_ROWS_PER_INSERT) is several INSERTs of the same transaction.
    many = [
        Block(np.asarray(registered.series_ids[5:6]), np.asarray([T0 + 30 + i / 1000]), np.asarray([float(i)]))
        for i in range(MAX_ROWS_PER_INSERT + 5)
    ]
    writer = tstore.store.raw_writer()
    writer.run(lambda tx: write_packed(tx, many))
    writer.close()
    (rows,) = tstore.samples("req_total", (Matcher("pusher", MatchOp.EQUAL, "5"),), ALL, T0 + 29, T0 + 60)
    assert [r.value for r in rows.rows] == [float(i) for i in range(MAX_ROWS_PER_INSERT + 5)]
    tstore.close()
    with pytest.raises(RuntimeError, match="closed"):
        await tstore.apush_packed(registered.epoch, packed(1, 1.0, T0 + 30), None)


def test_long_spans_read_the_minute_tier_and_an_oversized_raw_read_is_refused(
    tstore: TelemetryStore, clock: FakeClock
) -> None:
    clock.now = T0 + 7200
    push(tstore, [RawSample("g", {"i": str(i)}, 1.0, T0 + 60 * j) for i in range(5) for j in range(100)])
    short = RangeQuery(name="g", start_at=T0 + 3600, end_at=T0 + 3660, step_s=60)
    assert tstore.query_range(short, ALL).resolution_s == 0.0
    long = RangeQuery(name="g", start_at=T0, end_at=T0 + 7200, step_s=60)
    assert tstore.query_range(long, ALL).resolution_s == MINUTE
    tstore.max_raw_samples_read = 100  # the window's blocks hold 500
    with pytest.raises(LimitExceeded, match="more than 100 to read"):
        tstore.query_range(short, ALL)
