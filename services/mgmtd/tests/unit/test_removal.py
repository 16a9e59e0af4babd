from __future__ import annotations

import pytest

from ff_mgmtd.core.errors import NoFreeId
from ff_mgmtd.core.model import Node, NodeStatus, NodeType
from ff_mgmtd.core.removal import lowest_free_id, removal_refusals


def test_a_node_is_removable_only_dead_disabled_and_holding_no_target() -> None:
    gone = Node(node_id=4, node_type=NodeType.STORAGE, hostname="h", status=NodeStatus.DEAD, enabled=False)
    assert removal_refusals(gone, [], lease_duration_s=10.0) == []
    alive = Node(node_id=4, node_type=NodeType.STORAGE, hostname="h")
    reasons = removal_refusals(alive, [(40001, 1), (40002, 7)], lease_duration_s=10.0)
    assert [r.split(" (")[0].split(":")[0] for r in reasons] == [
        "it is alive",
        "it is enabled",
        "it holds chain targets 40001",
    ]
    assert "within 10s" in reasons[0] and "40001 (chain 1), 40002 (chain 7)" in reasons[2]


def test_past_the_largest_id_the_lowest_never_used_one_is_given() -> None:
    assert lowest_free_id([1, 2, 4, 2**32 - 1], 2**32 - 1) == 3
    assert lowest_free_id([2, 3], 5) == 1
    with pytest.raises(NoFreeId):
        lowest_free_id(range(1, 6), 5)
    assert lowest_free_id([5, 100_000, 100_001, 100_003], 2**32 - 1, start=100_000) == 100_002
    with pytest.raises(NoFreeId, match=r"100000\.\.100001"):
        lowest_free_id([100_000, 100_001], 100_001, start=100_000)
