"""haiscale FSDP on real rank processes (forked from the session's fork server): training like one process,
memory per rank, state dicts across world sizes, a rank killed mid-step, bad arguments."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ff_testing import free_port
from ff_testing.forkserver import ForkedProcess, ForkServer

WORKER = Path(__file__).with_name("fsdp_worker.py")
Launch = Callable[..., list[dict[str, Any]]]

# fp32: FSDP's average of the ranks' gradients (pre-divided, summed by the reduce-scatter) and the one-process
# gradient of the global batch's mean loss differ only in summation order; after 4 SGD-momentum steps the
# parameters agree to about 1e-7 (measured 6e-8 .. 1.2e-7).
TOLERANCE = 1e-5
# bf16 compute (gathered parameters, activations) with fp32 masters and fp32 gradient reduction: bf16 keeps 8
# bits of mantissa (relative step 2^-8); after 4 steps the parameters (magnitude ~0.3) are within 5e-4 .. 7e-4.
BF16_TOLERANCE = 3e-3
VARIANTS = ("prefetch", "no_prefetch", "step_in_backward", "mixed_bf16")
STEPS = 4  # fsdp_worker.STEPS


@pytest.fixture
def launch(tmp_path: Path, torch_forks: ForkServer) -> Iterator[Launch]:
    """Start the ranks of an ``fsdp_worker.py`` scenario (two ranks per simulated node)."""
    procs: list[ForkedProcess] = []

    def run(
        world: int,
        scenario: str,
        *,
        backend: str = "hfreduce",
        collectives: str = "hfreduce",
        env: dict[str, str] | None = None,
        timeout_s: float = 120,
    ) -> list[dict[str, Any]]:
        port = free_port()
        outs = []
        for rank in range(world):
            out = tmp_path / f"rank{rank}-{scenario}-{world}.json"
            outs.append(out)
            penv = {
                **os.environ,
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "RANK": str(rank),
                "WORLD_SIZE": str(world),
                "FF_HFREDUCE_NODE_RANK": str(rank // 2),
                "FF_HFREDUCE_TIMEOUT_S": "20",
                "OMP_NUM_THREADS": "1",
                "TEST_BACKEND": backend,
                "TEST_COLLECTIVES": collectives,
                "TEST_DIR": str(tmp_path),
                **(env or {}),
            }
            procs.append(torch_forks.start([sys.executable, str(WORKER), scenario, str(out)], env=penv))
        deadline = time.monotonic() + timeout_s
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        return [json.loads(o.read_text()) if o.exists() else {"missing": str(o)} for o in outs]

    yield run
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


@pytest.mark.parametrize(
    ("backend", "collectives", "world"),
    [("hfreduce", "hfreduce", 2), ("gloo", "hfreduce", 4), ("hfreduce", "torch", 4), ("gloo", "torch", 2)],
)
def test_fsdp_trains_like_one_process_with_1_over_n_of_the_memory(
    launch: Launch, backend: str, collectives: str, world: int
) -> None:
    """Process groups on hfreduce's backend and on gloo; FSDP's collectives through hfreduce's registered
    buffers (the default) and through the process group's own all-gather and reduce-scatter."""
    results = launch(world, "train", backend=backend, collectives=collectives)
    for rank, res in enumerate(results):
        assert "crash" not in res and "missing" not in res, (rank, res)
        for name in VARIANTS:
            r = res[name]
            limit = BF16_TOLERANCE if name == "mixed_bf16" else TOLERANCE
            assert r["max_abs_diff"] <= limit, (rank, name, r["max_abs_diff"])
            assert r["units"] == 4 and r["calls"] == 100, r  # 3 blocks + the root; rank 0's buffer everywhere
            assert r["gathered_after"] == 0, r  # every gathered buffer freed after backward
            # each rank holds its 1/n of the parameters (padded to a multiple of n per unit)
            assert res["total_numel"] / world <= r["shard_numel"] <= res["total_numel"] / world + 4, r
        # gradients are there when backward returns; with step-in-backward they were used and dropped in it
        assert all(res["prefetch"]["grads_after_backward"]), res["prefetch"]
        assert not any(res["step_in_backward"]["grads_after_backward"]), res["step_in_backward"]
        # in a block's forward: the root and that block gathered, plus (prefetch, from step 2) the next block
        block = res["block_bytes"]
        assert res["no_prefetch"]["gathered_in_block"][-1] < 1.2 * block, res["no_prefetch"]
        assert res["prefetch"]["gathered_in_block"][-1] >= 2 * block, res["prefetch"]
        # parameter + gradient + optimizer bytes per rank: 1/n of haiscale DDP's (measured 0.50001 at 2 ranks,
        # 0.25000 at 4: only the padding of each unit to a multiple of n is extra)
        memory = res["memory"]
        assert 1 / world <= memory["ratio"] <= 1.01 / world, memory
        assert memory["fsdp_in_flight"] == 0, memory  # the DDP wrapper then shares FSDP's hfreduce group
    for name in VARIANTS:  # every rank ends with bit-identical parameters
        assert len({res[name]["digest"] for res in results}) == 1, name
        # every rank started the same collectives in the same order on the same registered buffers, also when
        # rank 1 ran late around its reduce-scatters (step_in_backward): hfreduce refuses a collective that
        # two local ranks start on different buffers (this test's CI failure, before the buffer ring)
        issued = results[0][name]["issued"]
        assert all(res[name]["issued"] == issued for res in results), name
        if collectives == "hfreduce":
            # a step: 4 gathers in forward, 3 in backward (the root stays gathered), 4 reduce-scatters; from the
            # second step on, the last block stays gathered from its forward to its backward (2 in backward)
            assert len(issued) == 11 + (STEPS - 1) * 10, (name, issued)
            assert all(slot is not None for _, _, slot in issued), (name, issued)


def test_state_saved_at_4_ranks_loads_at_2_and_training_continues(launch: Launch) -> None:
    saved = launch(4, "save")
    for res in saved:
        assert "crash" not in res and res["max_abs_diff"] <= TOLERANCE, res
    loaded = launch(2, "load")
    for res in loaded:
        assert "crash" not in res and "missing" not in res, res
        assert res["saved_world_size"] == 4, res
        for how in ("full", "sharded"):  # the model and the optimizer's momentum, from the checkpoint
            assert res[how]["max_abs_diff"] <= TOLERANCE, (how, res[how])
            assert res[how]["calls"] == 100, (how, res[how])
    assert len({res[how]["digest"] for res in loaded for how in ("full", "sharded")}) == 1


def test_rank_killed_mid_backward_is_named_by_every_other_rank(launch: Launch) -> None:
    victim, timeout_s = 2, 5.0
    results = launch(4, "kill", env={"TEST_VICTIM": str(victim), "FF_HFREDUCE_TIMEOUT_S": str(timeout_s)})
    assert "missing" in results[victim]  # it died before reporting
    for rank, res in enumerate(results):
        if rank == victim:
            continue
        assert res["error"] == "RuntimeError" and res["step"] == 1, res
        assert f"rank {victim} (node 1, local rank 0) died" in res["message"], res
        assert res["message"].startswith("haiscale FSDP: "), res
        assert res["elapsed_s"] <= timeout_s, res  # a death is seen at once, not after the timeout
        assert "unusable after a failed collective" in res["refused_after"], res


def test_bad_arguments_are_refused_with_the_reason(launch: Launch) -> None:
    expected = {
        "not_module": ("TypeError", "wraps a torch.nn.Module, got str"),
        "policy": ("TypeError", "auto_wrap_policy must be callable"),
        "class_policy": ("TypeError", "torch.nn.Module subclasses"),
        "size_policy": ("ValueError", "min_num_params must be at least 1"),
        "precision": ("TypeError", "mixed_precision must be a haiscale.fsdp.MixedPrecision"),
        "precision_dtype": ("ValueError", "param_dtype must be float32, float16 or bfloat16"),
        "step": ("TypeError", "step_in_backward must be callable"),
        "group": ("TypeError", "process_group must be a torch.distributed ProcessGroup"),
        "collectives": ("ValueError", "collectives must be 'hfreduce' or 'torch', got 'nccl'"),
        "frozen": ("RuntimeError", "no parameter that requires a gradient"),
        "float64": ("TypeError", "'weight' is torch.float64"),
        "tied": ("ValueError", "'b.up.weight' is the same tensor as 'a.up.weight' but in another unit"),
        "twice": ("ValueError", "already contains a FullyShardedDataParallel"),
        "different": ("RuntimeError", "rank 1's parameters differ from rank 0's in unit 0: '1.weight' [3, 8]"),
        "bad_shape": ("ValueError", "'head.weight' is [4, 4] in the state dict, [3, 24] in the model"),
        "missing_key": ("KeyError", "the state dict lacks 'inp.bias'"),
    }
    for res in launch(2, "bad_arguments"):
        assert "crash" not in res, res
        for case, (kind, text) in expected.items():
            assert res[case] is not None, case
            assert res[case][0] == kind and text in res[case][1], (case, res[case])
        assert res["unchanged"] is True  # refused loads changed nothing
