"""TelemetryStore: the collector's store as the service and in-process callers (alerts) use it.

Every method is blocking (a transaction); the ``a*`` twins run it in a worker thread for asyncio code.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
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
from ff_telemetry.core.packed import LatestTable, PackedSamples, SeriesTable
from ff_telemetry.core.validation import USER_LABEL, Limits, PushBatch, SampleChecker, check_query
from ff_telemetry.store import query as reads
from ff_telemetry.store import schema
from ff_telemetry.store.blocks import Block
from ff_telemetry.store.group_commit import GroupCommitter
from ff_telemetry.store.ingest import (
    IngestResult,
    Interned,
    SeriesKey,
    flush_latest,
    newest_of_all,
    prepare,
    register,
    write,
    write_packed,
)
from ff_telemetry.store.query import Viewer
from ff_telemetry.store.retention import JobReport, Retention, run_job
from ff_telemetry.store.rows import from_db, labels_from_json

T = TypeVar("T")

# Samples of the pushes written in one transaction at most.
MAX_GROUP_SAMPLES = 50_000


@dataclass(frozen=True)
class PushResult:
    """What a push stored: samples, and series created by it."""

    num_stored: int
    num_new_series: int


@dataclass(frozen=True)
class Registered:
    """A RegisterSeries answer: the ids (in the keys' order), this instance's epoch, series created."""

    series_ids: list[int]
    epoch: int
    num_new_series: int


# What the group-commit queue holds: a checked PushSamples batch, or a checked packed push.
Queued = PushBatch | PackedSamples


def _size(batch: Queued) -> int:
    return len(batch) if isinstance(batch, PackedSamples) else len(batch.samples)


def _each(indices: list[int], write: Callable[[], list[PushResult | Exception]]) -> dict[int, PushResult | Exception]:
    """The answers of a part of a group by its batches' indices; what ``write`` raised is each one's answer."""
    try:
        results = write()
    except Exception as exc:
        results = [exc] * len(indices)
    return dict(zip(indices, results, strict=True))


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
        self._latest = LatestTable()  # series' newest samples not yet flushed
        # The series registered for packed pushes; a random epoch per instance (ids are only valid here).
        self.series_table = SeriesTable(epoch=secrets.randbits(64))
        self._lock = threading.Lock()
        # Packed pushes are written on a connection of their own with plain statements (ff_store.RawWriter).
        self._raw = store.raw_writer()
        self._ingest: GroupCommitter[Queued, PushResult] = GroupCommitter(
            self._write_group, _size, MAX_GROUP_SAMPLES, name="telemetry-ingest"
        )

    def close(self) -> None:
        """Write the pushes queued, stop the ingest thread and give its connection back (before dispose)."""
        self._ingest.close()
        self._raw.close()

    async def _thread(self, fn: Callable[[], T]) -> T:
        return await asyncio.to_thread(fn)

    # -- ingest ---------------------------------------------------------------------------------
    def push(self, batch: PushBatch) -> PushResult:
        """Store a checked batch in one transaction; InvalidRequest/LimitExceeded store nothing."""
        (result,) = self._push_group([batch])
        if isinstance(result, Exception):
            raise result
        return result

    def register(self, keys: list[SeriesKey], metadata: tuple[MetricMeta, ...]) -> Registered:
        """Intern checked series keys for packed pushes (InvalidRequest/LimitExceeded: nothing stored)."""
        now = self.clock()
        found, new = self.store.run(lambda s: register(s, keys, metadata, self._series, self.limits, now))
        with self._lock:
            self._series.update(new)
            for (_, labels), series in zip(keys, found, strict=True):
                self.series_table.add(series.series_id, dict(labels).get(USER_LABEL, ""), series.kind)
        return Registered([s.series_id for s in found], self.series_table.epoch, len(new))

    async def aregister(self, keys: list[SeriesKey], metadata: tuple[MetricMeta, ...]) -> Registered:
        """``register`` in a worker thread."""
        return await self._thread(lambda: self.register(keys, metadata))

    async def apush_packed(self, epoch: int, samples: PackedSamples, owner: str | None) -> PushResult:
        """Store a decoded packed push of ``owner`` (None: the cluster) with group commit.

        Raises:
            StaleRegistration: the series were registered with another instance of the collector.
            UnknownSeries: a series is not registered here.
            NotYourSeries: a series is another user's.
            InvalidRequest: a counter's value is not acceptable. Nothing is stored on any of these.
        """
        self.series_table.check(epoch, samples, owner)
        return await self.apush(samples)

    async def apush(self, batch: Queued) -> PushResult:
        """``push`` with group commit (ff_telemetry.store.group_commit): many small pushes cost few commits.

        Batches arriving while a transaction runs go into the next one together (each still all or nothing).
        """
        return await self._ingest.submit(batch)

    def _write_group(self, batches: list[Queued]) -> list[PushResult | Exception]:
        """Write the ingest thread's group: packed pushes in one raw transaction, PushSamples in a session's.

        The PushSamples batches need a session because they intern series; a failure of one part is the answer
        to each batch of that part.
        """
        packed = [(i, b) for i, b in enumerate(batches) if isinstance(b, PackedSamples)]
        others = [(i, b) for i, b in enumerate(batches) if not isinstance(b, PackedSamples)]
        answers: dict[int, PushResult | Exception] = {}
        if packed:
            answers.update(_each([i for i, _ in packed], lambda: self._push_packed([b for _, b in packed])))
        if others:
            answers.update(_each([i for i, _ in others], lambda: self._push_group([b for _, b in others])))
        return [answers[i] for i in range(len(batches))]

    def _push_packed(self, pushes: list[PackedSamples]) -> list[PushResult | Exception]:
        """Checked packed pushes (SeriesTable.check) in one transaction: nothing to intern, a block each."""
        written = [Block(p.series_ids, p.ats, p.values) for p in pushes]
        self._raw.run(lambda tx: write_packed(tx, written))
        self._committed([], written)
        return [PushResult(len(p), 0) for p in pushes]

    def _push_group(self, batches: list[PushBatch]) -> list[PushResult | Exception]:
        """One transaction for the group; if it fails, each batch alone (so one bad batch fails alone)."""
        try:
            results = self.store.run(lambda s: self._ingest_all(s, batches))
        except (InvalidRequest, LimitExceeded) as exc:
            if len(batches) == 1:
                return [exc]
            return [self._push_one(b) for b in batches]
        self._committed(results, [r.block for r in results])
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

    def _committed(self, results: list[IngestResult], written: list[Block]) -> None:
        newest = newest_of_all(written)  # one sort for the group
        with self._lock:
            for result in results:
                self._series.update(result.new_series)
            self._latest.update(*newest)

    def flush(self) -> None:
        """Write the series' latest samples held in memory (ListSeries and /federate read them in SQL)."""
        with self._lock:
            latest = self._latest.take()
        if not latest:
            return
        try:
            self.store.run(lambda s: flush_latest(s, latest))
        except Exception:
            with self._lock:
                self._latest.restore(latest)
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
            query.resolution_s,
            query.start_at,
            span_s,
            now,
            self.retention.raw_s,
            self.retention.minute_s,
            self.raw_query_span_s,
        )
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
        """``query_range`` in a worker thread."""
        return await self._thread(lambda: self.query_range(query, viewer))

    def samples(
        self, name: str, matchers: tuple[Matcher, ...], viewer: Viewer, start_at: float, end_at: float
    ) -> list[evaluate.SeriesRows]:
        """The samples of the matching series in (start_at, end_at] as they were pushed, oldest first.

        From the raw tier while it holds ``start_at``, else the 1-minute buckets' last values.

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
        """``samples`` in a worker thread."""
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
        """``list_series`` in a worker thread."""
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
        """``latest`` in a worker thread."""
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
                self.series_table.clear()
        return report

    async def arun_retention(self) -> JobReport:
        """``run_retention`` in a worker thread."""
        return await self._thread(self.run_retention)
