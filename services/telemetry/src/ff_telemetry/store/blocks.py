"""Raw samples as blocks: one row per pushed batch, its (series id, time, value) triples packed in a blob.

Writing a batch of 500 samples is one row (not 500 index entries): that is what makes ingest cheap. A
blob has one of two layouts, told apart by its length (``pack``); the compact one halves what a push
stamped at receipt writes (6 KB instead of 12 KB for 500 samples: fewer pages in the WAL and the file). Reads
decode the blocks that overlap a window with numpy and keep the wanted series; where two blocks hold the
same series and time, the later block wins (a retried push replaces). Raw is the short-lived tier (the
job turns it into 1-minute buckets), so reads stay within hours.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from ff_telemetry.core.errors import LimitExceeded
from ff_telemetry.store import schema

_SID = np.dtype("<i8")
_SID32 = np.dtype("<i4")
_F64 = np.dtype("<f8")
_MAX_SID32 = 2**31 - 1
Int64s = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]


def pack(series_ids: npt.ArrayLike, ats: npt.ArrayLike, values: npt.ArrayLike) -> bytes:
    """The blob of a block of n samples, little-endian (NaN stays NaN), in one of two layouts.

    - 24 n bytes: all ids (int64), then all times, then all values;
    - 12 n + 8 bytes (compact), when every sample has the same time and every id fits in 31 bits (a push
      stamped at receipt): all ids (int32), the one time, then all values.

    ``unpack`` tells them apart by the length: 24 n = 12 n + 8 has no whole solution.
    """
    times = np.asarray(ats, dtype=_F64)
    same_time = len(times) > 0 and bool(times.min() == times.max())
    return _pack(np.asarray(series_ids, dtype=_SID), times, np.asarray(values, dtype=_F64), same_time)


def _pack(sids: Int64s, ats: Floats, values: Floats, same_time: bool) -> bytes:
    if same_time and len(sids) and int(sids.min()) >= 0 and int(sids.max()) <= _MAX_SID32:
        return sids.astype(_SID32).tobytes() + ats[:1].tobytes() + values.tobytes()
    return sids.tobytes() + ats.tobytes() + values.tobytes()


def unpack(count: int, data: bytes) -> tuple[Int64s, Floats, Floats]:
    """Ids, times and values of a blob of ``count`` samples, in either layout of ``pack``."""
    n = count
    if len(data) == 24 * n:
        return (
            np.frombuffer(data, _SID, n, 0),
            np.frombuffer(data, _F64, n, 8 * n),
            np.frombuffer(data, _F64, n, 16 * n),
        )
    if len(data) == 12 * n + 8:
        at = float(np.frombuffer(data, _F64, 1, 4 * n)[0])
        sids = np.frombuffer(data, _SID32, n, 0).astype(_SID)
        return sids, np.full(n, at), np.frombuffer(data, _F64, n, 4 * n + 8)
    raise ValueError(f"a block of {n} samples cannot have {len(data)} bytes")


@dataclass(frozen=True)
class RawPoints:
    """Decoded samples, sorted by (series id, time), one per (series id, time)."""

    series_ids: npt.NDArray[np.int64]
    ats: npt.NDArray[np.float64]
    values: npt.NDArray[np.float64]

    def by_series(self) -> dict[int, list[tuple[float, float]]]:
        """The block's ``(at, value)`` points by series id (the block is sorted by series)."""
        out: dict[int, list[tuple[float, float]]] = {}
        if not len(self.series_ids):
            return out
        starts = np.flatnonzero(np.diff(self.series_ids, prepend=self.series_ids[0] - 1))
        bounds = [*starts.tolist(), len(self.series_ids)]
        ats, values = self.ats.tolist(), self.values.tolist()
        for i, sid in enumerate(self.series_ids[starts].tolist()):
            lo, hi = bounds[i], bounds[i + 1]
            out[int(sid)] = list(zip(ats[lo:hi], values[lo:hi], strict=True))
        return out


@dataclass(frozen=True)
class Block:
    """The samples of one push, in columns."""

    series_ids: npt.NDArray[np.int64]
    ats: npt.NDArray[np.float64]
    values: npt.NDArray[np.float64]

    def __len__(self) -> int:
        return len(self.series_ids)


def insert_sql(mark: str, num_rows: int = 1) -> str:
    """The INSERT of ``num_rows`` blocks in one statement, with the driver's placeholder ``mark`` (``?``, ``%s``).

    Its parameters are the rows' values one after the other.
    """
    row = f"({mark}, {mark}, {mark}, {mark})"
    return f"INSERT INTO {schema.sample_blocks.name} (min_at, max_at, count, data) VALUES {', '.join([row] * num_rows)}"


def rows(new: list[Block]) -> list[tuple[float, float, int, bytes]]:
    """The rows of ``insert_sql`` for blocks: plain tuples, no per-row parameter processing."""
    out = []
    for b in new:
        ats = np.asarray(b.ats, dtype=_F64)
        lo, hi = float(ats.min()), float(ats.max())
        sids, values = np.asarray(b.series_ids, dtype=_SID), np.asarray(b.values, dtype=_F64)
        out.append((lo, hi, len(b), _pack(sids, ats, values, lo == hi)))
    return out


def read(
    session: Session,
    lo: float,
    hi: float,
    wanted: Collection[int] | None = None,
    *,
    closed_low: bool = False,
    max_samples: int | None = None,
) -> RawPoints:
    """Samples with lo < at <= hi (lo <= at < hi with ``closed_low``) of the ``wanted`` series (None: all).

    Raises LimitExceeded when the blocks to decode hold more than ``max_samples``.
    """
    t = schema.sample_blocks
    overlap = (t.c.max_at >= lo, t.c.min_at <= hi)
    if max_samples is not None:
        total = int(session.execute(select(func.coalesce(func.sum(t.c.count), 0)).where(*overlap)).scalar_one())
        if total > max_samples:
            raise LimitExceeded(
                f"the raw samples of this window are {total:,}, more than {max_samples:,} to read: "
                "ask a shorter window or resolution_s=60"
            )
    stmt = select(t.c.count, t.c.data).where(*overlap).order_by(t.c.block_id)
    parts = [(int(n), bytes(data)) for n, data in session.execute(stmt)]
    if not parts:
        empty = np.empty(0)
        return RawPoints(empty.astype(_SID), empty, empty)
    decoded = [unpack(n, data) for n, data in parts]
    sids = np.concatenate([d[0] for d in decoded])
    ats = np.concatenate([d[1] for d in decoded])
    values = np.concatenate([d[2] for d in decoded])
    keep = ((ats >= lo) & (ats < hi)) if closed_low else ((ats > lo) & (ats <= hi))
    if wanted is not None:
        keep &= np.isin(sids, np.fromiter(wanted, dtype=_SID, count=len(wanted)))
    order = np.arange(len(sids))[keep]  # block order: a later copy of a sample comes later
    sids, ats, values = sids[keep], ats[keep], values[keep]
    by_key = np.lexsort((order, ats, sids))
    sids, ats, values = sids[by_key], ats[by_key], values[by_key]
    last_of_key = np.ones(len(sids), dtype=bool)
    last_of_key[:-1] = (sids[1:] != sids[:-1]) | (ats[1:] != ats[:-1])
    return RawPoints(sids[last_of_key], ats[last_of_key], values[last_of_key])


def earliest(session: Session) -> float | None:
    """The time of the oldest raw sample stored (unix seconds); None when there is none."""
    value = session.execute(select(func.min(schema.sample_blocks.c.min_at))).scalar()
    return None if value is None else float(value)


def count(session: Session) -> int:
    """The number of raw samples stored."""
    return int(session.execute(select(func.coalesce(func.sum(schema.sample_blocks.c.count), 0))).scalar_one())


def expire(session: Session, before: float) -> int:
    """Delete the blocks whose every sample is older than ``before``; the number of samples deleted."""
    t = schema.sample_blocks
    gone = t.c.max_at < before
    num = int(session.execute(select(func.coalesce(func.sum(t.c.count), 0)).where(gone)).scalar_one())
    session.execute(delete(t).where(gone))
    return num
