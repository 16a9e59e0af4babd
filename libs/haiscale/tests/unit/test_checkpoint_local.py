"""haiscale.checkpoint on a local folder: round trips, the host snapshot of async saves, mismatches and bad
bytes that change nothing, keep-K, one save in flight, and sharded state saved on 4 ranks loaded on 2 and 1."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from haiscale import checkpoint as ckpt


def _state() -> dict[str, Any]:
    g = torch.Generator().manual_seed(3)
    return {
        "model": {"w": torch.randn(4, 8, generator=g), "b": torch.randn(8, generator=g).to(torch.bfloat16)},
        "optim": {"state": {0: {"step": torch.tensor(7.0), "mask": torch.tensor([True, False])}}, "lr": 0.1},
        "empty": torch.zeros(0, 3),
        "step": 12,
        "py_rng": random.Random(5).getstate(),
        "torch_rng": g.get_state(),
    }


def _zeros_like(state: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in state.items():
        out[k] = _zeros_like(v) if isinstance(v, dict) else torch.zeros_like(v) if isinstance(v, torch.Tensor) else None
    return out


def _assert_same(a: Any, b: Any) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    else:
        assert a == b


def test_round_trip_keeps_tensors_values_and_step(tmp_path: Path) -> None:
    state = _state()
    url = ckpt.save(tmp_path, state, step=12, blocking=True).wait()
    assert url == str(tmp_path / "step-000000012" / ckpt.MANIFEST)
    target = _zeros_like(state)
    loaded = ckpt.load(tmp_path, target)
    assert (loaded.step, loaded.world_size) == (12, 1)
    _assert_same(state, target)
    manifest = json.loads((tmp_path / "step-000000012" / ckpt.MANIFEST).read_text())
    entry = next(t for t in manifest["tensors"] if t["name"] == "model.w")
    assert (entry["dtype"], entry["shape"], entry["offset"], entry["length"]) == ("float32", [4, 8], 0, 128)


def test_async_save_writes_the_snapshot_taken_before_it_returned(tmp_path: Path) -> None:
    w = torch.arange(1 << 16, dtype=torch.float32)
    state = {"w": w, "n": {"v": torch.ones(3)}}
    handle = ckpt.save(tmp_path, state, step=1)
    w.mul_(-1)  # the training step goes on while the write runs
    state["n"]["v"].zero_()
    handle.wait()
    target = {"w": torch.empty_like(w), "n": {"v": torch.empty(3)}}
    ckpt.load(tmp_path, target)
    assert torch.equal(target["w"], torch.arange(1 << 16, dtype=torch.float32))
    assert torch.equal(target["n"]["v"], torch.ones(3))


def test_a_second_save_waits_for_the_first(tmp_path: Path) -> None:
    first = ckpt.save(tmp_path, {"w": torch.randn(1 << 18)}, step=1)
    second = ckpt.save(tmp_path, {"w": torch.randn(1 << 18)}, step=2)
    assert first.done()  # at most one save in flight: save() finished the first before snapshotting
    second.wait()
    assert ckpt.latest_step(tmp_path) == 2


def test_mismatch_names_the_first_tensor_and_changes_nothing(tmp_path: Path) -> None:
    ckpt.save(tmp_path, {"a": torch.ones(2), "b": torch.ones(4, 8), "c": torch.ones(3), "s": 1}, step=1).wait()
    target = {"a": torch.full((2,), 9.0), "b": torch.full((8, 4), 9.0), "c": torch.full((3,), 9.0), "s": 0}
    with pytest.raises(
        ckpt.CheckpointMismatch, match=r"^b: the checkpoint has float32 \[4, 8\], the state dict float32 \[8, 4\]"
    ):
        ckpt.load(tmp_path, target)
    assert all(bool((target[k] == 9.0).all()) for k in "abc") and target["s"] == 0
    with pytest.raises(ckpt.CheckpointMismatch, match=r"^a: the checkpoint has float32 \[2\], the state dict float64"):
        ckpt.load(tmp_path, {"a": torch.zeros(2, dtype=torch.float64)})
    with pytest.raises(ckpt.CheckpointMismatch, match=r"^d: the checkpoint has no such tensor"):
        ckpt.load(tmp_path, {"a": torch.zeros(2), "d": torch.zeros(1)})
    with pytest.raises(ckpt.CheckpointMismatch, match=r"^b: the checkpoint has float32 \[4, 8\], the state dict no"):
        ckpt.load(tmp_path, {"a": torch.zeros(2)})


def test_bytes_that_fail_their_checksum_change_nothing(tmp_path: Path) -> None:
    ckpt.save(tmp_path, {"a": torch.ones(4), "b": torch.ones(4)}, step=1, blocking=True)
    data = next((tmp_path / "step-000000001").glob("rank-00000.*.bin"))
    manifest = json.loads((tmp_path / "step-000000001" / ckpt.MANIFEST).read_text())
    b = next(t for t in manifest["tensors"] if t["name"] == "b")
    raw = bytearray(data.read_bytes())
    raw[b["file_offset"] + 5] ^= 0xFF  # inside b
    data.write_bytes(bytes(raw))
    target = {"a": torch.zeros(4), "b": torch.zeros(4)}
    with pytest.raises(ckpt.CorruptCheckpoint, match=r"\(b\)"):
        ckpt.load(tmp_path, target)
    assert not target["a"].any() and not target["b"].any()


def test_keep_k_removes_the_oldest_after_the_new_commit(tmp_path: Path) -> None:
    for step in range(1, 6):
        handle = ckpt.save(tmp_path, {"w": torch.full((4,), float(step))}, step=step, keep=2)
        handle.wait()
    assert handle.removed_steps == [3]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000000004", "step-000000005"]
    target = {"w": torch.zeros(4)}
    assert ckpt.load(tmp_path, target, step=4).step == 4 and target["w"][0] == 4.0
    with pytest.raises(FileExistsError, match="checkpoint 5 is already committed"):
        ckpt.save(tmp_path, {"w": torch.zeros(4)}, step=5)
    with pytest.raises(FileNotFoundError, match="no checkpoint 3"):
        ckpt.load(tmp_path, target, step=3)


# ---- sharded state: a ZeRO-style optimizer whose moments are split flat across ranks ----


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Dropout(0.1), torch.nn.Linear(16, 1))


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, gen: torch.Generator, steps: int) -> list[float]:
    losses = []
    for _ in range(steps):
        x = torch.randn(8, 6, generator=gen)
        loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _bounds(numel: int, rank: int, world: int) -> tuple[int, int]:
    per = -(-numel // world)
    return min(numel, rank * per), min(numel, (rank + 1) * per)


def _rank_state(
    model: torch.nn.Module, opt: torch.optim.Optimizer, gen: torch.Generator, rank: int, world: int
) -> dict[str, Any]:
    """What one rank of ``world`` holds: the replicated model and RNG, its flat slice of every moment."""
    moments: dict[str, Any] = {}
    for i, p in enumerate(model.parameters()):
        for key in ("exp_avg", "exp_avg_sq"):
            full = opt.state[p][key].reshape(-1)
            lo, hi = _bounds(full.numel(), rank, world)
            moments[f"{i}.{key}"] = ckpt.Shard(full[lo:hi].clone(), tuple(p.shape), lo)
    steps = {str(i): opt.state[p]["step"] for i, p in enumerate(model.parameters())}
    return {
        "model": model.state_dict(),
        "moments": moments,
        "steps": steps,
        "rng": gen.get_state(),
        "torch_rng": torch.get_rng_state(),
    }


def test_saved_on_4_ranks_loads_on_2_and_1_and_training_continues(tmp_path: Path) -> None:
    model, gen = _model(), torch.Generator().manual_seed(1)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    before = _train(model, opt, gen, 5)
    torch.manual_seed(11)  # dropout's stream at the checkpoint
    # four ranks in one process, each saving its own slices under one save id; rank 0 last, as its commit
    # waits for the others' parts and a process has one save in flight
    for rank in (3, 2, 1, 0):
        ckpt.save(tmp_path, _rank_state(model, opt, gen, rank, 4), step=5, rank=rank, world_size=4, save_id="s5")
    ckpt.wait_for_saves()
    reference = _train(model, opt, gen, 5)  # the run that was never interrupted

    for world in (2, 1):
        model2, gen2 = _model(), torch.Generator()
        opt2 = torch.optim.Adam(model2.parameters(), lr=0.01)
        _train(model2, opt2, torch.Generator().manual_seed(99), 1)  # moments exist, with other values
        states = [_rank_state(model2, opt2, gen2, r, world) for r in range(world)]
        for state in states:
            assert ckpt.load(tmp_path, state).world_size == 4
        model2.load_state_dict(states[0]["model"])
        gen2.set_state(states[0]["rng"])
        torch.set_rng_state(states[0]["torch_rng"])
        for i, p in enumerate(model2.parameters()):
            opt2.state[p]["step"] = states[0]["steps"][str(i)]
            for key in ("exp_avg", "exp_avg_sq"):
                flat = torch.cat([s["moments"][f"{i}.{key}"].local for s in states])
                opt2.state[p][key] = flat.view(p.shape)
        resumed = _train(model2, opt2, gen2, 5)
        assert resumed == reference, (world, resumed, reference)  # same arithmetic: bit for bit
    assert len(before) == 5
