"""TelemetryStore: the collector's store as the service and in-process callers (alerts) use it.

Every method is blocking (a transaction); the ``a*`` twins run it in a worker thread for asyncio code.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from ff_store import Store
from ff_telemetry.core import evaluate
from ff_telemetry.core.errors import InvalidRequest, LimitExceeded
from ff_telemetry.core.model import (
    MINUTE,
    RAW,
    Matcher,
    MetricMeta,
    MetricType,
    QueryResult,
    RangeQuery,
    SeriesInfo,
)
from ff_telemetry.core.validation import Limits, PushBatch, SampleChecker, check_query
from ff_telemetry.store import query as reads
from ff_telemetry.store import schema
from ff_telemetry.store.ingest import IngestResult, Interned, SeriesKey, flush_latest, prepare, write
from ff_telemetry.store.query import Viewer
from ff_telemetry.store.retention import JobReport, Retention, run_job
from ff_telemetry.store.rows import from_db, labels_from_json

T = TypeVar("T")

# Samples of the pushes written in one transaction at most.
MAX_GROUP_SAMPLES = 50_000


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
        raw_query_span_s: float = 3600.0,
        max_raw_samples_read: int = reads.MAX_RAW_SAMPLES_READ,
    ) -> None:
        self.store = store
        self.limits = limits or Limits()
        self.checker = SampleChecker(self.limits)
        self.retention = retention or Retention()
        self.clock = clock
        self.raw_query_span_s = raw_query_span_s
        self.max_raw_samples_read = max_raw_samples_read
        self._series: dict[SeriesKey, Interned] = {}
        self._latest: dict[int, tuple[float, float]] = {}  # series id -> newest (at, value) not yet flushed
        self._lock = threading.Lock()
        self._queue: deque[tuple[PushBatch, asyncio.Future[PushResult]]] = deque()
        self._writer: asyncio.Task[None] | None = None

    async def _thread(self, fn: Callable[[], T]) -> T:
        return await asyncio.to_thread(fn)

    # -- ingest ---------------------------------------------------------------------------------
    def push(self, batch: PushBatch) -> PushResult:
        """Store a checked batch in one transaction; InvalidRequest/LimitExceeded store nothing."""
        (result,) = self._push_group([batch])
        if isinstance(result, Exception):
            raise result
        return result

    async def apush(self, batch: PushBatch) -> PushResult:
        """``push`` with group commit: batches arriving while a transaction runs go into the next one
        together (each still all or nothing), so many small pushes cost few commits."""
        future: asyncio.Future[PushResult] = asyncio.get_running_loop().create_future()
        self._queue.append((batch, future))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_queued())
        return await future

    async def _write_queued(self) -> None:
        while self._queue:
            group: list[tuple[PushBatch, asyncio.Future[PushResult]]] = []
            size = 0
            while self._queue and (not group or size + len(self._queue[0][0].samples) <= MAX_GROUP_SAMPLES):
                group.append(self._queue.popleft())
                size += len(group[-1][0].samples)
            try:
                results = await asyncio.to_thread(self._push_group, [b for b, _ in group])
            except Exception as exc:  # the database itself failed: every caller of the group hears it
                results = [exc] * len(group)
            for (_, future), result in zip(group, results, strict=True):
                if future.done():
                    continue
                if isinstance(result, Exception):
                    future.set_exception(result)
                else:
                    future.set_result(result)

    def _push_group(self, batches: list[PushBatch]) -> list[PushResult | Exception]:
        """One transaction for the group; if it fails, each batch alone (so one bad batch fails alone)."""
        try:
            results = self.store.run(lambda s: self._ingest_all(s, batches))
        except (InvalidRequest, LimitExceeded) as exc:
            if len(batches) == 1:
                return [exc]
            return [self._push_one(b) for b in batches]
        for result in results:
            self._committed(result)
        return [PushResult(r.num_stored, len(r.new_series)) for r in results]

    def _push_one(self, batch: PushBatch) -> PushResult | Exception:
        try:
            (result,) = self._push_group([batch])
        except Exception as exc:
            return exc
        return result

    def _ingest_all(self, session: Session, batches: list[PushBatch]) -> list[IngestResult]:
        # The transaction only reads the cache (it may re-run); what it interned is added once committed.
        interned: dict[SeriesKey, Interned] = {}
        results = []
        for batch in batches:
            result = prepare(session, batch.samples, batch.metadata, self._series, self.limits, interned)
            interned.update(result.new_series)
            results.append(result)
        write(session, results)
        return results

    def _committed(self, result: IngestResult) -> None:
        with self._lock:
            self._series.update(result.new_series)
            for sid, (at, value) in result.latest.items():
                known = self._latest.get(sid)
                if known is None or at >= known[0]:
                    self._latest[sid] = (at, value)

    def flush(self) -> None:
        """Write the series' latest samples held in memory (ListSeries and /federate read them in SQL)."""
        with self._lock:
            latest, self._latest = self._latest, {}
        if not latest:
            return
        try:
            self.store.run(lambda s: flush_latest(s, latest))
        except Exception:
            with self._lock:
                for sid, value in latest.items():
                    self._latest.setdefault(sid, value)
            raise

    # -- queries --------------------------------------------------------------------------------
    def query_range(self, query: RangeQuery, viewer: Viewer) -> QueryResult:
        """Values (or rates, or a histogram's quantile) of the matching series at each step.

        Raises InvalidRequest for a malformed query.
        """
        check_query(query, self.limits)
        now = self.clock()
        span_s = query.end_at - query.start_at + query.effective_lookback_s
        resolution = reads.choose_resolution(
            query.resolution_s, query.start_at, span_s, now, self.retention.raw_s, self.retention.minute_s,
            self.raw_query_span_s,
        )  # fmt: skip
        name = f"{query.name}_bucket" if query.quantile else query.name
        lo, hi = query.start_at - query.effective_lookback_s, query.end_at

        def read(session: Session) -> list[evaluate.SeriesRows]:
            found = reads.find_series(session, name, query.matchers, viewer)
            return reads.rows_for(session, found, resolution, lo, hi, self.max_raw_samples_read)

        rows = self.store.run(read, read_only=True)
        if query.quantile:
            return QueryResult(tuple(evaluate.quantile_series(rows, query)), resolution)
        return QueryResult(tuple(evaluate.evaluate(rows, query)), resolution)

    async def aquery_range(self, query: RangeQuery, viewer: Viewer) -> QueryResult:
        return await self._thread(lambda: self.query_range(query, viewer))

    def samples(
        self, name: str, matchers: tuple[Matcher, ...], viewer: Viewer, start_at: float, end_at: float
    ) -> list[evaluate.SeriesRows]:
        """The samples of the matching series in (start_at, end_at] as they were pushed (the raw tier while
        it holds ``start_at``, else the 1-minute buckets' last values), oldest first.

        Raises InvalidRequest for a bad name or matcher, LimitExceeded past ``max_raw_samples_read``.
        """
        span_s = end_at - start_at if end_at - start_at >= 1.0 else 1.0  # one step: only the checks matter
        check_query(
            RangeQuery(name=name, matchers=matchers, start_at=start_at, end_at=end_at, step_s=span_s), self.limits
        )
        resolution = RAW if start_at >= self.clock() - self.retention.raw_s else MINUTE

        def read(session: Session) -> list[evaluate.SeriesRows]:
            found = reads.find_series(session, name, matchers, viewer)
            return reads.rows_for(session, found, resolution, start_at, end_at, self.max_raw_samples_read)

        return self.store.run(read, read_only=True)

    async def asamples(
        self, name: str, matchers: tuple[Matcher, ...], viewer: Viewer, start_at: float, end_at: float
    ) -> list[evaluate.SeriesRows]:
        return await self._thread(lambda: self.samples(name, matchers, viewer, start_at, end_at))

    def list_series(
        self, query: RangeQuery | None, viewer: Viewer, *, after_id: int = 0, limit: int = 1000
    ) -> list[SeriesInfo]:
        """Series of ``query.name`` ("" = all) matching its matchers with a sample in [start_at, end_at]."""
        self.flush()
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
        self.flush()
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
        """Downsampling and retention, in passes (one transaction each) until caught up."""
        self.flush()
        at = self.clock() if now is None else now
        report = self.store.run(lambda s: run_job(s, at, self.retention))
        while report.more:
            report = report + self.store.run(lambda s: run_job(s, at, self.retention))
        if report.num_series_deleted:
            with self._lock:
                self._series.clear()
        return report

    async def arun_retention(self) -> JobReport:
        return await self._thread(self.run_retention)
