"""Packed pushes, pure: decoding the arrays, checking ids against the registered series, newest samples."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ff_telemetry.core.errors import InvalidRequest, NotYourSeries, StaleRegistration, UnknownSeries
from ff_telemetry.core.model import Kind
from ff_telemetry.core.packed import LatestTable, SeriesTable, decode, newest_per_series
from ff_telemetry.core.validation import Limits

NOW = 1_000_000.0


def ids(*v: int) -> bytes:
    return np.asarray(v, "<i8").tobytes()


def floats(*v: float) -> bytes:
    return np.asarray(v, "<f8").tobytes()


def test_decode_reads_little_endian_arrays_and_stamps_missing_times() -> None:
    got = decode(ids(3, 4), floats(0.5, math.nan), b"", now=NOW, limits=Limits())
    assert got.series_ids.tolist() == [3, 4] and got.ats.tolist() == [NOW, NOW]
    assert got.values[0] == 0.5 and math.isnan(got.values[1])
    got = decode(ids(3), floats(1.0), floats(NOW - 5), now=NOW, limits=Limits())
    assert got.ats.tolist() == [NOW - 5]


@pytest.mark.parametrize(
    ("args", "detail"),
    [
        ((ids(1), floats(1.0) + b"x", b""), "not a whole number of 8-byte items"),
        ((ids(1, 2), floats(1.0), b""), "2 series ids but 1 values"),
        ((ids(1), floats(1.0), floats(NOW, NOW)), "1 series ids but 2 times"),
        ((ids(1), floats(1.0), floats(math.nan)), "outside"),
        ((ids(1), floats(1.0), floats(NOW + 301)), "outside"),
        ((ids(*range(11)), floats(*range(11)), b""), "11 samples in one call, at most 10"),
    ],
)
def test_decode_refuses_what_does_not_fit(args: tuple[bytes, bytes, bytes], detail: str) -> None:
    with pytest.raises(InvalidRequest, match=detail):
        decode(*args, now=NOW, limits=Limits(max_samples=10))


def test_series_table_checks_epoch_registration_owner_and_counter_values() -> None:
    table = SeriesTable(epoch=7)
    table.add(1, "", Kind.GAUGE)
    table.add(5000, "alice", Kind.COUNTER)  # grows the arrays
    ok = decode(ids(5000, 5000), floats(1.0, 2.0), b"", now=NOW, limits=Limits())
    table.check(7, ok, "alice")
    table.check(7, ok, None)  # the cluster may write any series
    with pytest.raises(StaleRegistration):
        table.check(8, ok, "alice")
    with pytest.raises(NotYourSeries, match="'bob'"):
        table.check(7, ok, "bob")
    with pytest.raises(NotYourSeries, match="series id 1 "):
        table.check(7, decode(ids(5000, 1), floats(1, 1), b"", now=NOW, limits=Limits()), "alice")
    for bad in (ids(2), ids(-3), ids(10**12)):
        with pytest.raises(UnknownSeries):
            table.check(7, decode(bad, floats(1.0), b"", now=NOW, limits=Limits()), None)
    for value in (-1.0, math.nan, math.inf):
        with pytest.raises(InvalidRequest, match="must be finite and >= 0"):
            table.check(7, decode(ids(1, 5000), floats(value, value), b"", now=NOW, limits=Limits()), None)
    table.check(7, decode(ids(1), floats(math.nan), b"", now=NOW, limits=Limits()), None)  # a gauge may be NaN
    table.clear()
    with pytest.raises(UnknownSeries):
        table.check(7, ok, "alice")


def test_newest_per_series_takes_the_latest_time_and_the_last_pushed_of_equal_times() -> None:
    sids = np.asarray([4, 2, 4, 4, 2], np.int64)
    ats = np.asarray([5.0, 1.0, 9.0, 9.0, 0.5])
    values = np.asarray([1.0, 2.0, 3.0, 4.0, 5.0])
    got = newest_per_series(sids, ats, values)
    assert [a.tolist() for a in got] == [[2, 4], [1.0, 9.0], [2.0, 4.0]]


def test_latest_table_keeps_the_newer_and_forgets_what_it_gave() -> None:
    table = LatestTable()
    table.update(np.asarray([3, 2000]), np.asarray([10.0, 5.0]), np.asarray([1.0, 2.0]))
    table.update(np.asarray([3]), np.asarray([9.0]), np.asarray([7.0]))  # older: ignored
    taken = table.take()
    assert taken == {3: (10.0, 1.0), 2000: (5.0, 2.0)} and table.take() == {}
    table.update(np.asarray([3]), np.asarray([11.0]), np.asarray([8.0]))
    table.restore(taken)  # a failed flush puts back only what is not newer
    assert table.take() == {3: (11.0, 8.0), 2000: (5.0, 2.0)}
