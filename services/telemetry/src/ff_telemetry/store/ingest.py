"""Ingest in one transaction: metadata, series interning (with the per-metric series limit), samples.

Cheap for large batches: the series of a batch are found in a process cache (the ids never change),
only new ones go to the database, and the samples are one row (a block, ff_telemetry.store.blocks).
Packed pushes (series registered before) intern nothing: ``write_packed`` stores their blocks with plain
statements on the collector's raw writer (ff_store.RawWriter), not in a session.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
from sqlalchemy import Table, bindparam, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session
from sqlalchemy.sql.dml import Insert

from ff_store import RawTransaction
from ff_telemetry.core import packed, validation
from ff_telemetry.core.errors import LimitExceeded
from ff_telemetry.core.model import Kind, Labels, MetricMeta, MetricType, Sample
from ff_telemetry.store import blocks, schema
from ff_telemetry.store.rows import labels_hash, labels_json, to_db

SeriesKey = tuple[str, Labels]

# Block rows in one INSERT of packed pushes at most (4 parameters each).
MAX_ROWS_PER_INSERT = 1000


@dataclass(frozen=True)
class Interned:
    """A series as the store knows it: its id and kind."""

    series_id: int
    kind: Kind


@dataclass(frozen=True)
class IngestResult:
    """What one batch stored: the sample count, the series it created, and its block."""

    num_stored: int
    new_series: dict[SeriesKey, Interned]
    block: blocks.Block


def newest_of_all(written: list[blocks.Block]) -> tuple[packed.Int64s, packed.Floats, packed.Floats]:
    """Per series of the blocks, its newest sample (of equal times, the later block's): ids, times, values."""
    if len(written) == 1:
        b = written[0]
        return packed.newest_per_series(b.series_ids, b.ats, b.values)
    return packed.newest_per_series(
        np.concatenate([b.series_ids for b in written]),
        np.concatenate([b.ats for b in written]),
        np.concatenate([b.values for b in written]),
    )


def upsert(session: Session, table: Table, keys: list[str]) -> Insert:
    """INSERT ... ON CONFLICT (keys) DO UPDATE of every other column, in the session's dialect."""
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    stmt = dialect.insert(table)
    updates = {c.name: stmt.excluded[c.name] for c in table.columns if c.name not in keys}
    result: Insert = stmt.on_conflict_do_update(index_elements=keys, set_=updates)
    return result


def prepare(
    session: Session,
    samples: tuple[Sample, ...],
    metadata: tuple[MetricMeta, ...],
    cache: Mapping[SeriesKey, Interned],
    limits: validation.Limits,
    uncommitted: Mapping[SeriesKey, Interned] | None = None,
) -> IngestResult:
    """Check a batch against its series and intern the new ones; ``write`` stores the samples.

    Raises InvalidRequest or LimitExceeded (the caller's transaction rolls back, nothing written). The caller adds
    ``new_series`` to its cache once committed; ``uncommitted`` holds those interned by earlier batches
    of the same transaction.
    """
    if metadata:
        _store_metadata(session, metadata)
    found: list[Interned | None] = []
    missing: dict[SeriesKey, None] = {}
    for s in samples:
        key = (s.name, s.labels)
        known = cache.get(key)
        if known is None and uncommitted:
            known = uncommitted.get(key)
        if known is None:
            missing[key] = None
        found.append(known)
    new_series = _intern(session, list(missing), samples, limits) if missing else {}
    sids: list[int] = []
    for s, cached in zip(samples, found, strict=True):
        series = cached if cached is not None else new_series[(s.name, s.labels)]
        if series.kind is Kind.COUNTER:
            validation.check_value(s, series.kind)
        sids.append(series.series_id)
    block = blocks.Block(
        np.asarray(sids, dtype=packed.SID),
        np.asarray([s.at for s in samples], dtype=packed.F64),
        np.asarray([s.value for s in samples], dtype=packed.F64),
    )
    return IngestResult(len(sids), new_series, block)


def register(
    session: Session,
    keys: list[SeriesKey],
    metadata: tuple[MetricMeta, ...],
    cache: Mapping[SeriesKey, Interned],
    limits: validation.Limits,
    now: float,
) -> tuple[list[Interned], dict[SeriesKey, Interned]]:
    """Intern checked series keys: each key's series, and those created (for the caller's cache once committed).

    Metadata first, and the per-metric series limit as for a push. Raises InvalidRequest or LimitExceeded, the
    transaction then stores nothing.
    """
    if metadata:
        _store_metadata(session, metadata)
    missing = list(dict.fromkeys(k for k in keys if k not in cache))
    placeholders = tuple(Sample(name, labels, 0.0, now) for name, labels in missing)
    interned = _intern(session, missing, placeholders, limits) if missing else {}
    found = [cache[k] if k in cache else interned[k] for k in keys]
    return found, interned


def write(session: Session, results: list[IngestResult]) -> None:
    """The samples of prepared batches: one block row each, in one statement."""
    written = [r.block for r in results if len(r.block)]
    if written:
        connection = session.connection()
        mark = "%s" if connection.dialect.paramstyle in ("format", "pyformat") else "?"
        connection.exec_driver_sql(blocks.insert_sql(mark), blocks.rows(written))
        earliest_at = min(float(b.ats.min()) for b in written)
        connection.exec_driver_sql(mark_dirty_sql(mark), (earliest_at,) * 3)


def write_packed(tx: RawTransaction, written: list[blocks.Block]) -> None:
    """Write the samples of checked packed pushes (SeriesTable.check) on a raw writer's transaction.

    One block row each, in one INSERT per 1,000 (4,000 parameters: under SQLite's and PostgreSQL's limits), and
    one watermark update. Few statements a group: each is a call into the driver, which gives up and takes back
    the GIL (that the event loop's thread wants).
    """
    rows = blocks.rows([b for b in written if len(b)])
    if rows:
        for i in range(0, len(rows), MAX_ROWS_PER_INSERT):
            part = rows[i : i + MAX_ROWS_PER_INSERT]
            tx.execute(blocks.insert_sql(tx.mark, len(part)), [value for row in part for value in row])
        earliest_at = min(row[0] for row in rows)
        tx.execute(mark_dirty_sql(tx.mark), (earliest_at,) * 3)


def flush_latest(session: Session, latest: Mapping[int, tuple[float, float]]) -> None:
    """Write series' latest samples (kept in memory between flushes) where they are newer."""
    if not latest:
        return
    table = schema.series
    stmt = (
        update(table)
        .where(table.c.series_id == bindparam("sid"), table.c.last_at <= bindparam("at"))
        .values(last_at=bindparam("at"), last_value=bindparam("v"))
    )
    session.connection().execute(stmt, [{"sid": sid, "at": at, "v": to_db(v)} for sid, (at, v) in latest.items()])


def _store_metadata(session: Session, metadata: Iterable[MetricMeta]) -> None:
    rows = {m.name: {"name": m.name, "type": int(m.type), "help": m.help, "unit": m.unit} for m in metadata}
    if rows:
        session.execute(upsert(session, schema.metric_metadata, ["name"]), list(rows.values()))


def known_types(session: Session, names: Iterable[str]) -> dict[str, MetricType]:
    """Stored types of ``names`` and of the base names they may be suffixed forms of."""
    candidates = set()
    for name in names:
        candidates.add(name)
        candidates.update(name.removesuffix(sfx) for sfx in validation.HISTOGRAM_SUFFIXES)
    table = schema.metric_metadata
    rows = session.execute(select(table.c.name, table.c.type).where(table.c.name.in_(sorted(candidates))))
    return {str(name): MetricType(t) for name, t in rows}


def _intern(
    session: Session,
    keys: list[SeriesKey],
    samples: tuple[Sample, ...],
    limits: validation.Limits,
) -> dict[SeriesKey, Interned]:
    found = _find_series(session, keys)
    new = [k for k in keys if k not in found]
    if not new:
        return found
    _check_cardinality(session, new, limits)
    types = known_types(session, {name for name, _ in new})  # metadata of this call is stored already
    first_at: dict[SeriesKey, float] = {}
    last_at: dict[SeriesKey, float] = {}
    for s in samples:
        first_at[(s.name, s.labels)] = min(s.at, first_at.get((s.name, s.labels), s.at))
        last_at[(s.name, s.labels)] = max(s.at, last_at.get((s.name, s.labels), s.at))
    rows = []
    for name, labels in new:
        kind, mtype = validation.classify(name, labels, types)
        rows.append(
            {
                "name": name,
                "labels_hash": labels_hash(labels),
                "labels": labels_json(labels),
                "owner": dict(labels).get(validation.USER_LABEL, ""),
                "kind": int(kind),
                "type": int(mtype),
                "first_at": first_at[(name, labels)],
                "last_at": last_at[(name, labels)],
                "last_value": None,
            }
        )
    session.execute(schema.series.insert(), rows)
    return {**found, **_find_series(session, new)}


def _find_series(session: Session, keys: list[SeriesKey]) -> dict[SeriesKey, Interned]:
    table = schema.series
    by_hash = {(name, labels_hash(labels)): (name, labels) for name, labels in keys}
    hashes = sorted({h for _, h in by_hash})
    found: dict[SeriesKey, Interned] = {}
    for i in range(0, len(hashes), 900):
        stmt = select(table.c.series_id, table.c.name, table.c.labels_hash, table.c.kind).where(
            table.c.labels_hash.in_(hashes[i : i + 900])
        )
        for sid, name, h, kind in session.execute(stmt):
            key = by_hash.get((name, h))
            if key is not None:
                found[key] = Interned(int(sid), Kind(kind))
    return found


def _check_cardinality(session: Session, new: list[SeriesKey], limits: validation.Limits) -> None:
    adding: dict[str, int] = {}
    for name, _ in new:
        adding[name] = adding.get(name, 0) + 1
    table = schema.series
    stmt = select(table.c.name, func.count()).where(table.c.name.in_(sorted(adding))).group_by(table.c.name)
    existing = {str(name): int(n) for name, n in session.execute(stmt)}
    for name, n in sorted(adding.items()):
        if existing.get(name, 0) + n > limits.max_series_per_metric:
            raise LimitExceeded(
                f"metric {name!r} would have {existing.get(name, 0) + n} series, "
                f"the limit is {limits.max_series_per_metric} (too many distinct label values)"
            )


def mark_dirty_sql(mark: str) -> str:
    """The UPDATE that makes a tier compute again the buckets of samples older than its watermark.

    Its three parameters are the earliest sample time written, ``mark`` the driver's placeholder. Plain SQL: it runs
    once per group commit, on the hot path (building the expression cost more than running it).
    """
    return (
        f"UPDATE {schema.watermarks.name} SET dirty_since = {mark} "
        f"WHERE done_until > {mark} AND (dirty_since IS NULL OR dirty_since > {mark})"
    )
