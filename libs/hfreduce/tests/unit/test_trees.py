"""Tree construction against a literal transcription of NCCL's src/graph/trees.cc."""

from __future__ import annotations

import pytest

from hfreduce.trees import NO_RANK, Tree, build_trees, cross_zone_pairs, double_binary_tree, nccl_btree


def c_get_btree(nranks: int, rank: int) -> tuple[int, int, int]:
    """ncclGetBtree transcribed statement by statement (C semantics, for loop and all)."""
    bit = 1
    while bit < nranks:
        if bit & rank:
            break
        bit <<= 1
    if rank == 0:
        return -1, -1, (bit >> 1) if nranks > 1 else -1
    up = (rank ^ bit) | (bit << 1)
    if up >= nranks:
        up = rank ^ bit
    lowbit = bit >> 1
    down0 = -1 if lowbit == 0 else rank - lowbit
    down1 = -1 if lowbit == 0 else rank + lowbit
    while down1 >= nranks:
        down1 = -1 if lowbit == 0 else rank + lowbit
        lowbit >>= 1
    return up, down0, down1


def c_get_dtree(nranks: int, rank: int) -> tuple[int, int, int]:
    """The second tree of ncclGetDtree."""
    if nranks % 2 == 1:
        u, d0, d1 = c_get_btree(nranks, (rank - 1 + nranks) % nranks)
        return tuple(-1 if x == -1 else (x + 1) % nranks for x in (u, d0, d1))  # type: ignore[return-value]
    u, d0, d1 = c_get_btree(nranks, nranks - 1 - rank)
    return tuple(-1 if x == -1 else nranks - 1 - x for x in (u, d0, d1))  # type: ignore[return-value]


def links(tree: Tree, rank: int) -> tuple[int, set[int]]:
    return tree[rank].parent, set(tree[rank].children)


@pytest.mark.parametrize("nranks", [*range(1, 70), 127, 128, 129, 255, 256, 1000, 1440])
def test_both_trees_match_nccl(nranks: int) -> None:
    first, second = double_binary_tree(nranks)
    for rank in range(nranks):
        u, d0, d1 = c_get_btree(nranks, rank)
        assert links(first, rank) == (u, {d for d in (d0, d1) if d != -1})
        u, d0, d1 = c_get_dtree(nranks, rank)
        assert links(second, rank) == (u, {d for d in (d0, d1) if d != -1})


def test_fourteen_ranks_match_the_trees_cc_illustration() -> None:
    first, _ = double_binary_tree(14)
    assert first.root == 0 and first[0].children == (8,)
    assert set(first[8].children) == {4, 12}
    assert set(first[12].children) == {10, 13}
    assert set(first[2].children) == {1, 3}
    assert all(first[r].children == () for r in (1, 3, 5, 7, 9, 11, 13))
    assert nccl_btree(14, 13) == (12, NO_RANK, NO_RANK)


def spanning(tree: Tree, n: int) -> bool:
    seen, stack = set(), [tree.root]
    while stack:
        node = stack.pop()
        seen.add(node)
        for child in tree[node].children:
            assert tree[child].parent == node
            stack.append(child)
    return seen == set(range(n))


@pytest.mark.parametrize("nranks", [*range(1, 40), 100, 1440])
def test_trees_span_all_ranks_and_roots_follow_nccl(nranks: int) -> None:
    first, second = double_binary_tree(nranks)
    assert spanning(first, nranks) and spanning(second, nranks)
    assert first.root == 0
    assert second.root == (1 if nranks % 2 and nranks > 1 else nranks - 1)


@pytest.mark.parametrize("nranks", [2, 4, 6, 8, 10, 16, 32, 64, 100])
def test_even_sizes_make_every_rank_interior_in_at_most_one_tree(nranks: int) -> None:
    first, second = double_binary_tree(nranks)
    assert not any(first[r].children and second[r].children for r in range(nranks))


def test_one_zone_is_plain_nccl() -> None:
    assert build_trees(["z"] * 9) == double_binary_tree(9)


@pytest.mark.parametrize("sizes", [(2, 2), (4, 4), (2, 6), (8, 4), (1, 1), (2, 2, 2)])
def test_even_zones_cross_through_one_pair_in_both_trees(sizes: tuple[int, ...]) -> None:
    zones = [f"zone{z}" for z, size in enumerate(sizes) for _ in range(size)]
    first, second = build_trees(zones)
    n = len(zones)
    assert spanning(first, n) and spanning(second, n)
    pairs_first, pairs_second = cross_zone_pairs(first, zones), cross_zone_pairs(second, zones)
    assert len(pairs_first) == len(sizes) - 1
    assert pairs_first == pairs_second


@pytest.mark.parametrize("sizes", [(3, 5), (5, 2), (7, 7)])
def test_odd_zones_cross_once_per_tree(sizes: tuple[int, int]) -> None:
    zones = ["a"] * sizes[0] + ["b"] * sizes[1]
    first, second = build_trees(zones)
    assert spanning(first, len(zones)) and spanning(second, len(zones))
    assert len(cross_zone_pairs(first, zones)) == 1
    assert len(cross_zone_pairs(second, zones)) == 1


def test_interleaved_zone_labels_are_grouped_so_crossings_stay_minimal() -> None:
    zones = ["a", "b", "a", "b", "a", "b", "a", "b"]
    first, second = build_trees(zones)
    assert len(cross_zone_pairs(first, zones)) == 1
    assert cross_zone_pairs(first, zones) == cross_zone_pairs(second, zones)


def test_naive_rank_order_would_cross_zones_more_often() -> None:
    zones = ["a", "b"] * 8
    naive_first, _ = double_binary_tree(len(zones))
    assert len(cross_zone_pairs(naive_first, zones)) > 1
