"""How ``store.bulk`` names many ids in an UPDATE: runs of consecutive ids as ranges, the rest one by one."""

from __future__ import annotations

import pytest

from ff_scheduler.store import bulk

pytestmark = pytest.mark.unit


def test_id_ranges_split_runs_from_singles() -> None:
    assert bulk.id_ranges([]) == ([], [])
    assert bulk.id_ranges([1, 2, 3, 5, 6, 9, 10, 11, 12], min_range=3) == ([(1, 3), (9, 12)], [5, 6])
    assert bulk.id_ranges(list(range(100, 108)), min_range=8) == ([(100, 107)], [])
    assert bulk.id_ranges(list(range(100, 107)), min_range=8) == ([], list(range(100, 107)))
