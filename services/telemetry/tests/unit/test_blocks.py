"""Block blobs, pure: both layouts round-trip (NaN and the largest ids included) and are told apart by length."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ff_telemetry.store.blocks import pack, unpack


@pytest.mark.parametrize(
    ("sids", "ats", "expected_bytes"),
    [
        ([3, 1, 2**31 - 1], [5.0, 5.0, 5.0], 12 * 3 + 8),  # stamped at receipt: compact
        ([3, 1, 2**31], [5.0, 5.0, 5.0], 24 * 3),  # an id past 31 bits
        ([3, 1, 2], [5.0, 6.0, 5.0], 24 * 3),  # times differ
        ([7], [1.5], 12 + 8),
        ([], [], 0),
    ],
)
def test_a_block_round_trips_in_the_layout_that_fits(sids: list[int], ats: list[float], expected_bytes: int) -> None:
    values = [math.nan, -1.0, math.inf][: len(sids)]
    data = pack(sids, ats, values)
    assert len(data) == expected_bytes
    got_sids, got_ats, got_values = unpack(len(sids), data)
    assert got_sids.dtype == np.int64 and got_sids.tolist() == sids
    assert got_ats.tolist() == ats
    np.testing.assert_array_equal(got_values, np.asarray(values, dtype=float))


def test_a_blob_of_neither_length_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot have 30 bytes"):
        unpack(2, b"\0" * 30)
