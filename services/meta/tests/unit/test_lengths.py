"""A file's exact length from its chains' last chunks (what Close and session collection ask storage), and of whom."""

from __future__ import annotations

import asyncio

from ff_meta.core.lengths import file_end, nodes_to_ask, on_every_chain

MIB = 1 << 20


def test_the_end_is_the_furthest_last_chunk_over_the_chains() -> None:
    assert file_end([(4, 100), (7, 5), None], 4 * MIB) == 7 * 4 * MIB + 5
    assert file_end([(0, 4096)], 4 * MIB) == 4096
    assert file_end([None, None], 4 * MIB) is None
    assert file_end([], 4 * MIB) is None


def test_every_chain_is_called_at_once_and_each_once() -> None:
    """Each call waits until every chain has been called: called one after another, the first never returns
    (the guard below turns that hang into a failure). A chain listed twice in the stripe is called once."""
    chains = [21, 22, 23, 24, 21]
    called: list[int] = []
    all_called = asyncio.Event()

    async def call(chain_id: int) -> int:
        called.append(chain_id)
        if len(called) == len(set(chains)):
            all_called.set()
        await all_called.wait()
        return chain_id - 20

    async def run() -> list[int]:
        return await asyncio.wait_for(on_every_chain(chains, call), timeout=10)

    assert asyncio.run(run()) == [1, 2, 3, 4]
    assert sorted(called) == [21, 22, 23, 24]


def test_a_stripe_whose_chains_share_a_node_is_asked_of_that_node_once() -> None:
    """Chains of three replicas over three nodes (the test cluster's two chains): one node serves them all."""
    assert nodes_to_ask({1: [101, 102, 103], 2: [102, 103, 101]}) == {102: [1, 2]}  # 102: nearest the heads, tie: id
    assert nodes_to_ask({1: [101, 102, 103], 2: [101, 103, 102]}) == {101: [1, 2]}  # the head of both


def test_few_nodes_cover_every_chain_each_chain_asked_once() -> None:
    serving = {
        1: [1, 2, 3],
        2: [2, 3, 4],
        3: [3, 4, 5],
        4: [4, 5, 6],
        5: [5, 6, 1],
        6: [6, 1, 2],
    }
    plan = nodes_to_ask(serving)
    asked = [c for chains in plan.values() for c in chains]
    assert sorted(asked) == [1, 2, 3, 4, 5, 6]  # each chain once
    assert all(node in serving[c] for node, chains in plan.items() for c in chains)  # at a node that serves it
    assert plan == {1: [1, 5, 6], 4: [2, 3, 4]}  # two nodes ask all six: not one call per chain
    assert nodes_to_ask({7: [11], 8: [12], 9: [11]}) == {11: [7, 9], 12: [8]}


def test_a_chain_no_node_serves_is_left_for_the_caller() -> None:
    assert nodes_to_ask({1: [], 2: [5]}) == {5: [2]}
    assert nodes_to_ask({}) == {}
