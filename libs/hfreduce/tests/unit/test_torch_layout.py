"""How ranks published in a torch store become hfreduce nodes (``hfreduce.distributed.plan_layout``)."""

from __future__ import annotations

from hfreduce.distributed.rendezvous import node_key, plan_layout


def recs(*nodes: str) -> list[dict[str, str]]:
    return [{"node": n, "host": "h"} for n in nodes]


def test_consecutive_ranks_per_node_keep_their_numbers() -> None:
    layout = plan_layout(recs("a", "a", "b", "b"))
    assert (layout.num_nodes, layout.local_world_size) == (2, 2)
    assert layout.torch_ranks == (0, 1, 2, 3)
    assert layout.is_identity


def test_interleaved_ranks_are_regrouped_by_node_and_mapped_back() -> None:
    layout = plan_layout(recs("a", "b", "a", "b"))
    assert (layout.num_nodes, layout.local_world_size) == (2, 2)
    assert layout.torch_ranks == (0, 2, 1, 3)
    assert layout.hf_rank(1) == 2
    assert not layout.is_identity


def test_nodes_of_different_sizes_make_one_node_per_rank() -> None:
    layout = plan_layout(recs("a", "a", "b"))
    assert (layout.num_nodes, layout.local_world_size) == (3, 1)
    assert layout.torch_ranks == (0, 1, 2)


def test_node_key_prefers_the_test_override_then_torchrun_then_the_host() -> None:
    assert node_key({"FF_HFREDUCE_NODE_RANK": "1", "GROUP_RANK": "5"}, "h") == "node 1"
    assert node_key({"GROUP_RANK": "5"}, "h") == "group 5"
    assert node_key({}, "h") == "host h"
