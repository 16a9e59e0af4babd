"""hfreduce inside torch.distributed, on real processes: one launch per layout (nodes x ranks per node) shows
``group_from_store``, every collective against gloo, and torch DDP against single-process training."""

from __future__ import annotations

from typing import Any

import pytest

from ff_testing.forkserver import ForkServer

from .conftest import TorchLaunch, launch_torch

pytest.importorskip("torch")

# one way of creating the group per layout, so each is covered
LAYOUTS = [(1, 2, "hfreduce"), (2, 1, "cpu:hfreduce"), (2, 2, "new_group")]
# launches of 4 processes importing torch (and DDP importing torch._dynamo) take minutes on a loaded 2-core box
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module", params=LAYOUTS, ids=lambda p: f"{p[0]}x{p[1]}-{p[2]}")
def layout_run(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, torch_forks: ForkServer
) -> dict[str, Any]:
    nodes, local, init = request.param
    results = launch_torch(
        torch_forks, tmp_path_factory.mktemp("torch"), nodes, local, "layout", env={"TEST_INIT": init}
    )
    return {"nodes": nodes, "local": local, "results": results}


def ranks(run: dict[str, Any]) -> list[dict[str, Any]]:
    for res in run["results"]:
        assert "crash" not in res, res.get("traceback", res)
    return list(run["results"])


def test_group_from_store_finds_the_layout(layout_run: dict[str, Any]) -> None:
    nodes, local = layout_run["nodes"], layout_run["local"]
    world = nodes * local
    for rank, res in enumerate(ranks(layout_run)):
        rv = res["rendezvous"]
        assert rv["hf_rank"] == rank
        assert (rv["node_rank"], rv["local_rank"]) == divmod(rank, local)
        assert (rv["num_nodes"], rv["local_world_size"]) == (nodes, local)
        assert rv["sum"] == [world * (world + 1) / 2] * 3
        assert rv["torch_ranks"] == list(range(world))
        assert rv["control_written"] == rv["control"]  # FF_HFREDUCE_CONTROL_FILE: the server's address


def test_every_collective_matches_gloo(layout_run: dict[str, Any]) -> None:
    for res in ranks(layout_run):
        assert res["backend"] in ("hfreduce", "cpu:hfreduce")
        failed = {name: what for name, what in res["collectives"].items() if what != "ok"}
        assert not failed, failed
        assert len(res["collectives"]) > 40


def test_unsupported_ops_raise_naming_the_op(layout_run: dict[str, Any]) -> None:
    world = layout_run["nodes"] * layout_run["local"]
    for res in ranks(layout_run):
        errors = res["errors"]
        assert "recv from any source is not supported" in errors["recv any source"], errors
        assert "BAND" in errors["BAND float"] and "torch.float32" in errors["BAND float"], errors
        bxor = errors["BXOR half in reduce_scatter"]
        assert "reduce_scatter" in bxor and "BXOR" in bxor and "torch.float16" in bxor, errors
        assert "AVG" in errors["AVG int"] and "int64" in errors["AVG int"], errors
        assert errors["after"] == str([float(world)] * 3)  # the group still works


def test_torch_ddp_trains_like_one_process(layout_run: dict[str, Any]) -> None:
    """Unchanged torch DDP on "hfreduce" (small buckets; plain, with a comm hook using get_future, and with
    no_sync accumulation over 2 micro-batches; an unused layer each time) ends where one process training on
    the same global batches ends."""
    for res in ranks(layout_run):
        ddp = res["ddp"]
        for variant in ("default", "comm_hook", "no_sync"):
            assert ddp[variant] <= ddp["tolerance"], ddp
            assert ddp[f"{variant} spare moved"] == 0.0, ddp


def test_ranks_placed_cyclically_over_nodes(torch_launch: TorchLaunch) -> None:
    """Torch ranks 0, 2 on node 0 and 1, 3 on node 1: hfreduce numbers them node by node (0, 2, 1, 3), and the
    backend maps every rooted and rank-ordered collective back to torch's order."""
    results = torch_launch(
        2, 2, "layout", env={"TEST_INIT": "hfreduce", "TEST_PARTS": "rendezvous,collectives"}, interleaved=True
    )
    for rank, res in enumerate(results):
        assert "crash" not in res, res.get("traceback", res)
        assert res["rendezvous"]["torch_ranks"] == [0, 2, 1, 3]
        assert res["rendezvous"]["hf_rank"] == [0, 2, 1, 3].index(rank)
        failed = {name: what for name, what in res["collectives"].items() if what != "ok"}
        assert not failed, failed
