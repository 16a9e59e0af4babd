"""haiscale.checkpoint against manifests crafted by hand: every one is refused with an error naming the problem,
before a byte of the caller's state changes, nothing outside the checkpoint's folder is opened, and nothing the
manifest claims is allocated before it is checked."""

from __future__ import annotations

import collections
import dataclasses
import datetime
import json
import os
import pickle
import random
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import crc32c
import numpy
import pytest
import torch

from haiscale import checkpoint as ckpt
from haiscale.checkpoint import storage

Doc = dict[str, Any]


def _saved(root: Path) -> Path:
    """A committed checkpoint of two tensors and a value; its folder."""
    ckpt.save(root, {"a": torch.ones(4), "b": torch.arange(8.0), "s": 1}, step=1, blocking=True)
    return root / "step-000000001"


def _target() -> dict[str, Any]:
    return {"a": torch.full((4,), 9.0), "b": torch.full((8,), 9.0), "s": 0}


def _unchanged(state: dict[str, Any]) -> bool:
    return bool((state["a"] == 9.0).all()) and bool((state["b"] == 9.0).all()) and state["s"] == 0


def _entry(doc: Doc, name: str) -> Doc:
    return next(t for t in doc["tensors"] if t["name"] == name)


def _set(name: str, **fields: Any) -> Callable[[Doc], None]:
    return lambda doc: _entry(doc, name).update(fields)


def _dup_other_dtype(doc: Doc) -> None:
    doc["tensors"].append({**_entry(doc, "b"), "dtype": "int8", "length": 8})


OUTSIDE = "../../secret.bin"  # from the checkpoint folder: beside the root
CRAFTED: list[tuple[str, Callable[[Doc], None], str]] = [
    ("a length past any file", _set("b", length=10**13), r"tensors\[1\] \(b\): length 10000000000000 is not"),
    ("a negative length", _set("b", length=-5), r"\(b\): length -5 is not"),
    ("a negative file offset", _set("b", file_offset=-64), r"\(b\): file_offset -64 is not an integer >= 0"),
    ("a negative numel", _set("b", numel=-5), r"\(b\): numel -5 is not an integer >= 0"),
    ("a slice past its shape", _set("b", offset=4), r"\(b\): elements 4\.\.12 do not fit its shape \[8\]"),
    ("a shape that overflows", _set("b", shape=[2**40, 2**40]), r"\(b\): shape \[\d+, \d+\] has more elements"),
    ("a shape of strings", _set("b", shape=["8"]), r"\(b\): shape \['8'\] is not a list of integers >= 0"),
    ("a dtype that is none", _set("b", dtype="Tensor"), r"\(b\): unknown dtype 'Tensor'"),
    ("a quantized dtype", _set("b", dtype="qint8", length=8), r"\(b\): dtype 'qint8' in the manifest is quantized"),
    ("a file outside the folder", _set("b", file=OUTSIDE), r"\(b\): file '\.\./\.\./secret\.bin' is not a name"),
    ("an absolute file", _set("b", file="/etc/passwd"), r"\(b\): file '/etc/passwd' is not a name"),
    ("values outside the folder", lambda d: d["objects"].update(file=OUTSIDE), r"objects: file '\.\./\.\./secret"),
    ("values of a huge length", lambda d: d["objects"].update(length=10**12), r"past the end of"),
    (
        "a name repeated as another dtype",
        _dup_other_dtype,
        r"tensors\[2\] \(b\): int8 \[8\], but tensors\[1\] is float32",
    ),
    ("keys that are not the name", _set("b", keys=["zzz"]), r"\(b\): keys \['zzz'\] do not make the name 'b'"),
    ("a checksum of text", _set("b", crc32c="x"), r"\(b\): crc32c 'x' is not a 32-bit checksum"),
    ("a step of 1.5", lambda d: d.update(step=1.5), r"step 1\.5 is not an integer >= 0"),
    ("a world size of 0", lambda d: d.update(world_size=0), r"world_size 0 is not an integer >= 1"),
    ("a list for a manifest", lambda d: (d.clear(), d.update(x=[1])), r"not a checkpoint manifest"),
]


@pytest.mark.parametrize("in_place", [True, False])
@pytest.mark.parametrize(("mutate", "words"), [c[1:] for c in CRAFTED], ids=[c[0] for c in CRAFTED])
def test_a_crafted_manifest_is_refused_before_anything_is_read_or_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_place: bool, mutate: Callable[[Doc], None], words: str
) -> None:
    folder = _saved(tmp_path / "root")
    (tmp_path / "secret.bin").write_bytes(b"S" * 4096)
    manifest = folder / ckpt.MANIFEST
    doc = json.loads(manifest.read_text())
    mutate(doc)
    manifest.write_text(json.dumps(doc))
    opened: list[str] = []
    real_open = os.open

    def watched(path: Any, *args: Any, **kw: Any) -> int:
        opened.append(os.path.abspath(os.fspath(path)))
        return real_open(path, *args, **kw)

    monkeypatch.setattr(storage.os, "open", watched)
    state = _target()
    with pytest.raises(ValueError, match=words):  # not MemoryError, OverflowError, AttributeError...
        ckpt.load(tmp_path / "root", state, in_place=in_place)
    assert _unchanged(state)
    assert all(p.startswith(str(folder) + os.sep) for p in opened), opened


def test_a_manifest_that_is_a_json_list_is_not_a_manifest(tmp_path: Path) -> None:
    folder = _saved(tmp_path)
    (folder / ckpt.MANIFEST).write_text("[1, 2]")
    state = _target()
    with pytest.raises(ValueError, match=r"MANIFEST.json: not a checkpoint manifest \(a JSON list, not an object\)"):
        ckpt.load(tmp_path, state)
    assert _unchanged(state)


def test_a_manifest_of_gigabytes_is_refused_without_being_read(tmp_path: Path) -> None:
    folder = _saved(tmp_path)
    with (folder / ckpt.MANIFEST).open("r+b") as f:
        f.truncate(3 << 30)  # sparse: costs no disk; reading it would cost 3 GiB of memory
    state = _target()
    with pytest.raises(ValueError, match=r"MANIFEST.json: 3221225472 bytes, more than a manifest may be \(\d+\)"):
        ckpt.load(tmp_path, state)
    assert _unchanged(state)


@pytest.mark.parametrize("in_place", [True, False])
def test_a_slice_past_its_data_files_end_is_refused_before_any_tensor_changes(tmp_path: Path, in_place: bool) -> None:
    """Found from the files' sizes before reading: in place too, the tensors read before it keep their values."""
    folder = _saved(tmp_path)
    doc = json.loads((folder / ckpt.MANIFEST).read_text())
    size = next(folder.glob("rank-00000.*.bin")).stat().st_size
    _entry(doc, "b")["file_offset"] = size - 16
    (folder / ckpt.MANIFEST).write_text(json.dumps(doc))
    state = _target()
    with pytest.raises(ckpt.CorruptCheckpoint, match=rf"\(b\): bytes {size - 16}\.\.{size + 16} are past the end of"):
        ckpt.load(tmp_path, state, in_place=in_place)
    assert _unchanged(state)


def test_a_missing_data_file_is_refused_before_any_tensor_changes(tmp_path: Path) -> None:
    folder = _saved(tmp_path)
    doc = json.loads((folder / ckpt.MANIFEST).read_text())
    _entry(doc, "b")["file"] = "rank-00009.gone.bin"
    (folder / ckpt.MANIFEST).write_text(json.dumps(doc))
    state = _target()
    with pytest.raises(ckpt.CorruptCheckpoint, match=r"rank-00009\.gone\.bin \(b\): no such file"):
        ckpt.load(tmp_path, state)
    assert _unchanged(state)


def test_allocate_missing_refuses_a_quantized_dtype_with_a_value_error(tmp_path: Path) -> None:
    """torch.empty of a quantized dtype fails an internal assert (RuntimeError); no save writes one."""
    folder = _saved(tmp_path)
    doc = json.loads((folder / ckpt.MANIFEST).read_text())
    doc["tensors"].append({**_entry(doc, "b"), "name": "q", "keys": ["q"], "dtype": "quint8", "length": 8})
    (folder / ckpt.MANIFEST).write_text(json.dumps(doc))
    state = _target()
    with pytest.raises(ValueError, match=r"\(q\): dtype 'quint8' in the manifest is quantized"):
        ckpt.load(tmp_path, state, allocate_missing=True)
    assert _unchanged(state) and "q" not in state


def test_allocate_missing_makes_nothing_a_crafted_shape_claims(tmp_path: Path) -> None:
    """A tensor the state dict lacks is made only once the manifest's slices of it are checked against the files."""
    folder = _saved(tmp_path)
    doc = json.loads((folder / ckpt.MANIFEST).read_text())
    huge = {**_entry(doc, "b"), "name": "h", "keys": ["h"], "shape": [1 << 40], "numel": 1 << 40, "length": 4 << 40}
    doc["tensors"].append(huge)
    (folder / ckpt.MANIFEST).write_text(json.dumps(doc))
    state = _target()
    with pytest.raises(ckpt.CorruptCheckpoint, match=r"\(h\): bytes \d+\.\.\d+ are past the end of"):
        ckpt.load(tmp_path, state, allocate_missing=True)
    assert _unchanged(state) and "h" not in state


# ---- concurrent savers and loaders on one checkpoint root ----


def _paused_reads(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """Make the next checkpoint read wait: (it is waiting, let it go on)."""
    waiting, go_on = threading.Event(), threading.Event()
    read_into = storage.LocalStorage.read_into

    def paused(self: storage.LocalStorage, ranges: Any, buffers: Any) -> list[int]:
        waiting.set()
        assert go_on.wait(30)
        return read_into(self, ranges, buffers)

    monkeypatch.setattr(storage.LocalStorage, "read_into", paused)
    return waiting, go_on


def test_keep_k_does_not_remove_a_checkpoint_while_it_is_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restarted job loads the newest checkpoint while the old job's save commits a newer one with keep=1."""
    ckpt.save(tmp_path, {"w": torch.full((1 << 12,), 1.0), "s": 1}, step=1, blocking=True)
    waiting, go_on = _paused_reads(monkeypatch)  # (a save on one rank reads nothing)
    target = {"w": torch.zeros(1 << 12), "s": 0}
    outcome: list[Any] = []
    loader = threading.Thread(target=lambda: outcome.append(_outcome(lambda: ckpt.load(tmp_path, target))))
    loader.start()
    assert waiting.wait(30)
    handle = ckpt.save(tmp_path, {"w": torch.full((1 << 12,), 2.0), "s": 2}, step=2, keep=1, blocking=True)
    go_on.set()
    loader.join(30)
    assert outcome and not isinstance(outcome[0], BaseException), outcome
    assert outcome[0].step == 1 and bool((target["w"] == 1.0).all()) and target["s"] == 1
    assert handle.removed_steps == []  # left for a later save, once the load is over
    assert ckpt.save(tmp_path, {"w": torch.ones(1), "s": 3}, step=3, keep=1, blocking=True).removed_steps == [1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000000003"]
    assert sorted(p.name for p in (tmp_path / "step-000000003").iterdir())[0] == ckpt.MANIFEST  # no lease left


def test_keep_k_does_not_remove_another_jobs_save_still_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Job A's save of step 5 is still writing when job B (same root, further on) commits step 6 with keep=3: B's
    prune leaves A's folder, and A commits a whole checkpoint that loads."""
    ckpt.save(tmp_path, {"w": torch.full((8,), 4.0)}, step=4, blocking=True)
    writing, go_on = threading.Event(), threading.Event()
    write_file = storage.LocalStorage.write_file

    def slow(self: storage.LocalStorage, path: str, pieces: Any) -> None:
        if path.endswith(".bin") and "step-000000005" in path:
            writing.set()
            assert go_on.wait(30)
        write_file(self, path, pieces)

    monkeypatch.setattr(storage.LocalStorage, "write_file", slow)
    job_a = ckpt.save(tmp_path, {"w": torch.full((8,), 5.0)}, step=5)  # in its background thread
    assert writing.wait(30)
    job_b = subprocess.run(  # another process: its own save in flight
        [sys.executable, "-c", JOB_B, str(tmp_path)], capture_output=True, text=True, timeout=120, check=False
    )
    assert job_b.returncode == 0 and job_b.stdout.split() == ["6", "[]"], job_b.stderr[-2000:]
    go_on.set()
    assert job_a.wait(30) == str(tmp_path / "step-000000005" / ckpt.MANIFEST)
    target = {"w": torch.zeros(8)}
    assert ckpt.load(tmp_path, target, step=5).step == 5 and bool((target["w"] == 5.0).all())
    assert ckpt.latest_step(tmp_path) == 6


def test_a_lease_dated_far_in_the_future_does_not_hold_its_folder_forever(tmp_path: Path) -> None:
    """A lease file dated in 2286 (a host's clock gone wrong, or written by hand into a shared root) was live for
    ever, from any host and on this one with a live pid (1): keep-K never removed that checkpoint."""
    for step in (1, 2):
        ckpt.save(tmp_path, {"w": torch.full((4,), float(step))}, step=step, blocking=True)
    (tmp_path / "step-000000001" / ".lease-load-9999999999-1-abcdef-otherhost").write_bytes(b"")
    (tmp_path / "step-000000002" / f".lease-load-9999999999-1-abcdef-{socket.gethostname()}").write_bytes(b"")
    handle = ckpt.save(tmp_path, {"w": torch.full((4,), 3.0)}, step=3, keep=1, blocking=True)
    assert handle.removed_steps == [1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000000003"]


JOB_B = """
import sys, torch
from haiscale import checkpoint as ckpt
h = ckpt.save(sys.argv[1], {"w": torch.full((8,), 6.0)}, step=6, keep=3, blocking=True)
print(h.step, h.removed_steps)
"""


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except BaseException as err:
        return err


class _Module:
    """A module as one importer sees it, with some of its functions replaced."""

    def __init__(self, module: Any, **replaced: Any) -> None:
        self._module, self._replaced = module, replaced

    def __getattr__(self, name: str) -> Any:
        return self._replaced[name] if name in self._replaced else getattr(self._module, name)


def test_two_writers_with_the_same_pid_and_thread_never_share_a_temporary_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two jobs on two hosts (or in two containers) often have the same pid: each writes its own temporary file, so
    neither renames the other's half-written bytes into place."""
    # as storage.py sees them only: patching the modules themselves would give every thread the ident 7, and a save
    # thread of an earlier test ending meanwhile fails to remove itself from threading's table (seen in CI)
    monkeypatch.setattr(storage, "os", _Module(os, getpid=lambda: 1))
    monkeypatch.setattr(storage, "threading", _Module(threading, get_ident=lambda: 7))
    written: list[str] = []
    write_file = storage.LocalStorage.write_file

    def spy(self: storage.LocalStorage, path: str, pieces: Any) -> None:
        written.append(path)
        write_file(self, path, pieces)

    monkeypatch.setattr(storage.LocalStorage, "write_file", spy)
    local = storage.LocalStorage()
    local.write_atomic(str(tmp_path / ckpt.MANIFEST), b"one")
    local.write_atomic(str(tmp_path / ckpt.MANIFEST), b"two")
    assert len(set(written)) == 2, written
    assert (tmp_path / ckpt.MANIFEST).read_bytes() == b"two"


# ---- state dicts of tensors the bytes cannot go into as they are ----


def test_a_parameter_that_is_not_contiguous_loads_and_the_ones_before_it_too(tmp_path: Path) -> None:
    """A Parameter (requires grad) that is not read in place (not contiguous here; on a GPU, every one) is copied
    into without autograd's in-place check failing halfway through the load."""
    ckpt.save(tmp_path, {"a": torch.ones(4), "w": torch.arange(12.0).reshape(3, 4)}, step=1, blocking=True)
    w = torch.nn.Parameter(torch.zeros(4, 3).t())
    target = {"a": torch.zeros(4), "w": w}
    assert ckpt.load(tmp_path, target).step == 1
    assert target["w"] is w and w.requires_grad and torch.equal(w.detach(), torch.arange(12.0).reshape(3, 4))
    assert bool((target["a"] == 1.0).all())


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: torch.empty(4, device="meta"), r"^b: .* a tensor on the meta device \(no memory to load into\)"),
        (lambda: torch.zeros(4).to_sparse(), r"^b: .* a torch\.sparse_coo tensor \(only strided tensors load\)"),
        (lambda: torch.zeros(1).expand(4), r"^b: .* an expanded tensor \(elements that share memory"),
    ],
    ids=["meta", "sparse", "expanded"],
)
def test_a_tensor_without_memory_for_the_bytes_is_a_mismatch_before_anything_changes(
    tmp_path: Path, make: Callable[[], torch.Tensor], words: str
) -> None:
    ckpt.save(tmp_path, {"a": torch.ones(4), "b": torch.ones(4), "c": torch.ones(4)}, step=1, blocking=True)
    for in_place in (True, False):  # (an expanded one was copied into last: RuntimeError, a and c already changed)
        target = {"a": torch.zeros(4), "b": make(), "c": torch.zeros(4)}
        with pytest.raises(ckpt.CheckpointMismatch, match=words):
            ckpt.load(tmp_path, target, in_place=in_place)
        assert not target["a"].any() and not target["c"].any()


def test_a_checkpoint_of_two_tensors_loads_into_one_tensor_named_twice_as_load_state_dict_would(
    tmp_path: Path,
) -> None:
    """Untied weights saved, a model with them tied loading: the last name's values win, as in load_state_dict;
    no checksum failure blamed on the checkpoint (read in place, the second read overwrote the first's bytes)."""
    ckpt.save(tmp_path, {"a": torch.ones(4), "b": torch.full((4,), 2.0), "c": torch.full((2,), 3.0)}, step=1)
    ckpt.wait_for_saves()
    for in_place in (True, False):
        tied, half = torch.zeros(4), torch.zeros(4)
        ckpt.load(tmp_path, {"a": tied, "b": tied, "c": half[2:]}, in_place=in_place)
        assert torch.equal(tied, torch.full((4,), 2.0)) and torch.equal(half, torch.tensor([0.0, 0.0, 3.0, 3.0]))


def test_a_prune_that_fails_does_not_fail_the_save_it_follows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checkpoint is committed before the old ones are removed: a removal that fails (storage down, a folder
    of someone else's in a shared root) is logged and left for the next save; the save succeeded (and is reported:
    else the scheduler never hears of a durable checkpoint)."""
    for step in (1, 2):
        ckpt.save(tmp_path, {"w": torch.full((4,), float(step))}, step=step, blocking=True)

    def refused(self: storage.LocalStorage, path: str) -> None:
        if path.endswith("step-000000001"):
            raise PermissionError(13, "Permission denied", path)
        shutil.rmtree(path)

    monkeypatch.setattr(storage.LocalStorage, "remove_tree", refused)
    handle = ckpt.save(tmp_path, {"w": torch.full((4,), 3.0)}, step=3, keep=1, blocking=True)
    assert handle.wait() == str(tmp_path / "step-000000003" / ckpt.MANIFEST)
    assert handle.removed_steps == [2]
    target = {"w": torch.zeros(4)}
    assert ckpt.load(tmp_path, target).step == 3 and bool((target["w"] == 3.0).all())


def test_a_step_or_save_id_no_storage_or_scheduler_can_hold_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    """A step past int64 would be committed, then fail its report (the scheduler stores int64); a save id of 300
    characters makes file names longer than a file system allows, found only in the background write."""
    with pytest.raises(ValueError, match=r"step must be an integer in 0\.\.2\*\*63-1"):
        ckpt.save(tmp_path, {"w": torch.ones(4)}, step=2**63)
    with pytest.raises(ValueError, match=r"save_id must be 1 to 64 letters and digits"):
        ckpt.save(tmp_path, {"w": torch.ones(4)}, step=1, rank=0, world_size=2, save_id="a" * 300)
    assert list(tmp_path.iterdir()) == []


def test_ranks_that_disagree_on_a_tensor_commit_nothing_that_would_not_load(tmp_path: Path) -> None:
    """Rank 1 saves its Shard of ``m`` as float64, rank 0 as float32 (a bug in the caller): the merged manifest
    would be refused by every load, so the save fails and the previous checkpoint stays the newest."""
    ckpt.save(tmp_path, {"m": ckpt.Shard(torch.zeros(4), (8,), 0)}, step=1, blocking=True)
    for rank, dtype in ((1, torch.float64), (0, torch.float32)):
        shard = ckpt.Shard(torch.ones(4, dtype=dtype), (8,), rank * 4)
        handle = ckpt.save(tmp_path, {"m": shard}, step=2, rank=rank, world_size=2, save_id="disagree")
    with pytest.raises(
        ckpt.CheckpointError, match=r"step 2: not committed, .*\(m\): float64 \[8\], but tensors\[0\] is float32"
    ):
        handle.wait()
    assert ckpt.latest_step(tmp_path) == 1
    target = {"m": ckpt.Shard(torch.full((4,), 9.0), (8,), 0)}
    assert ckpt.load(tmp_path, target).step == 1 and not target["m"].local.any()


def test_a_load_of_step_true_is_refused_not_taken_for_step_1(tmp_path: Path) -> None:
    ckpt.save(tmp_path, {"w": torch.ones(2)}, step=1, blocking=True)
    for step in (True, "1", 1.0):
        with pytest.raises(TypeError, match=r"step is an integer or None, not"):
            ckpt.load(tmp_path, {"w": torch.zeros(2)}, step=step)


@pytest.mark.parametrize(
    ("state", "words"),
    [
        (
            {"x.y": 1, "x": {"y": 2}},
            r"x\.y: two leaves of the state dict have this name: keys \['x\.y'\] and \['x', 'y'\]",
        ),
        ({"a.b": torch.ones(2), "a": {"b": torch.zeros(2)}}, r"a\.b: two leaves .* \['a\.b'\] and \['a', 'b'\]"),
        ({1: torch.ones(2), "1": torch.zeros(2)}, r"1: two leaves .* keys \[1\] and \['1'\]"),
        ({"": torch.ones(2)}, r"a tensor under the key '' at the top of the state dict has no name"),
    ],
    ids=["values", "tensors", "int and str", "empty name"],
)
def test_two_leaves_of_one_name_are_refused_by_save_before_anything_is_written(
    tmp_path: Path, state: dict[Any, Any], words: str
) -> None:
    """A checkpoint finds a leaf by its dotted name: two leaves of one name would lose one (a value silently). A
    tensor named "" was refused only by the commit's check, after its data was written."""
    with pytest.raises(ValueError, match=words):
        ckpt.save(tmp_path, state, step=1)
    assert list(tmp_path.iterdir()) == []


def test_slices_that_claim_the_same_bytes_many_times_are_refused_before_allocate_missing_makes_them(
    tmp_path: Path,
) -> None:
    """A crafted manifest naming one saved range under many names would make allocate_missing allocate it once per
    name (a million names: a million times); the slices of a saved checkpoint never share bytes."""
    folder = _saved(tmp_path)
    doc = json.loads((folder / ckpt.MANIFEST).read_text())
    b = _entry(doc, "b")
    doc["tensors"] += [{**b, "name": f"copy{i}", "keys": [f"copy{i}"]} for i in range(50)]
    (folder / ckpt.MANIFEST).write_text(json.dumps(doc))
    state = _target()
    with pytest.raises(ckpt.CorruptCheckpoint, match=r"slices of \d+ bytes in data files of \d+: some share bytes"):
        ckpt.load(tmp_path, state, allocate_missing=True)
    assert _unchanged(state) and "copy0" not in state


# ---- the pickled values: unpickling can run whatever a pickle names ----


class _Runs:
    """A value whose unpickling runs a command (what a hostile checkpoint's values would hold)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


@dataclasses.dataclass
class _Config:
    """A value of a class of the caller's own."""

    lr: float


def test_values_that_name_code_are_refused_unless_the_checkpoint_is_trusted(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    ckpt.save(tmp_path / "root", {"w": torch.ones(2), "evil": _Runs(marker)}, step=1, blocking=True)
    for in_place in (False, True):  # (in place too: the values are rebuilt before any tensor is read)
        state = {"w": torch.zeros(2), "evil": None}
        with pytest.raises(ckpt.UntrustedValues, match=r"values name (posix|os)\.system, .*trusted=True"):
            ckpt.load(tmp_path / "root", state, in_place=in_place)
        assert not marker.exists() and state["evil"] is None and not state["w"].any()
    ckpt.save(tmp_path / "root", {"w": torch.ones(2), "cfg": _Config(0.5)}, step=2, blocking=True)
    with pytest.raises(ckpt.UntrustedValues, match=r"values name .*_Config"):
        ckpt.load(tmp_path / "root", {"w": torch.zeros(2), "cfg": None})
    mine = {"w": torch.zeros(2), "cfg": None}
    ckpt.load(tmp_path / "root", mine, trusted=True)
    assert mine["cfg"] == _Config(0.5)


class _Makes:
    """A value whose pickle calls ``func(*args)`` (what a hostile checkpoint's values would hold)."""

    def __init__(self, func: Any, *args: Any) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.func, self.args


def _reconstruct() -> Any:
    return numpy.arange(2).__reduce__()[0]  # numpy's _reconstruct, wherever this numpy keeps it


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (_Makes(bytearray, 10**12), r"values call builtins\.bytearray"),
        (_Makes(bytes, 10**12, "newobj"), r"values call builtins\.bytes"),  # (rewritten below to NEWOBJ)
        (_Makes(str, [b"x" * 1000] * 1000), r"values call builtins\.str"),  # (a repr a thousand times the pickle)
        (_Makes(collections.Counter, range(10**6)), r"values pass a range to collections\.Counter"),
        (_Makes(torch.Size, range(10**6)), r"values pass a range to torch\.Size"),
        (_Makes(collections.deque, range(10**6)), r"values pass a range to collections\.deque"),
        (_Makes(_reconstruct(), numpy.ndarray, (10**11,), b"b"), r"make an array larger than their pickle"),
    ],
    ids=["bytearray-size", "bytes-newobj", "str-of-a-list", "counter-range", "size-range", "deque-range", "array"],
)
def test_values_that_make_more_than_their_bytes_are_refused_before_they_fill_memory(
    tmp_path: Path, value: Any, words: str
) -> None:
    """Values of a few bytes whose pickle calls a type the safe list has (bytearray(10**12), Counter(range(...)), an
    empty numpy array of 100 GB): a load made them (MemoryError at best, the machine's memory at worst) before
    anything checked them. Only what the values' own pickles call is called, and nothing larger than the pickle."""
    ckpt.save(tmp_path, {"w": torch.ones(2), "v": value}, step=1, blocking=True)
    if value.args[-1] == "newobj":  # bytes.__new__(bytes, 10**12): NEWOBJ takes (class, arguments) as REDUCE does
        # the arguments (10**12, "newobj") and REDUCE become (10**12,), no-ops and NEWOBJ: as long, as many memos
        reduce, newobj = b"\x8c\x06newobj\x94\x86\x94R", b"\x85\x94N\x940N0N0N0\x81"
        _rewrite_values(tmp_path / "step-000000001", lambda b: b.replace(reduce, newobj))
    state = {"w": torch.zeros(2), "v": None}
    with pytest.raises(ckpt.UntrustedValues, match=words):
        ckpt.load(tmp_path, state)  # (in place: the values are rebuilt before any tensor is read)
    assert state["v"] is None and not state["w"].any()


def _rewrite_values(folder: Path, rewrite: Callable[[bytes], bytes]) -> None:
    """Rewrite the pickled values of checkpoint ``folder`` (their checksum too, as a hostile writer would)."""
    doc = json.loads((folder / ckpt.MANIFEST).read_text())
    blob = doc["objects"]
    data = (folder / blob["file"]).read_bytes()
    old = data[blob["file_offset"] : blob["file_offset"] + blob["length"]]
    new = rewrite(old)
    assert new != old and len(new) == len(old)  # (a pickle's frames say how long they are)
    (folder / blob["file"]).write_bytes(data.replace(old, new))
    blob.update(crc32c=crc32c.crc32c(new))
    (folder / ckpt.MANIFEST).write_text(json.dumps(doc))


def _replace_values(folder: Path, values: dict[str, tuple[tuple[Any, ...], Any]]) -> None:
    """Give checkpoint ``folder`` other pickled values (appended to its data file), as a hostile writer would."""
    doc = json.loads((folder / ckpt.MANIFEST).read_text())
    blob, new = doc["objects"], pickle.dumps(values, protocol=pickle.HIGHEST_PROTOCOL)
    with (folder / blob["file"]).open("ab") as f:
        blob.update(file_offset=f.tell(), length=len(new), crc32c=crc32c.crc32c(new), names=list(values))
        f.write(new)
    (folder / ckpt.MANIFEST).write_text(json.dumps(doc))


@pytest.mark.parametrize("in_place", [True, False])
@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"model": (("model",), "gone")}, r"^model: the checkpoint has a value there, the state dict a dict$"),
        ({"model.w": (("model", "w"), "gone")}, r"^model\.w: .* a value there, the state dict a Tensor$"),
        (
            {"model.w.x": (("model", "w", "x"), 1)},
            r"^model\.w\.x: .* a value or tensor there, .* a Tensor at model\.w$",
        ),
        ({"n.x": (("n", "x"), 1)}, r"^n\.x: .* a value or tensor there, the state dict a int at n$"),
    ],
    ids=["a subtree", "a tensor", "through a tensor", "through a value"],
)
def test_values_that_would_replace_the_callers_tensors_or_subtrees_are_a_mismatch_that_changes_nothing(
    tmp_path: Path, values: dict[str, Any], words: str, in_place: bool
) -> None:
    """A crafted checkpoint's values are set where their keys say, after the tensors: the value ``model`` replaced
    the caller's whole model state (the load succeeded), one under a tensor failed halfway (tensors copied, values
    before it set). Now a mismatch before anything changes, in place too."""
    ckpt.save(tmp_path, {"model": {"w": torch.ones(2)}, "n": 1}, step=1, blocking=True)
    _replace_values(tmp_path / "step-000000001", {"n": (("n",), 1), **values})
    w, model = torch.zeros(2), {}
    model["w"] = w
    state: dict[str, Any] = {"model": model, "n": 0}
    with pytest.raises(ckpt.CheckpointMismatch, match=words):
        ckpt.load(tmp_path, state, in_place=in_place)
    assert state == {"model": model, "n": 0} and state["model"] is model and model["w"] is w and not w.any()


def test_a_value_goes_where_the_state_dict_has_an_empty_dict_for_it(tmp_path: Path) -> None:
    ckpt.save(tmp_path, {"w": torch.ones(2), "data": 5}, step=1, blocking=True)
    state: dict[str, Any] = {"w": torch.zeros(2), "data": {}}
    ckpt.load(tmp_path, state)
    assert state["data"] == 5 and bool((state["w"] == 1).all())


def test_the_values_a_trainer_keeps_load_without_trust(tmp_path: Path) -> None:
    """RNG states (Python, numpy), numpy arrays and scalars, optimizer hyper-parameters, torch sizes, dtypes and
    devices, ordered and default dicts, times: what training state holds, none of which names code."""
    values = {
        "py_rng": random.Random(3).getstate(),
        "np_rng": numpy.random.RandomState(4).get_state(),
        "np_gen": [numpy.random.default_rng(5).bit_generator.state],  # (a dict in a dict would be a subtree)
        "array": numpy.arange(6, dtype=numpy.float32).reshape(2, 3),
        "scalar": numpy.float64(2.5),
        "groups": [{"lr": 0.1, "betas": (0.9, 0.999), "fused": None, "params": [0, 1]}],
        "size": torch.Size([2, 3]),
        "dtype": torch.bfloat16,
        "device": torch.device("cpu"),
        "ordered": [collections.OrderedDict(a=1)],
        "counts": [collections.defaultdict(list, {"x": [1]})],
        "when": datetime.datetime(2026, 11, 27, 12, 0),
        "tags": {"a", "b"},
        "z": complex(1, 2),
        "span": range(0, 10**12, 7),  # a range is a value (only no argument of a call)
        "queue": collections.deque([1, 2], maxlen=5),
        "seen": [collections.Counter("abca")],
        "frozen": frozenset({1}),
        "raw": [bytearray(b"xy"), b"z"],
        "utc": datetime.UTC,
    }
    ckpt.save(tmp_path, {"w": torch.ones(2), "v": values}, step=1, blocking=True)
    target: dict[str, Any] = {"w": torch.zeros(2), "v": {k: None for k in values}}
    ckpt.load(tmp_path, target)
    for k, v in values.items():
        got = target["v"][k]
        if k == "np_rng":
            assert got[0] == v[0] and numpy.array_equal(got[1], v[1]) and got[2:] == v[2:]
        elif k == "array":
            assert numpy.array_equal(got, v) and got.dtype == v.dtype
        else:
            assert got == v and type(got) is type(v), k


def test_two_threads_saving_at_once_take_turns_and_never_share_a_host_buffer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trainer's main loop and a thread of its own (a signal handler's, a watchdog's) save at the same moment,
    with keep_buffer: one save in flight per process holds across threads (the second waits for the first, whose
    handle stays the one a later save checks for an error), and both checkpoints are whole."""
    from haiscale.checkpoint import saver

    ckpt.save(tmp_path, {"w": torch.zeros(1 << 14)}, step=1, keep_buffer=True, blocking=True)  # leaves a spare
    inside, most = [0], [0]
    lock = threading.Lock()
    take_snapshot = saver.take_snapshot

    def slow_snapshot(*args: Any, **kw: Any) -> Any:
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.3)  # both threads are here at once, unless save() lets one in at a time
        try:
            return take_snapshot(*args, **kw)
        finally:
            with lock:
                inside[0] -= 1

    monkeypatch.setattr(saver, "take_snapshot", slow_snapshot)
    errors: list[BaseException] = []

    def saving(step: int) -> None:
        try:
            ckpt.save(tmp_path, {"w": torch.full((1 << 14,), float(step))}, step=step, keep_buffer=True).wait()
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=saving, args=(step,)) for step in (2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    ckpt.wait_for_saves()
    assert not errors, errors
    assert most[0] == 1
    for step in (2, 3):
        target = {"w": torch.zeros(1 << 14)}
        assert ckpt.load(tmp_path, target, step=step).step == step and bool((target["w"] == step).all())


# ---- a manifest that is no regular file ----

LOAD_IN_A_BOUNDED_PROCESS = """
import resource, sys, torch
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))  # before a fix, /dev/zero filled memory up to here
from haiscale import checkpoint as ckpt
try:
    ckpt.load(sys.argv[1], {"a": torch.zeros(4), "b": torch.zeros(8), "s": 0})
except BaseException as err:
    print(type(err).__name__, err)
"""


@pytest.mark.parametrize(
    ("plant", "words"),
    [
        (lambda m: m.symlink_to("/dev/zero"), r"^ValueError .*MANIFEST\.json: not a regular file"),
        (os.mkfifo, r"^ValueError .*MANIFEST\.json: not a regular file"),
        (lambda m: m.symlink_to("/dev/urandom"), r"^ValueError .*MANIFEST\.json: not a regular file"),
    ],
    ids=["dev-zero", "fifo", "dev-urandom"],
)
def test_a_manifest_that_is_a_device_or_a_fifo_is_refused_without_blocking_or_filling_memory(
    tmp_path: Path, plant: Callable[[Path], None], words: str
) -> None:
    """A checkpoint folder of someone else's (a shared root, a copied tree) whose MANIFEST.json is a link to
    /dev/zero made a load read until memory ran out; a FIFO made it wait for a writer forever. A manifest is read
    only from a regular file, and never more than a manifest may be."""
    folder = _saved(tmp_path)
    (folder / ckpt.MANIFEST).unlink()
    plant(folder / ckpt.MANIFEST)
    run = _load_in_a_bounded_process(tmp_path)
    assert re.match(words, run.stdout), (run.stdout, run.stderr[-2000:])


def _load_in_a_bounded_process(root: Path) -> subprocess.CompletedProcess[str]:
    """``LOAD_IN_A_BOUNDED_PROCESS`` of ``root``; fails the test if it runs for a minute."""
    try:
        return subprocess.run(
            [sys.executable, "-c", LOAD_IN_A_BOUNDED_PROCESS, str(root)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the load ran for a minute")


def test_a_manifest_that_grows_after_its_size_was_looked_at_is_read_no_further_than_a_manifest_may_be(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read in pieces (here of 7 bytes), so a read allocates what the file holds, not the limit."""
    monkeypatch.setattr(storage, "READ_SMALL_PIECE_BYTES", 7)
    local = storage.LocalStorage()
    (tmp_path / "m").write_bytes(b"x" * 100)
    assert local.read_small(str(tmp_path / "m"), 100) == b"x" * 100
    with pytest.raises(ValueError, match=r"/m: more than 99 bytes"):
        local.read_small(str(tmp_path / "m"), 99)


# ---- names in a checkpoint root that are not the saver's ----


def test_folders_and_leases_of_names_no_save_makes_are_not_checkpoints_and_break_nothing(tmp_path: Path) -> None:
    """A root others write to (or one tidied by hand) holds ``step-²`` (digits int() refuses: latest_step, load and
    every save's prune raised ValueError, a committed save reported as failed and not reported to the scheduler),
    ``step-7`` (a copy of a checkpoint: latest_step said 7, load read another), and a lease named with such digits."""
    ckpt.save(tmp_path, {"w": torch.full((4,), 3.0)}, step=3, blocking=True)
    shutil.copytree(tmp_path / "step-000000003", tmp_path / "step-7")
    shutil.copytree(tmp_path / "step-000000003", tmp_path / "step-0000000008")  # 8 in ten digits
    (tmp_path / "step-²").mkdir()
    (tmp_path / "step-000000003" / ".lease-load-²-1-abc-otherhost").write_bytes(b"")
    assert ckpt.latest_step(tmp_path) == 3
    target = {"w": torch.zeros(4)}
    assert ckpt.load(tmp_path, target).url == str(tmp_path / "step-000000003") and bool((target["w"] == 3.0).all())
    handle = ckpt.save(tmp_path, {"w": torch.full((4,), 4.0)}, step=4, keep=1, blocking=True)
    assert handle.wait() == str(tmp_path / "step-000000004" / ckpt.MANIFEST) and handle.removed_steps == [3]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-0000000008", "step-000000004", "step-7", "step-²"]
    assert ckpt.latest_step(tmp_path) == 4


def test_a_shape_of_many_huge_dimensions_is_refused_without_multiplying_it_out(tmp_path: Path) -> None:
    """300,000 dimensions of 2**62 (6 MB of manifest) multiplied out make a number of 18 million bits, each
    multiplication slower than the last: the load's check took over an hour; it stops once past what a tensor holds, and
    the error quotes the shape's start, not its 6.3 MB."""
    folder = _saved(tmp_path)
    doc = json.loads((folder / ckpt.MANIFEST).read_text())
    _entry(doc, "b")["shape"] = [2**62] * 300_000
    (folder / ckpt.MANIFEST).write_text(json.dumps(doc))
    run = _load_in_a_bounded_process(tmp_path)
    assert re.search(
        r"\(b\): shape \[4611686018427387904, .{50,100}\.\.\. \(6300000 characters\) has more elements than a "
        r"tensor can hold\)$",
        run.stdout.rstrip(),
    ), (run.stdout[:2000], run.stderr[-2000:])
    assert len(run.stdout) < 1000  # (a message naming every dimension: 6.3 MB)
