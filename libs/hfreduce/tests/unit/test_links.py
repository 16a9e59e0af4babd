"""The links every rank asks for: each one matched by its peer, tree links one per direction, ring links."""

from __future__ import annotations

import random

import pytest

from hfreduce.joining import RING_DOWN, RING_UP, TREE_DOWN, TREE_UP, wanted_links
from hfreduce.trees import build_trees, node_order


def zone_layouts() -> list[list[str]]:
    """Node zone labels: one zone; interleaved, blocked and random labels (chained per-zone trees)."""
    layouts: list[list[str]] = []
    for nodes in [*range(1, 20), 31, 32, 33, 64, 65, 127, 128, 129]:
        layouts.append(["a"] * nodes)
        layouts.append(["ab"[n % 2] for n in range(nodes)])
        layouts.append(["abc"[n * 3 // nodes] for n in range(nodes)])
        rng = random.Random(nodes)
        layouts.append([rng.choice("xyz") for _ in range(nodes)])
    return layouts


@pytest.mark.parametrize("num_local", [1, 2, 3])
def test_every_link_is_matched_and_each_tree_neighbour_gets_one_per_direction(num_local: int) -> None:
    for zones in zone_layouts():
        trees = build_trees(zones)
        ring_order = [n * num_local + lr for n in node_order(zones) for lr in range(num_local)]
        world = len(zones) * num_local
        wanted = {
            node * num_local + lr: wanted_links(trees, ring_order, node, lr, num_local)
            for node in range(len(zones))
            for lr in range(num_local)
        }
        for rank, links in wanted.items():
            assert len(links) == len(set(links)), (zones, rank, links)
            for peer, channel in links:
                assert peer != rank
                assert (rank, channel) in wanted[peer], (zones, rank, peer, channel)  # the peer asks for it too
            node, lr = divmod(rank, num_local)
            for t in (0, 1):
                tree_node = trees[t][node]
                neighbours = [nb for nb in (tree_node.parent, *tree_node.children) if nb >= 0]
                for channel in (TREE_UP[t], TREE_DOWN[t]):
                    # the same local rank of each tree neighbour, once per direction
                    assert sorted(p for p, c in links if c == channel) == sorted(
                        nb * num_local + lr for nb in neighbours
                    )
            ring = sorted(p for p, c in links if c in (RING_UP, RING_DOWN))
            pos = ring_order.index(rank)
            expect = sorted({ring_order[(pos + 1) % world], ring_order[(pos - 1) % world]} - {rank})
            assert sorted(set(ring)) == expect
            assert len(ring) == (2 if world > 1 else 0)  # two links even when both ring neighbours are one rank


def test_channels_are_distinct() -> None:
    channels = [*TREE_UP, *TREE_DOWN, RING_UP, RING_DOWN]
    assert len(set(channels)) == len(channels)
