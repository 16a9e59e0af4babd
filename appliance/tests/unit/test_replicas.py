"""Which replicas ``join --storage`` takes onto a new node and where ``leave`` moves a node's replicas (pure)."""

from __future__ import annotations

from collections import Counter

import pytest

from ff_appliance.replicas import Move, ReplicaError, moves_off, moves_off_all, moves_onto, new_target_id

# 2 chains of 3 over nodes 2, 3, 4 (as `up` makes them), and 4 chains of 3 over 4 nodes.
TWO_CHAINS = {1: [2, 3, 4], 2: [3, 4, 2]}
FOUR_NODES = {1: [1, 2, 3], 2: [2, 3, 4], 3: [3, 4, 1], 4: [4, 1, 2]}


def _after(chains: dict[int, list[int]], moves: list[Move]) -> dict[int, list[int]]:
    out = {c: list(nodes) for c, nodes in chains.items()}
    for m in moves:
        out[m.chain_id].remove(m.from_node)
        if m.to_node:
            out[m.chain_id].append(m.to_node)
    return out


def test_a_new_node_takes_its_fair_share_from_the_most_loaded_nodes() -> None:
    moves = moves_onto(TWO_CHAINS, 9, [2, 3, 4])
    assert moves == [Move(chain_id=1, from_node=2, to_node=9)]  # 6 replicas over 4 nodes: 1 each at least
    spread = Counter(n for nodes in _after(FOUR_NODES, moves_onto(FOUR_NODES, 5, [1, 2, 3, 4])).values() for n in nodes)
    assert spread[5] == 2 and max(spread.values()) - min(spread.values()) <= 1


def test_a_new_node_never_gets_two_replicas_of_one_chain() -> None:
    chains = {1: [1, 2], 2: [1, 2]}
    moves = moves_onto(chains, 3, [1, 2])
    assert len({m.chain_id for m in moves}) == len(moves)
    assert moves_onto({1: [1, 2, 3]}, 3, [1, 2, 3]) == []  # it already holds its share


def test_a_leaving_node_s_replicas_go_to_nodes_not_in_the_chain_least_loaded_first() -> None:
    chains = {1: [2, 3, 9], 2: [3, 4, 2]}
    assert moves_off(chains, 9, [2, 3, 4, 9]) == [Move(chain_id=1, from_node=9, to_node=4)]
    after = _after(FOUR_NODES, moves_off(FOUR_NODES, 4, [1, 2, 3, 4]))
    assert all(4 not in nodes and len(set(nodes)) == 3 for nodes in after.values() if len(nodes) == 3)


def test_a_replica_with_no_other_node_to_go_to_is_dropped_and_a_last_copy_refused() -> None:
    assert moves_off({1: [1, 2, 3]}, 3, [1, 2, 3]) == [Move(chain_id=1, from_node=3, to_node=0)]
    with pytest.raises(ReplicaError, match="only replica"):
        moves_off({1: [3]}, 3, [1, 3])


def test_replicas_go_only_to_nodes_that_take_them_not_to_a_dead_or_leaving_one() -> None:
    # Node 5 is dead (holds a replica, not in storage_nodes); 9 and 8 leave together.
    chains = {1: [5, 9, 2], 2: [8, 9, 3], 3: [2, 3, 4]}
    assert moves_off(chains, 9, [2, 3, 4]) == [
        Move(chain_id=1, from_node=9, to_node=4),
        Move(chain_id=2, from_node=9, to_node=2),
    ]
    moves = moves_off_all(chains, [9, 8], [2, 3, 4, 8, 9])
    assert all(m.to_node in (2, 3, 4) for m in moves) and {m.from_node for m in moves} == {8, 9}
    assert all(not {8, 9} & set(nodes) for nodes in _after(chains, moves).values())


def test_leaving_together_is_refused_up_front_when_a_chain_would_lose_its_last_replica() -> None:
    with pytest.raises(ReplicaError, match="only replica"):
        moves_off_all({1: [8, 9], 2: [8, 2]}, [8, 9], [8, 9])  # no storage node stays: chain 1 would have none


def test_a_new_target_id_is_in_its_node_s_own_range() -> None:
    assert new_target_id(13, set()) == 130001
    assert new_target_id(4, {40001, 40002, 20003}) == 40003
    with pytest.raises(ReplicaError, match="no free target id"):
        new_target_id(2, {20001 + i for i in range(100)})
