"""TelemetryStore: the collector's store as the service and in-process callers (alerts) use it.

Every method is blocking (a transaction); the ``a*`` twins run it in a worker thread for asyncio code.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from ff_store import Store
from ff_telemetry.core import evaluate
from ff_telemetry.core.model import (
    MetricMeta,
    MetricType,
    QueryResult,
    RangeQuery,
    SeriesInfo,
)
from ff_telemetry.core.validation import Limits, PushBatch, check_query
from ff_telemetry.store import query as reads
from ff_telemetry.store import schema
from ff_telemetry.store.ingest import Interned, SeriesKey, ingest
from ff_telemetry.store.query import Viewer
from ff_telemetry.store.retention import JobReport, Retention, run_job
from ff_telemetry.store.rows import from_db, labels_from_json

T = TypeVar("T")


@dataclass(frozen=True)
class PushResult:
    num_stored: int
    num_new_series: int


@dataclass(frozen=True)
class Latest:
    """A series' latest sample, for exposition."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float
    at: float


class TelemetryStore:
    """Samples in SQL: ingest, range queries, series listing, downsampling and retention."""

    def __init__(
        self,
        store: Store,
        *,
        limits: Limits | None = None,
        retention: Retention | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.limits = limits or Limits()
        self.retention = retention or Retention()
        self.clock = clock
        self._series: dict[SeriesKey, Interned] = {}
        self._lock = threading.Lock()

    async def _thread(self, fn: Callable[[], T]) -> T:
        return await asyncio.to_thread(fn)

    # -- ingest ---------------------------------------------------------------------------------
    def push(self, batch: PushBatch) -> PushResult:
        """Store a checked batch in one transaction; InvalidRequest/LimitExceeded store nothing."""
        # The transaction only reads the cache (it may re-run); what it interned is added once committed.
        result = self.store.run(lambda s: ingest(s, batch.samples, batch.metadata, self._series, self.limits))
        with self._lock:
            self._series.update(result.new_series)
        return PushResult(result.num_stored, len(result.new_series))

    async def apush(self, batch: PushBatch) -> PushResult:
        return await self._thread(lambda: self.push(batch))

    # -- queries --------------------------------------------------------------------------------
    def query_range(self, query: RangeQuery, viewer: Viewer) -> QueryResult:
        """Values (or rates, or a histogram's quantile) of the matching series at each step.

        Raises InvalidRequest for a malformed query.
        """
        check_query(query, self.limits)
        now = self.clock()
        resolution = reads.choose_resolution(
            query.resolution_s, query.start_at, now, self.retention.raw_s, self.retention.minute_s
        )
        name = f"{query.name}_bucket" if query.quantile else query.name
        lo, hi = query.start_at - query.effective_lookback_s, query.end_at

        def read(session: Session) -> list[evaluate.SeriesRows]:
            found = reads.find_series(session, name, query.matchers, viewer, active_from=lo)
            return reads.rows_for(session, found, resolution, lo, hi)

        rows = self.store.run(read, read_only=True)
        if query.quantile:
            return QueryResult(tuple(evaluate.quantile_series(rows, query)), resolution)
        return QueryResult(tuple(evaluate.evaluate(rows, query)), resolution)

    async def aquery_range(self, query: RangeQuery, viewer: Viewer) -> QueryResult:
        return await self._thread(lambda: self.query_range(query, viewer))

    def list_series(
        self, query: RangeQuery | None, viewer: Viewer, *, after_id: int = 0, limit: int = 1000
    ) -> list[SeriesInfo]:
        """Series of ``query.name`` ("" = all) matching its matchers with a sample in [start_at, end_at]."""
        name, matchers = (query.name, query.matchers) if query else ("", ())
        start = query.start_at if query else 0.0

        def read(session: Session) -> list[SeriesInfo]:
            found = reads.find_series(
                session, name, matchers, viewer, active_from=start or None, after_id=after_id, limit=None
            )
            end = query.end_at if query and query.end_at else float("inf")
            return [s for s in found if s.first_at <= end][:limit]

        return self.store.run(read, read_only=True)

    async def alist_series(
        self, query: RangeQuery | None, viewer: Viewer, *, after_id: int = 0, limit: int = 1000
    ) -> list[SeriesInfo]:
        return await self._thread(lambda: self.list_series(query, viewer, after_id=after_id, limit=limit))

    def latest(self, max_age_s: float = 300.0) -> tuple[list[Latest], dict[str, MetricMeta]]:
        """Every series' latest sample if not older than ``max_age_s``, and the metrics' metadata."""
        since = self.clock() - max_age_s

        def read(session: Session) -> tuple[list[Latest], dict[str, MetricMeta]]:
            t, m = schema.series, schema.metric_metadata
            rows = session.execute(
                select(t.c.name, t.c.labels, t.c.last_value, t.c.last_at)
                .where(t.c.last_at >= since)
                .order_by(t.c.name, t.c.series_id)
            )
            latest = [Latest(str(n), labels_from_json(lb), from_db(v), float(at)) for n, lb, v, at in rows]
            meta = {
                str(r.name): MetricMeta(str(r.name), MetricType(r.type), str(r.help), str(r.unit))
                for r in session.execute(select(m))
            }
            return latest, meta

        return self.store.run(read, read_only=True)

    async def alatest(self, max_age_s: float = 300.0) -> tuple[list[Latest], dict[str, MetricMeta]]:
        return await self._thread(lambda: self.latest(max_age_s))

    # -- maintenance ----------------------------------------------------------------------------
    def run_retention(self, now: float | None = None) -> JobReport:
        """One pass of downsampling and retention."""
        report = self.store.run(lambda s: run_job(s, self.clock() if now is None else now, self.retention))
        if report.num_series_deleted:
            with self._lock:
                self._series.clear()
        return report

    async def arun_retention(self) -> JobReport:
        return await self._thread(self.run_retention)
