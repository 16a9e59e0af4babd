"""Packed pushes: samples of registered series as arrays, checked without a Python loop per sample.

A client registers its series once (RegisterSeries: names and labels checked as PushSamples checks them,
interned, ids answered) and then pushes ids, values and times as packed little-endian arrays. Everything
here is a handful of numpy operations over the whole push, which is what makes ingest cost about as much
as receiving the bytes (bench/telemetry_ingest.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ff_telemetry.core.errors import InvalidRequest, NotYourSeries, StaleRegistration, UnknownSeries
from ff_telemetry.core.model import Kind
from ff_telemetry.core.validation import FUTURE_SLACK_S, Limits

SID = np.dtype("<i8")
F64 = np.dtype("<f8")
Int64s = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]

# SeriesTable owner codes: 0 = not registered here, 1 = the cluster's series (no `user` label).
_UNREGISTERED = 0
_CLUSTER = 1


@dataclass(frozen=True)
class PackedSamples:
    """A decoded push: n samples in three arrays (read-only views of the request's bytes)."""

    series_ids: Int64s
    ats: Floats
    values: Floats

    def __len__(self) -> int:
        return len(self.series_ids)


def _items(data: bytes, what: str) -> int:
    if len(data) % 8:
        raise InvalidRequest(f"{what} is {len(data)} bytes, not a whole number of 8-byte items")
    return len(data) // 8


def decode(series_ids: bytes, values: bytes, sampled_at: bytes, *, now: float, limits: Limits) -> PackedSamples:
    """The samples of a packed push; InvalidRequest for lengths that do not fit or times out of range.

    Empty ``sampled_at`` means every sample is at ``now``. Times must lie in [now - max_sample_age_s,
    now + FUTURE_SLACK_S] (NaN does not).
    """
    n = _items(series_ids, "series_ids")
    if _items(values, "values") != n:
        raise InvalidRequest(f"{n} series ids but {len(values) // 8} values")
    if n > limits.max_samples:
        raise InvalidRequest(f"{n} samples in one call, at most {limits.max_samples}")
    if sampled_at:
        if _items(sampled_at, "sampled_at") != n:
            raise InvalidRequest(f"{n} series ids but {len(sampled_at) // 8} times")
        ats = np.frombuffer(sampled_at, F64)
        earliest, latest = now - limits.max_sample_age_s, now + FUTURE_SLACK_S
        inside = (ats >= earliest) & (ats <= latest)  # False for NaN
        if not inside.all():
            bad = int(np.flatnonzero(~inside)[0])
            raise InvalidRequest(
                f"sample {bad} at {float(ats[bad])}: outside [now - {limits.max_sample_age_s:g} s, "
                f"now + {FUTURE_SLACK_S:g} s]"
            )
    else:
        ats = np.full(n, now, dtype=F64)
    return PackedSamples(np.frombuffer(series_ids, SID), ats, np.frombuffer(values, F64))


class SeriesTable:
    """The series this collector instance registered: per id, whose it is and whether it is a counter.

    Arrays indexed by series id (ids are the database's, small and dense), so checking a push is a
    gather and a comparison. ``epoch`` names the instance: ids registered by another one (or before a
    restart) are refused with StaleRegistration, and the client registers again.
    """

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self._owner = np.zeros(1024, dtype=np.int32)
        self._counter = np.zeros(1024, dtype=bool)
        self._owner_codes: dict[str, int] = {"": _CLUSTER}

    def __len__(self) -> int:
        return int(np.count_nonzero(self._owner))

    def add(self, series_id: int, owner: str, kind: Kind) -> None:
        """Register ``series_id`` as ``owner``'s ("": the cluster's); safe beside ``check`` on another thread.

        Raises:
            ValueError: ``series_id`` is negative.
        """
        if series_id < 0:
            raise ValueError(f"series id {series_id} < 0")
        # Registration runs in a worker thread while the event loop checks pushes: the counter flags grow and
        # are set before the owners, so a check never sees an owner without its flag (nor an index past them).
        if series_id >= len(self._owner):
            size = max(series_id + 1, 2 * len(self._owner))
            self._counter = np.concatenate([self._counter, np.zeros(size - len(self._counter), bool)])
            self._owner = np.concatenate([self._owner, np.zeros(size - len(self._owner), np.int32)])
        code = self._owner_codes.setdefault(owner, len(self._owner_codes) + 1)
        self._counter[series_id] = kind is Kind.COUNTER
        self._owner[series_id] = code

    def clear(self) -> None:
        """Forget every registration (series were deleted): clients get UnknownSeries and register again."""
        self._owner[:] = _UNREGISTERED
        self._counter[:] = False

    def check(self, epoch: int, samples: PackedSamples, owner: str | None) -> None:
        """Check that every sample is of a series registered here that ``owner`` may write.

        Args:
            epoch: the collector instance the client registered its series with.
            samples: the pushed samples.
            owner: the pushing user's name, or None for the cluster (which may write any series).

        Raises:
            StaleRegistration: ``epoch`` is not this instance's (it restarted): register again.
            UnknownSeries: a series is not registered.
            NotYourSeries: a series is another user's.
            InvalidRequest: a counter's value is negative or not finite.
        """
        if epoch != self.epoch:
            raise StaleRegistration(
                f"series registered with collector instance {epoch:#x}, this is {self.epoch:#x}: register again"
            )
        sids = samples.series_ids
        if not len(sids):
            return
        owner_of = self._owner  # then the flags: they are never shorter than the owners read before them
        is_counter = self._counter
        in_range = (sids >= 0) & (sids < len(owner_of))
        if not in_range.all():
            raise UnknownSeries(
                f"series id {int(sids[np.flatnonzero(~in_range)[0]])} is not registered: register again"
            )
        owners = owner_of[sids]
        if not owners.all():
            raise UnknownSeries(
                f"series id {int(sids[np.flatnonzero(owners == 0)[0]])} is not registered: register again"
            )
        if owner is not None:
            code = self._owner_codes.get(owner, -1)
            if not (owners == code).all():
                bad = int(sids[np.flatnonzero(owners != code)[0]])
                raise NotYourSeries(f"series id {bad} is not one of {owner!r}'s series")
        counters = is_counter[sids]
        if counters.any():
            values = samples.values[counters]
            ok = np.isfinite(values) & (values >= 0)
            if not ok.all():
                bad = int(np.flatnonzero(~ok)[0])
                raise InvalidRequest(
                    f"counter series {int(sids[counters][bad])} has value {float(values[bad])}: must be finite and >= 0"
                )


def newest_per_series(sids: Int64s, ats: Floats, values: Floats) -> tuple[Int64s, Floats, Floats]:
    """Each series' newest sample (the last pushed among equal times): ids ascending, times, values."""
    if not len(sids):
        return sids, ats, values
    order = np.lexsort((np.arange(len(sids)), ats, sids))
    s = sids[order]
    last = np.ones(len(s), dtype=bool)
    last[:-1] = s[1:] != s[:-1]
    pick = order[last]
    return sids[pick], ats[pick], values[pick]


class LatestTable:
    """Series' newest samples not yet written to SQL, in arrays indexed by series id (no per-sample dict)."""

    def __init__(self) -> None:
        self._at = np.full(1024, -np.inf)
        self._value = np.zeros(1024)

    def update(self, sids: Int64s, ats: Floats, values: Floats) -> None:
        """Keep, per series, the newer of what is held and (``sids``, ``ats``, ``values``), unique ids."""
        if not len(sids):
            return
        top = int(sids.max())
        if top >= len(self._at):
            size = max(top + 1, 2 * len(self._at))
            self._at = np.concatenate([self._at, np.full(size - len(self._at), -np.inf)])
            self._value = np.concatenate([self._value, np.zeros(size - len(self._value))])
        newer = ats >= self._at[sids]
        self._at[sids[newer]] = ats[newer]
        self._value[sids[newer]] = values[newer]

    def take(self) -> dict[int, tuple[float, float]]:
        """What is held, as series id -> (at, value), and forget it."""
        held = np.flatnonzero(self._at > -np.inf)
        out = dict(
            zip(held.tolist(), zip(self._at[held].tolist(), self._value[held].tolist(), strict=True), strict=True)
        )
        self._at[held] = -np.inf
        return out

    def restore(self, taken: dict[int, tuple[float, float]]) -> None:
        """Put back what ``take`` gave (a flush failed), unless newer samples came since."""
        if taken:
            sids = np.fromiter(taken, dtype=SID, count=len(taken))
            ats = np.fromiter((at for at, _ in taken.values()), dtype=F64, count=len(taken))
            values = np.fromiter((v for _, v in taken.values()), dtype=F64, count=len(taken))
            self.update(sids, ats, values)
