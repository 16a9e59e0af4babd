"""Failures under torch.distributed on backend "hfreduce", on real processes."""

from __future__ import annotations

import pytest

from .conftest import TorchLaunch

pytest.importorskip("torch")

# a death is seen at once, not after the timeout; the timeout must still cover the ranks drifting apart while
# they import torch and build DDP on a loaded machine
TIMEOUT_S = 10.0
pytestmark = pytest.mark.timeout(300)  # 4 processes importing torch: minutes on a loaded 2-core box


def test_a_rank_killed_mid_backward_is_named_by_every_other_rank(torch_launch: TorchLaunch) -> None:
    """torch DDP, 2 nodes x 2 ranks; rank 3 SIGKILLs itself in step 2's backward while buckets are in flight.

    Each survivor's backward raises (no hang, no crash: a failed future must reach DDP's C++ reducer as an
    error, not as a value) naming rank 3 as dead, in well under the timeout (a hang would be seen only after it,
    and named as not entering the collective)."""
    results = torch_launch(2, 2, "kill", env={"TEST_VICTIM": "3", "FF_HFREDUCE_TIMEOUT_S": str(TIMEOUT_S)})
    assert "crash" in results[3]  # the victim wrote no report
    for res in results[:3]:
        assert res["error"] == "RuntimeError", res
        assert "rank 3 (node 1, local rank 1) died" in res["message"], res
        assert res["step"] == 2
        assert res["elapsed_s"] <= TIMEOUT_S / 2, res


def test_waiting_on_a_dead_peer_raises_naming_it(torch_launch: TorchLaunch) -> None:
    """``dist.recv`` and ``dist.all_reduce`` (``Work.wait()``) raise when their peer died: the transfer's error
    names it; the collective finds the group broken by the death."""
    results = torch_launch(2, 1, "peer_gone", env={"FF_HFREDUCE_TIMEOUT_S": str(TIMEOUT_S)})
    res = results[0]
    assert res["first"] == [1.0, 1.0]
    assert "rank 1 (node 1, local rank 0) died" in res["recv"], res
    assert res["all_reduce"] != "returned" and "rank 1" in res["all_reduce"], res
    assert res["recv elapsed_s"] < TIMEOUT_S / 2, res


def test_a_rank_that_never_publishes_is_named(torch_launch: TorchLaunch) -> None:
    """group_from_store with WORLD_SIZE 3 and only ranks 0 and 1 started: rank 0 (the store's host) names 2."""
    results = torch_launch(1, 2, "rendezvous_missing", env={"WORLD_SIZE": "3"})
    assert results[0]["error"] == "RendezvousError", results[0]
    assert results[0]["missing"] == [2]
    assert "ranks [2] did not publish" in results[0]["message"]
    assert results[0]["elapsed_s"] < 10
    assert results[1]["error"] == "RendezvousError", results[1]  # rank 1 may lose the store with rank 0
