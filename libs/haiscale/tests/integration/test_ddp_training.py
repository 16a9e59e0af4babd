"""haiscale DDP trains like one process on the global batch, at 1x2, 2x1 and 2x2 (nodes x ranks per node)."""

from __future__ import annotations

import pytest

from .conftest import Launch

# fp32: the ranks' average of per-shard gradients and the one-process gradient of the mean of the shards'
# losses differ only in summation order; after 3 SGD steps with momentum the parameters agree to about 1e-7.
TOLERANCE = 1e-5
SCENARIOS = ("plain", "no_sync", "unused", "copy_grads", "after_backward")
IN_PLACE = ("plain", "no_sync", "after_backward")


@pytest.mark.parametrize(("nodes", "local"), [(1, 2), (2, 1), (2, 2)])
def test_ddp_matches_single_process_training(launch: Launch, nodes: int, local: int) -> None:
    results = launch(nodes, local, "train")
    for rank, res in enumerate(results):
        assert "crash" not in res and "missing" not in res, res
        for name in SCENARIOS:
            r = res[name]
            assert r["max_abs_diff"] <= TOLERANCE, (rank, name, r)
            assert r["buckets"] > 2, r  # several buckets, launched in order
            assert r["state_keys_prefixed"] and r["loaded_bare"], r
            assert r["seen"] == [100, 100, 100] and r["scale"] == [101.0], r  # rank 0's buffers everywhere
        assert all(res["plain"]["grads_are_views"]), res["plain"]
        for name in IN_PLACE:  # buckets reduced in place: no copy in or out
            assert res[name]["copied_bytes"] == 0, (name, res[name])
        assert res["unused"]["never_grad_is_none"], res["unused"]  # unused on every rank: grad stays None
    for name in IN_PLACE:  # only sent, received and reduced (small buckets by local rank 0 alone: not every rank)
        assert sum(res[name]["moved_bytes"] for res in results) > 0, name
    for name in SCENARIOS:  # every rank ends with bit-identical parameters
        assert len({res[name]["digest"] for res in results}) == 1, name
