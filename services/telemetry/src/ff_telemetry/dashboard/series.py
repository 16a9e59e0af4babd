"""The collector's own series as the dashboard shows them: a task's curves, storage throughput and capacity.

A task's curves show each value at its step; storage shows throughput and latency, and the latest capacity.
Every read goes through the viewer's filter: a user sees the cluster's series and their own, as on
/federate.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

from ff_telemetry.core.evaluate import SeriesRows
from ff_telemetry.core.model import Aggregation, Labels, Matcher, MatchOp, RangeQuery, SeriesResult
from ff_telemetry.store.api import Latest, TelemetryStore
from ff_telemetry.store.query import Viewer

Json = dict[str, Any]

STEP_METRIC = "hfai_step"
TASK_METRIC_PREFIX = "hfai_"
MAX_POINTS = 5000  # per curve; longer ones are thinned evenly (the newest point is always kept)
STORAGE_BYTES = {"read": "ff_storage_target_read_bytes_total", "write": "ff_storage_target_written_bytes_total"}
STORAGE_LATENCY = {
    "read": "ff_storage_target_read_latency_seconds",
    "write": "ff_storage_target_write_latency_seconds",
}
STORAGE_GAUGES = ("ff_storage_target_capacity_bytes", "ff_storage_target_free_bytes", "ff_storage_target_stored_bytes")
LATEST_MAX_AGE_S = 300.0


def finite(value: float) -> float | None:
    """JSON has no NaN: a NaN or infinite value goes out as null (a gap in the curve)."""
    return value if math.isfinite(value) else None


def _thin(points: list[Any], limit: int = MAX_POINTS) -> list[Any]:
    """At most about ``limit`` of ``points``, evenly spaced, the last one always kept."""
    if len(points) <= limit:
        return points
    stride = math.ceil(len(points) / limit)
    return points[::-1][::stride][::-1]


def _labels(labels: Labels) -> dict[str, str]:
    return dict(labels)


async def task_curves(
    store: TelemetryStore, viewer: Viewer, task_id: int, metric: str, since: float, until: float
) -> Json:
    """Each series of ``hfai_<metric>`` of the task (one per rank and run), as [step, value, at] points.

    In the order reported; step is null where no ``hfai_step`` was reported with the value.
    """
    match = (Matcher.make("task_id", MatchOp.EQUAL, str(task_id)),)
    name = TASK_METRIC_PREFIX + metric
    values, steps = await asyncio.gather(
        store.asamples(name, match, viewer, since, until), store.asamples(STEP_METRIC, match, viewer, since, until)
    )
    step_at = {s.labels: {r.at: r.value for r in s.rows} for s in steps}
    return {"metric": name, "series": [_curve(s, step_at.get(s.labels, {})) for s in values if s.rows]}


def _curve(series: SeriesRows, steps: dict[float, float]) -> Json:
    points = [[_step(steps.get(r.at)), finite(r.value), r.at] for r in series.rows]
    return {"labels": _labels(series.labels), "points": _thin(points)}


def _step(value: float | None) -> float | None:
    return None if value is None else finite(value)


def result_series(results: Sequence[SeriesResult]) -> list[Json]:
    """A query's series as JSON: name, labels and [at, value] points (thinned; non-finite values as null)."""
    return [
        {"name": s.name, "labels": _labels(s.labels), "points": _thin([[p.at, finite(p.value)] for p in s.points])}
        for s in results
    ]


async def storage(store: TelemetryStore, viewer: Viewer, now: float, window_s: float) -> Json:
    """Storage throughput and p99 latency over the last ``window_s``, and each target's latest figures.

    Throughput is read and written bytes/s over all targets; latency is the slowest target's.
    """
    step_s = max(window_s / 120, 1.0)
    lookback_s = max(step_s, 30.0)

    def query(name: str, **kw: Any) -> RangeQuery:
        return RangeQuery(name=name, start_at=now - window_s, end_at=now, step_s=step_s, lookback_s=lookback_s, **kw)

    p99 = (Matcher.make("quantile", MatchOp.EQUAL, "0.99"),)
    queries = {
        **{f"{op}_bytes_per_s": query(n, rate=True, aggregation=Aggregation.SUM) for op, n in STORAGE_BYTES.items()},
        **{f"{op}_p99_s": query(n, matchers=p99, aggregation=Aggregation.MAX) for op, n in STORAGE_LATENCY.items()},
    }
    results = await asyncio.gather(*(store.aquery_range(q, viewer) for q in queries.values()))
    latest, _ = await store.alatest(LATEST_MAX_AGE_S)
    return {
        "window_s": window_s,
        "charts": {key: result_series(r.series) for key, r in zip(queries, results, strict=True)},
        "targets": targets_table(latest),
    }


def targets_table(latest: Sequence[Latest]) -> list[Json]:
    """Each target's latest capacity, free and stored bytes and latency quantiles, by target id."""
    rows: dict[str, Json] = {}
    for s in latest:
        labels = dict(s.labels)
        target = labels.get("target_id")
        if target is None or not s.name.startswith("ff_storage_target_") or labels.get("user"):
            continue
        row = rows.setdefault(target, {"target_id": target, "chain_id": labels.get("chain_id", "")})
        key = s.name.removeprefix("ff_storage_target_")
        if "quantile" in labels:
            try:
                key = f"{key}_p{round(float(labels['quantile']) * 100)}"  # 0.99 -> read_latency_seconds_p99
            except ValueError:
                continue
        row[key] = finite(s.value)
    return [rows[k] for k in sorted(rows, key=lambda t: (len(t), t))]


def capacity(targets: Sequence[Json]) -> Json:
    """The cluster's storage capacity and free bytes (the sum over targets that reported both)."""
    both = [t for t in targets if t.get("capacity_bytes") is not None and t.get("free_bytes") is not None]
    return {
        "num_targets": len(both),
        "capacity_bytes": sum(t["capacity_bytes"] for t in both),
        "free_bytes": sum(t["free_bytes"] for t in both),
    }
