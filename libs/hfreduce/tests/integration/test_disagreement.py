"""Ranks that call different collectives at the same point: every rank raises, naming the collective and what
differs, within the timeout; none returns a result (before, an allreduce of 1,000 elements against one of 2,000
on another node returned the 1,000-element rank a "result", and broadcasts from different sources returned each
rank its own buffer)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import Launch

TIMEOUT_S = 5.0
WORKER = Path(__file__).with_name("disagree_worker.py")
# what each case's message names: the collective the ranks that raise first call, and the field that differs
NAMED = {
    "count": ("allreduce(sum) of 1000 x float32", "count differs"),
    "small_count": ("allreduce(sum) of 10 x float32", "count differs"),
    "dtype": ("x float16", "dtype differs"),
    "reduce_op": ("allreduce(max)", "reduce op differs"),
    "kind": ("broadcast from rank 0", "collective, reduce op, root differ"),
    "root": ("broadcast from rank", "root differs"),
    "allgather": ("allgather of 100 x float32", "count differs"),
    "reduce_scatter": ("reduce_scatter(sum) of 100 x float32", "count differs"),
    "registered": ("x float32 registered", "registered buffer differs"),
}


def assert_every_rank_names_the_mismatch(results: list[dict[str, object]], case: str) -> None:
    call, differs = NAMED[case]
    for res in results:
        assert res["error"] in ("CollectiveMismatchError", "PeerFailureError"), res  # never a result
        message = str(res["message"])
        assert call in message and differs in message, res
        assert "as collective 1" in message, res
        assert res["elapsed_s"] < TIMEOUT_S, res  # seen when the data would move, not after the timeout
        assert res["next"] == "GroupClosedError", res  # the group is broken: its streams may be mid-message
    assert any(res["error"] == "CollectiveMismatchError" for res in results)


@pytest.mark.parametrize("case", sorted(set(NAMED) - {"registered"}))
@pytest.mark.parametrize(("nodes", "local"), [(2, 1), (1, 2)])
def test_two_ranks_that_disagree_both_raise_naming_it(launch: Launch, case: str, nodes: int, local: int) -> None:
    results = launch(nodes, local, case, worker=WORKER, env={"FF_HFREDUCE_TIMEOUT_S": str(TIMEOUT_S)}, timeout_s=60)
    assert_every_rank_names_the_mismatch(results, case)


@pytest.mark.parametrize("case", ["count", "kind", "root", "registered"])
def test_at_2x2_the_ranks_away_from_the_mismatch_are_told_it_too(launch: Launch, case: str) -> None:
    """Only the ring neighbours of the rank that differs see it; the others learn it from the control server."""
    results = launch(2, 2, case, worker=WORKER, env={"FF_HFREDUCE_TIMEOUT_S": str(TIMEOUT_S)}, timeout_s=60)
    assert_every_rank_names_the_mismatch(results, case)


def test_registered_and_plain_buffers_may_meet_across_nodes(launch: Launch) -> None:
    """At 2x1 each node has one rank: a registered buffer on one and a plain one on the other is a valid call."""
    results = launch(2, 1, "registered", worker=WORKER, env={"FF_HFREDUCE_TIMEOUT_S": str(TIMEOUT_S)}, timeout_s=60)
    for res in results:
        assert res["error"] is None, res
        assert res["result"] == [3.0] * 4, res
        assert res["next"] == "returned", res


def test_local_ranks_that_alloc_different_sizes_are_refused_and_can_alloc_again(launch: Launch) -> None:
    """Each local rank maps the others' segments with its own size: before, the larger one's mapping of the
    smaller failed there with a bare mmap error and the other rank lost its link; now both are told the sizes,
    nothing is made, and the group goes on."""
    results = launch(1, 2, "alloc_sizes", worker=WORKER, env={"FF_HFREDUCE_TIMEOUT_S": str(TIMEOUT_S)}, timeout_s=60)
    for res in results:
        assert res["alloc_error"] == "HFReduceError", res
        assert "different sizes: [4000, 8000] bytes" in res["alloc_message"], res
        assert res["result"] == [3.0] * 4, res
