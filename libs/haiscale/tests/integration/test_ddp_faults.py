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


def test_wrapping_again_after_the_default_group_is_made_again(launch: Launch) -> None:
    """Before, the hfreduce group's store keys were numbered per torch group object: the group made again
    after destroy_process_group started again at 0 on the same store, read the first group's keys (its closed
    control server), and the second wrap failed to join."""
    results = launch(1, 2, "recreate", env={"FF_HFREDUCE_TIMEOUT_S": "10"})
    for res in results:
        assert res.get("error", "crashed") is None, res
        assert len(res["grads"]) == 3 and res["grads"][0] != 0.0, res
        assert res["grads"] == [res["grads"][0]] * 3, res  # the same reduced gradient each time
    assert results[0]["grads"] == results[1]["grads"]
