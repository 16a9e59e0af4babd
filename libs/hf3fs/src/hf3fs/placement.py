"""Chain-table placement (pure): N nodes x D disks x K targets per disk into chains of R replicas.

3FS solves this as a balanced incomplete block design with an integer program; here a greedy
construction does the same job for small clusters: every chain takes R disks on R different nodes,
choosing the disks with the most unused targets and, among those, the set whose pairs have been together
least. So each disk's targets have their peers spread evenly over the other disks, and when a disk fails
its read load spreads over many peers. Heads rotate so that writes spread too.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass

Disk = tuple[int, int]  # (node id, disk index)


class PlacementError(ValueError):
    """The asked layout cannot be built."""


@dataclass(frozen=True, kw_only=True)
class PlacedTarget:
    """One replica of a chain: the target and the node and disk it lives on."""

    target_id: int
    node_id: int
    disk_index: int


@dataclass(frozen=True, kw_only=True)
class PlacedChain:
    """A chain of replicas, head first (writes enter at the head and commit at the tail)."""

    chain_id: int
    targets: tuple[PlacedTarget, ...]  # head first


def target_id_for(node_id: int, disk_index: int, slot: int) -> int:
    """Readable ids: node 3, disk 1, slot 4 -> 3_01_05 = 30105."""
    return node_id * 10_000 + disk_index * 100 + slot + 1


def place_chains(
    node_ids: list[int], num_disks: int, targets_per_disk: int, replication: int, first_chain_id: int = 1
) -> list[PlacedChain]:
    """Balanced chains over every target of every disk.

    Raises:
        PlacementError: fewer nodes than replicas, or a target count that chains of R do not divide.
    """
    if replication < 1 or num_disks < 1 or targets_per_disk < 1:
        raise PlacementError("replication, disks and targets per disk must be at least 1")
    if len(set(node_ids)) != len(node_ids) or len(node_ids) < replication:
        raise PlacementError(f"need at least {replication} distinct nodes for chains of {replication}")
    disks: list[Disk] = [(n, d) for n in node_ids for d in range(num_disks)]
    total = len(disks) * targets_per_disk
    if total % replication:
        raise PlacementError(f"{total} targets do not split into chains of {replication}")
    free = dict.fromkeys(disks, targets_per_disk)
    pairs: Counter[tuple[Disk, Disk]] = Counter()
    heads: Counter[Disk] = Counter()
    chains: list[PlacedChain] = []
    for chain_no in range(total // replication):
        chosen = _choose(disks, free, pairs, replication)
        for a, b in itertools.combinations(sorted(chosen), 2):
            pairs[(a, b)] += 1
        # The member that has been head least leads the chain.
        chosen.sort(key=lambda d: (heads[d], d))
        heads[chosen[0]] += 1
        targets = []
        for disk in chosen:
            slot = targets_per_disk - free[disk]
            free[disk] -= 1
            targets.append(
                PlacedTarget(target_id=target_id_for(disk[0], disk[1], slot), node_id=disk[0], disk_index=disk[1])
            )
        chains.append(PlacedChain(chain_id=first_chain_id + chain_no, targets=tuple(targets)))
    return chains


def _choose(disks: list[Disk], free: dict[Disk, int], pairs: Counter[tuple[Disk, Disk]], r: int) -> list[Disk]:
    """R disks on distinct nodes: most free targets first, then fewest pairings, then stable order."""
    open_disks = sorted((d for d in disks if free[d] > 0), key=lambda d: (-free[d], d))
    best: tuple[tuple[int, ...], list[Disk]] | None = None
    # Search among a bounded window of the freest disks (enough for balance, cheap for big clusters).
    window = open_disks[: max(r + 9, 4 * r)]
    for combo in itertools.combinations(window, r):
        if len({d[0] for d in combo}) < r:
            continue
        score = (
            max(pairs[(a, b)] for a, b in itertools.combinations(sorted(combo), 2)) if r > 1 else 0,
            -sum(free[d] for d in combo),
            sum(pairs[(a, b)] for a, b in itertools.combinations(sorted(combo), 2)) if r > 1 else 0,
        )
        if best is None or score < best[0]:
            best = (score, list(combo))
    if best is None:
        raise PlacementError("no set of disks on distinct nodes has free targets left")
    return best[1]


def pair_counts(chains: list[PlacedChain]) -> Counter[tuple[Disk, Disk]]:
    """How many chains each pair of disks shares (the balance measure)."""
    counts: Counter[tuple[Disk, Disk]] = Counter()
    for chain in chains:
        members = sorted((t.node_id, t.disk_index) for t in chain.targets)
        for a, b in itertools.combinations(members, 2):
            counts[(a, b)] += 1
    return counts
