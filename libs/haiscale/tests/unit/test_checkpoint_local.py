"""haiscale.checkpoint on a local folder: round trips, the host snapshot of async saves, mismatches and bad
bytes that change nothing (not in place) or are named (in place), loads into the caller's own tensors, format 1
manifests, keep-K, one save in flight, and sharded state saved on 4 ranks loaded on 2 and 1."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import numpy
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
    files = sorted(p.name for p in (tmp_path / "step-000000012").iterdir())  # one rank: no part, committed from memory
    assert len(files) == 2 and files[0] == ckpt.MANIFEST and files[1].startswith("rank-00000.")
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


def test_keep_buffer_reuses_the_host_buffer_for_the_next_snapshot(tmp_path: Path) -> None:
    from haiscale.checkpoint import api

    first = {"w": torch.arange(1 << 16, dtype=torch.float32), "step": 1}
    ckpt.save(tmp_path, first, step=1, keep_buffer=True).wait()
    kept = api._InFlight.spare
    assert kept is not None and kept.numel() >= (1 << 18)
    second = {"w": torch.arange(1 << 16, dtype=torch.float32) * -1, "step": 2}
    handle = ckpt.save(tmp_path, second, step=2, keep_buffer=True)
    second["w"].zero_()  # the snapshot was taken (into the kept buffer) before save returned
    handle.wait()
    assert api._InFlight.spare is not None and api._InFlight.spare.data_ptr() == kept.data_ptr()
    for step, want in (
        (1, torch.arange(1 << 16, dtype=torch.float32)),
        (2, -torch.arange(1 << 16, dtype=torch.float32)),
    ):
        target = {"w": torch.empty(1 << 16), "step": 0}
        ckpt.load(tmp_path, target, step=step)
        assert torch.equal(target["w"], want) and target["step"] == step
    bigger = {"w": torch.ones(1 << 17), "step": 3}  # does not fit: a new buffer; not kept
    ckpt.save(tmp_path, bigger, step=3).wait()
    assert api._InFlight.spare is None
    target = {"w": torch.empty(1 << 17), "step": 0}
    ckpt.load(tmp_path, target)
    assert bool((target["w"] == 1).all()) and target["step"] == 3


def test_a_second_save_waits_for_the_first(tmp_path: Path) -> None:
    first = ckpt.save(tmp_path, {"w": torch.randn(1 << 18)}, step=1)
    second = ckpt.save(tmp_path, {"w": torch.randn(1 << 18)}, step=2)
    assert first.done()  # at most one save in flight: save() finished the first before snapshotting
    second.wait()
    assert ckpt.latest_step(tmp_path) == 2


LAST_SAVE_FAILS = """
import sys, torch
from haiscale import checkpoint as ckpt
ckpt.save(sys.argv[1], {"w": torch.ones(4)}, step=7)  # in the background; the script ends without waiting
"""


def test_the_failure_of_a_processs_last_save_is_logged_when_nothing_waits_for_it(tmp_path: Path) -> None:
    """A trainer's final save in the background, the process then ending: its error was kept for a wait() or a next
    save that never came, and the job ended as if the checkpoint were there."""
    (tmp_path / "file").write_bytes(b"")
    root = tmp_path / "file" / "ckpt"  # under a regular file: the background write fails
    run = subprocess.run(
        [sys.executable, "-c", LAST_SAVE_FAILS, str(root)], capture_output=True, text=True, timeout=120, check=False
    )
    assert "the save of step 7 failed, nothing of it counts: NotADirectoryError" in run.stderr, run.stderr[-2000:]


@pytest.mark.parametrize("in_place", [True, False])
def test_mismatch_names_the_first_tensor_and_changes_nothing(tmp_path: Path, in_place: bool) -> None:
    ckpt.save(tmp_path, {"a": torch.ones(2), "b": torch.ones(4, 8), "c": torch.ones(3), "s": 1}, step=1).wait()
    target = {"a": torch.full((2,), 9.0), "b": torch.full((8, 4), 9.0), "c": torch.full((3,), 9.0), "s": 0}
    with pytest.raises(
        ckpt.CheckpointMismatch, match=r"^b: the checkpoint has float32 \[4, 8\], the state dict float32 \[8, 4\]"
    ):
        ckpt.load(tmp_path, target, in_place=in_place)
    assert all(bool((target[k] == 9.0).all()) for k in "abc") and target["s"] == 0
    with pytest.raises(ckpt.CheckpointMismatch, match=r"^a: the checkpoint has float32 \[2\], the state dict float64"):
        ckpt.load(tmp_path, {"a": torch.zeros(2, dtype=torch.float64)}, in_place=in_place)
    with pytest.raises(ckpt.CheckpointMismatch, match=r"^d: the checkpoint has no such tensor"):
        ckpt.load(tmp_path, {"a": torch.zeros(2), "d": torch.zeros(1)}, in_place=in_place)
    with pytest.raises(ckpt.CheckpointMismatch, match=r"^b: the checkpoint has float32 \[4, 8\], the state dict no"):
        ckpt.load(tmp_path, {"a": torch.zeros(2)}, in_place=in_place)
    shard = ckpt.Shard(torch.full((2,), 9.0), (4,), 2)  # a slice of a tensor saved whole: asks a shape that differs
    with pytest.raises(
        ckpt.CheckpointMismatch, match=r"^c: the checkpoint has float32 \[3\], the state dict float32 \[4\]"
    ):
        ckpt.load(tmp_path, {"a": torch.full((2,), 9.0), "b": torch.full((4, 8), 9.0), "c": shard}, in_place=in_place)
    assert bool((shard.local == 9.0).all())
    full = {"a": torch.full((2,), 9.0), "b": torch.full((4, 8), 9.0), "c": torch.full((3,), 9.0)}
    with pytest.raises(ckpt.CheckpointMismatch, match=r"^s: the checkpoint has no such tensor \(a value\)"):
        ckpt.load(tmp_path, {**full, "s": torch.zeros(1)}, in_place=in_place)
    with pytest.raises(ckpt.CheckpointMismatch, match=r"^x: the checkpoint has no such value, the state dict a value"):
        ckpt.load(tmp_path, {**full, "s": 0, "x": "?"}, in_place=in_place)
    assert all(bool((t == 9.0).all()) for t in full.values())


def _corrupt(folder: Path, name: str) -> None:
    data = next(folder.glob("rank-00000.*.bin"))
    manifest = json.loads((folder / ckpt.MANIFEST).read_text())
    entry = next(t for t in manifest["tensors"] if t["name"] == name)
    raw = bytearray(data.read_bytes())
    raw[entry["file_offset"] + 5] ^= 0xFF  # inside the tensor
    data.write_bytes(bytes(raw))


def test_bytes_that_fail_their_checksum_change_nothing_when_not_in_place(tmp_path: Path) -> None:
    ckpt.save(tmp_path, {"a": torch.ones(4), "b": torch.ones(4), "s": 1}, step=1, blocking=True)
    _corrupt(tmp_path / "step-000000001", "b")
    target = {"a": torch.zeros(4), "b": torch.zeros(4), "s": 0}
    with pytest.raises(ckpt.CorruptCheckpoint, match=r"\(b\): 16 bytes read, checksum does not match the manifest$"):
        ckpt.load(tmp_path, target, in_place=False)
    assert not target["a"].any() and not target["b"].any() and target["s"] == 0


def test_bytes_that_fail_their_checksum_in_place_name_the_tensor_that_holds_them(tmp_path: Path) -> None:
    ckpt.save(tmp_path, {"a": torch.ones(4), "b": torch.ones(4), "s": 1}, step=1, blocking=True)
    _corrupt(tmp_path / "step-000000001", "b")
    target = {"a": torch.zeros(4), "b": torch.zeros(4), "s": 0}
    with pytest.raises(ckpt.CorruptCheckpoint, match=r"\(b\): .* does not match the manifest \(read in place: b holds"):
        ckpt.load(tmp_path, target)
    assert target["s"] == 0  # no value is set
    assert not torch.equal(target["b"], torch.ones(4)) and target["b"].any()  # the bad bytes, as the message says


def test_a_file_cut_short_is_corrupt(tmp_path: Path) -> None:
    ckpt.save(tmp_path, {"a": torch.ones(4), "b": torch.ones(1000)}, step=1, blocking=True)
    data = next((tmp_path / "step-000000001").glob("rank-00000.*.bin"))
    data.write_bytes(data.read_bytes()[:-100])
    for in_place in (True, False):
        with pytest.raises(
            ckpt.CorruptCheckpoint, match=r"\(b\): bytes 128\.\.4128 are past the end of the file \(40\d\d bytes\)"
        ):
            ckpt.load(tmp_path, {"a": torch.zeros(4), "b": torch.zeros(1000)}, in_place=in_place)


def test_load_reads_into_the_callers_tensors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In place, the storage is handed the tensors' own memory: no staging buffer, and the tensors stay the same
    objects at the same addresses; not in place, it is handed buffers of its own."""
    state = {"w": torch.randn(64, 32), "b": torch.randn(32).to(torch.bfloat16), "m": torch.tensor([True, False])}
    ckpt.save(tmp_path, state, step=1, blocking=True)
    from haiscale.checkpoint.storage import LocalStorage

    calls: list[list[int]] = []  # the buffers' addresses, per call
    read_into = LocalStorage.read_into

    def spy(self: LocalStorage, ranges: Any, buffers: Any) -> list[int]:
        calls.append([numpy.frombuffer(b, dtype=numpy.uint8).ctypes.data for b in buffers])
        return read_into(self, ranges, buffers)

    monkeypatch.setattr(LocalStorage, "read_into", spy)
    target = {k: torch.zeros_like(v) for k, v in state.items()}
    before = {k: (v, v.data_ptr()) for k, v in target.items()}
    ckpt.load(tmp_path, target)
    _assert_same(state, target)
    assert all(target[k] is t and t.data_ptr() == ptr for k, (t, ptr) in before.items())
    assert len(calls) == 2  # the pickled values (a buffer of their own, before any tensor), then one batch
    assert len(calls[0]) == 1 and set(calls[1]) == {t.data_ptr() for t in target.values()}
    again = {k: torch.zeros_like(v) for k, v in state.items()}
    ckpt.load(tmp_path, again, in_place=False)
    _assert_same(state, again)
    assert len(calls) == 4 and len(calls[3]) == 1  # the values, then one staging buffer for the three neighbours
    assert not set(calls[3]) & {t.data_ptr() for t in again.values()}


def test_non_contiguous_tensors_and_partial_slices_load(tmp_path: Path) -> None:
    flat = torch.arange(1000, dtype=torch.float32)
    for rank in (1, 0):
        part = ckpt.Shard(flat[rank * 500 : (rank + 1) * 500].clone(), (10, 100), rank * 500)
        state = {"w": torch.arange(12.0).view(3, 4), "s": part}
        ckpt.save(tmp_path, state, step=1, rank=rank, world_size=2, save_id="x")
    ckpt.wait_for_saves()
    for lo, hi in ((0, 1000), (300, 800), (250, 1000), (500, 1000), (999, 1000)):
        w = torch.zeros(4, 3).t()  # a transposed view: not contiguous
        target = {"w": w, "s": ckpt.Shard(torch.zeros(hi - lo), (10, 100), lo)}
        ckpt.load(tmp_path, target)
        assert target["w"] is w and torch.equal(w, torch.arange(12.0).view(3, 4))
        assert torch.equal(target["s"].local, flat[lo:hi]), (lo, hi)


@pytest.mark.parametrize("in_place", [True, False])
def test_every_tensor_of_odd_layout_or_dtype_round_trips_into_views_of_the_same_layout(
    tmp_path: Path, in_place: bool
) -> None:
    """Views (transposed, sliced, stepped, expanded, conjugated, negated imaginary parts), 0-d and empty tensors,
    bfloat16, float8, uint64, bool, two names over one storage. A one-element tensor whose dimension has
    a stride other than 1 (``x[::2]`` of two elements; ``z.conj().imag``) is contiguous, but the load's byte view of
    it failed (``view(-1)`` keeps that stride): RuntimeError from a load of a valid checkpoint."""
    base = torch.arange(24.0).reshape(4, 6)
    state = {
        "t": base.t(),
        "slice": base[1:3, 2:5],
        "one_of_two": torch.arange(4.0)[::2][1:],
        "imag": torch.tensor([1 + 2j]).conj().imag,
        "zero_d": torch.tensor(3.5),
        "empty": torch.empty(0, 5),
        "expanded": torch.ones(1).expand(5),
        "conj": torch.tensor([1 + 2j, 3 - 1j]).conj(),
        "row_a": base[0],
        "row_b": base[0],
        "bf16": torch.randn(7).bfloat16(),
        "f8": torch.tensor([1.0, -2.0]).to(torch.float8_e4m3fn),
        "u64": torch.tensor([1, 2**63], dtype=torch.uint64),
        "bool": torch.tensor([True, False]),
    }
    ckpt.save(tmp_path, state, step=1, blocking=True)
    # into tensors of the same strides (the expanded one as a plain tensor: five elements over one would not load)
    target = {k: torch.empty_strided(v.shape, v.stride(), dtype=v.dtype).zero_() for k, v in state.items()}
    target["expanded"] = torch.zeros(5)
    # a conjugate view and a negative one (its imaginary part) of zeros: their bytes went in as saved (in_place=False:
    # after other tensors were copied), and torch refused a byte view of the conjugate one (RuntimeError)
    target["conj"] = torch.zeros(2, dtype=torch.complex64).conj()
    target["imag"] = torch.zeros(1, dtype=torch.complex64).conj().imag
    ckpt.load(tmp_path, target, in_place=in_place)
    for k, v in state.items():
        got, want = target[k].resolve_conj().resolve_neg(), v.resolve_conj().resolve_neg()
        assert got.shape == v.shape and got.dtype == v.dtype, k
        if v.dtype == torch.float8_e4m3fn:  # (no comparison for float8)
            got, want = got.view(torch.uint8), want.view(torch.uint8)
        assert torch.equal(got, want), k


def test_reads_in_place_are_planned_in_time_linear_in_the_number_of_tensors() -> None:
    """A state dict of 100,000 tensors (a mixture-of-experts model's experts and their optimizer moments): each was
    compared with every one planned before it for shared memory, minutes before the first byte was read (13 s at
    20,000 here). Tensors that share memory (tied weights) are still left out, every one of them."""
    from haiscale.checkpoint import loader
    from haiscale.checkpoint.manifest import TensorEntry

    n = 100_000
    memory = torch.zeros(n * 4)
    targets = [memory[i * 4 : (i + 1) * 4] for i in range(n)]
    random.Random(0).shuffle(targets)
    targets.append(targets[7][1:3])  # a view of one of them: the two share memory
    plan = []
    for i, t in enumerate(targets):
        entry = TensorEntry(
            f"t{i}", (f"t{i}",), 0, "float32", (t.numel(),), 0, t.numel(), "f", 64 * i, t.numel() * 4, 0
        )
        plan.append((loader._Want(entry.name, 0, t.numel(), t), [entry]))
    started = time.perf_counter()
    direct = loader._in_place(plan)
    assert time.perf_counter() - started < 60  # (seconds: about 1 now; over 300 before)
    assert len(direct) == n - 1 and ("f", 64 * 7, 16) not in direct and ("f", 64 * n, 8) not in direct


def test_parameters_and_tied_weights_load_in_place(tmp_path: Path) -> None:
    """Parameters that require grad (``keep_vars=True``) and two names for one tensor load into themselves."""

    def tied() -> torch.nn.Module:
        m = torch.nn.Sequential(torch.nn.Embedding(11, 6), torch.nn.Linear(6, 11, bias=False))
        m[1].weight = m[0].weight
        return m

    torch.manual_seed(2)
    saved = tied()
    ckpt.save(tmp_path, {"model": saved.state_dict(keep_vars=True)}, step=1, blocking=True)
    torch.manual_seed(3)
    model = tied()
    params = model.state_dict(keep_vars=True)
    ckpt.load(tmp_path, {"model": params})
    assert params["0.weight"] is params["1.weight"] is model[0].weight and model[0].weight.requires_grad
    assert torch.equal(model[0].weight, saved[0].weight)


def test_a_format_1_checkpoint_with_crc32_still_loads(tmp_path: Path) -> None:
    """Checkpoints saved before CRC-32C (format 1: zlib's crc32 under "crc32") load, their checksums checked."""
    state = _state()
    ckpt.save(tmp_path, state, step=3, blocking=True)
    folder = tmp_path / "step-000000003"
    raw = next(folder.glob("rank-00000.*.bin")).read_bytes()
    doc = json.loads((folder / ckpt.MANIFEST).read_text())
    assert doc["format"] == "haiscale-checkpoint/2" and "crc32c" in doc["tensors"][0]
    doc["format"] = "haiscale-checkpoint/1"
    for item in [*doc["tensors"], doc["objects"]]:
        del item["crc32c"]
        item["crc32"] = zlib.crc32(raw[item["file_offset"] : item["file_offset"] + item["length"]])
    (folder / ckpt.MANIFEST).write_text(json.dumps(doc))
    target = _zeros_like(state)
    assert ckpt.load(tmp_path, target).step == 3
    _assert_same(state, target)
    _corrupt(folder, "model.w")
    with pytest.raises(ckpt.CorruptCheckpoint, match=r"\(model.w\)"):
        ckpt.load(tmp_path, _zeros_like(state))
    doc["format"] = "haiscale-checkpoint/9"
    (folder / ckpt.MANIFEST).write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"MANIFEST.json: not a checkpoint manifest \(format 'haiscale-checkpoint/9'"):
        ckpt.load(tmp_path, _zeros_like(state))


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


def test_keep_k_never_removes_the_checkpoint_it_follows_when_a_run_rolled_back_to_an_earlier_step(
    tmp_path: Path,
) -> None:
    """A run rolled back (a loss spike, step 100 would not load) saves step 50 beside step 100: its keep=1 removed
    step 50 itself, and its handle gave a manifest that was gone (the one reported to the scheduler)."""
    ckpt.save(tmp_path, {"w": torch.full((4,), 100.0)}, step=100, blocking=True)
    ckpt.save(tmp_path, {"w": torch.full((4,), 40.0)}, step=40, blocking=True)
    handle = ckpt.save(tmp_path, {"w": torch.full((4,), 50.0)}, step=50, keep=1, blocking=True)
    assert handle.removed_steps == [40]
    assert os.path.exists(handle.wait() or "")
    target = {"w": torch.zeros(4)}
    assert ckpt.load(tmp_path, target, step=50).step == 50 and bool((target["w"] == 50.0).all())
    assert ckpt.latest_step(tmp_path) == 100  # the newest by step is kept too: which to resume from is the run's


def test_a_shard_takes_integers_of_any_kind_and_refuses_other_fields_when_it_is_made(tmp_path: Path) -> None:
    """An offset computed with numpy or torch (numpy.int64, a 0-d tensor) passed the Shard's check, then failed the
    background write after the data file was written (not JSON serializable); a float offset or dimension was taken,
    or rounded, the same way. Integers of any kind are ints now, the others refused before anything is written."""
    shards = {
        "a": ckpt.Shard(torch.ones(4), (numpy.int64(8),), numpy.int64(4)),
        "b": ckpt.Shard(torch.ones(2), [4], torch.tensor(2)),
    }
    assert shards["a"].offset == 4 and type(shards["a"].offset) is int and type(shards["a"].global_shape[0]) is int
    ckpt.save(tmp_path, shards, step=1, blocking=True)
    target = {"a": ckpt.Shard(torch.zeros(4), (8,), 4), "b": ckpt.Shard(torch.zeros(2), (4,), 2)}
    ckpt.load(tmp_path, target)
    assert target["a"].local.tolist() == [1.0] * 4 and target["b"].local.tolist() == [1.0, 1.0]
    with pytest.raises(TypeError, match="global_shape and offset are integers"):
        ckpt.Shard(torch.ones(4), (8,), 1.5)
    with pytest.raises(TypeError, match="global_shape and offset are integers"):
        ckpt.Shard(torch.ones(4), (8.5,), 0)
    with pytest.raises(ValueError, match=r"global_shape \[-2, -4\] has a negative dimension"):
        ckpt.Shard(torch.ones(4), (-2, -4), 0)
    with pytest.raises(TypeError, match="local part is a tensor, not list"):
        ckpt.Shard([1.0], (8,), 0)


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


LOAD_UNDER_256_OPEN_FILES = """
import resource, sys, torch
from haiscale import checkpoint as ckpt
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
n = int(sys.argv[2])
target = {"m": ckpt.Shard(torch.zeros(2 * n), (2 * n,), 0)}
ckpt.load(sys.argv[1], target)
print(torch.equal(target["m"].local, (torch.arange(2 * n) // 2).float()))
"""


def test_a_checkpoint_saved_on_more_ranks_than_open_files_allowed_loads_on_one(tmp_path: Path) -> None:
    """Saved on 300 ranks, loaded whole on one (a conversion, an evaluation) where a process may open 256 files
    (1024 is the usual default, against thousands of ranks): every rank's file was opened at once (EMFILE)."""
    n = 300
    for rank in [*range(1, n), 0]:
        shard = ckpt.Shard(torch.full((2,), float(rank)), (2 * n,), 2 * rank)
        ckpt.save(tmp_path, {"m": shard}, step=1, rank=rank, world_size=n, save_id="many")
    ckpt.wait_for_saves()
    run = subprocess.run(
        [sys.executable, "-c", LOAD_UNDER_256_OPEN_FILES, str(tmp_path), str(n)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.stdout.split() == ["True"], run.stderr[-2000:]


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
    parts = sorted(p.name for p in (tmp_path / "step-000000005").glob("part-*"))
    assert parts == [f"part-0000{r}.s5.json" for r in (1, 2, 3)]  # rank 0 merges its own entries from memory
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
