"""A script written for torch DDP (``init_process_group("gloo")``, then wrap) runs unchanged on haiscale DDP."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from ff_testing import free_port
from ff_testing.forkserver import ForkServer

SCRIPT = Path(__file__).with_name("torch_ddp_script.py")


def test_torch_ddp_script_runs_unchanged_and_trains_like_one_process(tmp_path: Path, torch_forks: ForkServer) -> None:
    """Started as torchrun starts its ranks (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, ...)."""
    out = tmp_path / "model.pt"
    port, world = free_port(), 2
    procs = []
    for rank in range(world):
        with (tmp_path / f"rank{rank}.log").open("wb") as log:
            env = {**os.environ, "OMP_NUM_THREADS": "1", **_torchrun_env(rank, world, port)}
            procs.append(torch_forks.start([sys.executable, str(SCRIPT), str(out)], env=env, stderr=log))
    for rank, p in enumerate(procs):
        assert p.wait(timeout=90) == 0, (tmp_path / f"rank{rank}.log").read_text(errors="replace")[-3000:]
    trained = torch.load(out)
    assert set(trained) == {"0.weight", "0.bias", "2.weight", "2.bias"}  # model.module.state_dict(): no prefix
    reference = _train_one_process(world)
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(trained[name], value, rtol=1e-5, atol=1e-6)  # fp32, summation order only


def _train_one_process(world: int) -> torch.nn.Module:
    """The script's training on its global batch: every rank's batch of a step, concatenated (no shuffle)."""
    script = _load_script()
    net = script.model()
    data = script.dataset()
    for _ in range(script.EPOCHS):
        for x, y in DataLoader(data, batch_size=script.BATCH * world):
            net.zero_grad()
            torch.nn.functional.mse_loss(net(x), y).backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), max_norm=1.0)
            with torch.no_grad():  # torch.optim.SGD(lr=0.05)'s step, without importing torch.optim here
                for p in net.parameters():
                    p.add_(p.grad, alpha=-script.LR)
    return net


def _load_script():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("torch_ddp_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _torchrun_env(rank: int, world: int, port: int) -> dict[str, str]:
    return {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world),
        "GROUP_RANK": "0",
    }
