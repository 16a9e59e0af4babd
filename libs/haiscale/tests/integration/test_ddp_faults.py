"""haiscale DDP when something is wrong: a rank dies mid-backward, ranks disagree about the model."""

from __future__ import annotations

from .conftest import Launch

TIMEOUT_S = 3.0


def test_rank_killed_mid_backward_is_named_by_every_other_rank(launch: Launch) -> None:
    victim = 2  # the other node's first rank, killed by a hook while its backward is half done
    results = launch(2, 2, "kill", env={"FF_HFREDUCE_TIMEOUT_S": str(TIMEOUT_S), "TEST_VICTIM": str(victim)})
    assert "missing" in results[victim]  # it died before reporting
    for rank, res in enumerate(results):
        if rank == victim:
            continue
        assert res["error"] == "PeerFailureError", res
        assert res["step"] == 1 and res["culprit"] == victim, res
        assert f"rank {victim} " in res["message"], res
        # backward() raised instead of hanging: within the timeout (plus the time to ask rank 0 who failed)
        assert res["elapsed_s"] <= TIMEOUT_S + 5.0, res


def test_different_parameters_across_ranks_are_refused_at_construction(launch: Launch) -> None:
    results = launch(1, 2, "mismatch")
    for res in results:  # both ranks refuse, with the same message, before any hfreduce group exists
        assert res["error"] == "RuntimeError", res
        assert "rank 1" in res["message"] and "'1.weight' [3, 8]" in res["message"], res
        assert "'1.weight' [2, 8]" in res["message"], res
