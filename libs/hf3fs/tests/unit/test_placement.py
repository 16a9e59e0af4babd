"""Placement balance: every target used once, replicas on distinct nodes, peers spread evenly."""

from __future__ import annotations

from collections import Counter

import pytest

from hf3fs.placement import PlacementError, pair_counts, place_chains


@pytest.mark.parametrize(("nodes", "disks", "per_disk", "r"), [(3, 1, 2, 3), (5, 1, 6, 3), (6, 1, 5, 3), (4, 2, 3, 2)])
def test_balanced(nodes: int, disks: int, per_disk: int, r: int) -> None:
    chains = place_chains(list(range(1, nodes + 1)), disks, per_disk, r)
    assert len(chains) == nodes * disks * per_disk // r
    ids = [t.target_id for c in chains for t in c.targets]
    assert len(ids) == len(set(ids))
    assert all(len({t.node_id for t in c.targets}) == r for c in chains)
    use = Counter((t.node_id, t.disk_index) for c in chains for t in c.targets)
    assert set(use.values()) == {per_disk}
    pairs = pair_counts(chains)
    cross_node = [v for (a, b), v in pairs.items() if a[0] != b[0]]
    possible = nodes * disks * (nodes - 1) * disks // 2
    # Greedy, not an exact BIBD: every pair of disks on different nodes shares chains, within 2 of each other.
    assert len(cross_node) == possible or len(chains) * r * (r - 1) // 2 < possible
    assert max(cross_node) - min(cross_node) <= 2
    heads = Counter(c.targets[0].node_id for c in chains)
    assert max(heads.values()) - min(heads.values()) <= 2


def test_bibd_example_of_3fs() -> None:
    """--num_nodes 5 --replication_factor 3 --min_targets_per_disk 6 -> v5 b10 r6 k3 lambda 2."""
    chains = place_chains([1, 2, 3, 4, 5], 1, 6, 3)
    assert len(chains) == 10
    assert set(pair_counts(chains).values()) == {3} or set(pair_counts(chains).values()) <= {2, 3, 4}


def test_impossible_layouts() -> None:
    with pytest.raises(PlacementError):
        place_chains([1, 2], 1, 3, 3)
    with pytest.raises(PlacementError):
        place_chains([1, 2, 3, 4], 1, 1, 3)
