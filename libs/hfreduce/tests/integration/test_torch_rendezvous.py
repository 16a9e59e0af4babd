"""``group_from_store``: an hfreduce group formed through a torch store, on real processes."""

from __future__ import annotations

import pytest

from .conftest import TorchLaunch

pytest.importorskip("torch")


@pytest.mark.parametrize(("nodes", "local"), [(1, 2), (2, 1), (2, 2)])
def test_group_from_a_gloo_groups_store(torch_launch: TorchLaunch, nodes: int, local: int) -> None:
    world = nodes * local
    results = torch_launch(nodes, local, "rendezvous")
    for rank, res in enumerate(results):
        assert "crash" not in res, res
        assert res["hf_rank"] == rank
        assert (res["node_rank"], res["local_rank"]) == divmod(rank, local)
        assert (res["num_nodes"], res["local_world_size"]) == (nodes, local)
        assert res["sum"] == [world * (world + 1) / 2] * 3
        assert res["max"] == [world - 1.0] * 3
        assert res["torch_ranks"] == list(range(world))


def test_a_rank_that_never_arrives_is_named(torch_launch: TorchLaunch) -> None:
    results = torch_launch(1, 3, "rendezvous_missing")
    for res in results[:2]:
        assert res["error"] == "RendezvousError", res
        assert res["missing"] == [2]
        assert "ranks [2]" in res["message"]
        assert res["elapsed_s"] < 10
