"""Saving: a host snapshot taken in the caller's thread, then the write, the commit and the pruning.

Layout of a checkpoint root (every rank writes its own files; rank 0 commits)::

    ROOT/step-000000100/rank-00000.<save id>.bin    rank 0's bytes: pickled values, then its tensors
    ROOT/step-000000100/rank-00001.<save id>.bin    rank 1's bytes: its tensors
    ROOT/step-000000100/part-00001.<save id>.json   rank 1's entries (written after its .bin is durable)
    ROOT/step-000000100/MANIFEST.json               rank 0's entries and the other ranks' parts: the commit

A checkpoint counts only once its MANIFEST.json is there, written under a temporary name and renamed. Rank 0
writes it when its own data file is durable and every other rank's part of this save (same save id) is there
(rank 0 merges its own entries from memory: it writes no part, a save on one rank none at all), then removes
checkpoints beyond the newest ``keep`` (each one's manifest first, so a half-removed checkpoint never counts)
and leftovers of saves that never committed. A process killed at any moment leaves every earlier committed
checkpoint whole.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import torch

from haiscale.checkpoint import leases
from haiscale.checkpoint.manifest import (
    CHECKSUMS,
    FORMAT,
    MANIFEST,
    MAX_MANIFEST_BYTES,
    Blob,
    Key,
    Manifest,
    Shard,
    TensorEntry,
    checksum,
    dtype_name,
    leaves,
)
from haiscale.checkpoint.storage import Location

logger = logging.getLogger(__name__)

STEP_PREFIX = "step-"
PART_WAIT_POLL_S = 0.05


class CheckpointError(RuntimeError):
    """A save that could not be committed (a rank's part never came, storage failed)."""


def step_folder(step: int) -> str:
    """The folder name of checkpoint ``step``: ``step-`` and 9 digits, so names sort as steps do."""
    return f"{STEP_PREFIX}{step:09d}"


def folder_step(name: str) -> int | None:
    """The step of a checkpoint folder's name (``step_folder``'s inverse); None for any other name.

    Only the name ``step_folder`` gives counts: ``step-7`` (a folder copied by hand) would be found as step 7 and then
    looked for as ``step-000000007``, and ``str.isdigit`` passes digits ``int`` refuses (``step-²``).
    """
    rest = name.removeprefix(STEP_PREFIX)
    if not (name.startswith(STEP_PREFIX) and rest.isascii() and rest.isdigit()):
        return None
    step = int(rest)
    return step if step_folder(step) == name else None


CHECKSUM = CHECKSUMS[FORMAT]  # what a save checksums with
ALIGN = 64  # bytes: every tensor starts at a multiple, so a view of the buffer can have any dtype


@dataclass
class HostTensor:
    """A tensor copied to host memory at snapshot time: ``file_offset`` into the rank's buffer and file."""

    name: str
    keys: tuple[Key, ...]
    data: torch.Tensor  # a view of the snapshot's buffer
    shape: tuple[int, ...]
    offset: int
    file_offset: int
    checksum: int  # CRC-32C of its bytes, taken right after the copy (while they are in cache)


@dataclass
class Snapshot:
    """One rank's bytes in one contiguous host buffer (its data file's image: pickled values, then tensors)."""

    step: int
    rank: int
    world_size: int
    save_id: str
    taken_at: float = 0.0  # time.time() when the copy began: the state is as of then
    buffer: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.uint8))
    allocation: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.uint8))  # buffer's memory
    tensors: list[HostTensor] = field(default_factory=list)
    objects: Blob | None = None  # rank 0's pickled values (at the start of its file)


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def take_snapshot(
    state_dict: dict[Any, Any],
    step: int,
    rank: int,
    world_size: int,
    save_id: str,
    spare: torch.Tensor | None = None,
) -> Snapshot:
    """Everything this rank writes, copied now: after it returns the caller may change its tensors.

    Plain tensors and other values are rank 0's to write; every rank writes its ``Shard``s. ``spare``: an earlier
    snapshot's buffer, used when the snapshot fits (its pages are touched already: no page faults). The checksums are
    taken here too, each right after its tensor's copy, so the background write (which runs beside the training
    steps) only sends bytes.

    Raises:
        ValueError: two leaves have one name (``{"a.b": x, "a": {"b": y}}``): a load could not tell them apart; a
            tensor has the empty name (``{"": x}``).
    """
    snap = Snapshot(step, rank, world_size, save_id, taken_at=time.time())
    objects: dict[str, tuple[tuple[Key, ...], Any]] = {}
    chosen: list[tuple[str, tuple[Key, ...], torch.Tensor, tuple[int, ...], int]] = []
    named: dict[str, tuple[Key, ...]] = {}
    for name, keys, _, value in leaves(state_dict):
        other = named.setdefault(name, keys)
        if other != keys:  # a load finds leaves by name: one of them would be lost
            both = f"keys {list(other)} and {list(keys)}"
            raise ValueError(f"{name}: two leaves of the state dict have this name: {both}")
        if not name and isinstance(value, torch.Tensor | Shard):  # (the manifest names every tensor)
            raise ValueError("a tensor under the key '' at the top of the state dict has no name a manifest can hold")
        if isinstance(value, Shard):
            chosen.append((name, keys, value.local, value.global_shape, value.offset))
        elif rank != 0:
            continue
        elif isinstance(value, torch.Tensor):
            chosen.append((name, keys, value, tuple(value.shape), 0))
        else:
            objects[name] = (keys, value)
    blob = pickle.dumps(objects, protocol=pickle.HIGHEST_PROTOCOL) if rank == 0 else b""
    pos = _aligned(len(blob))
    offsets = []
    for _, _, t, _, _ in chosen:
        offsets.append(pos)
        pos = _aligned(pos + t.numel() * t.element_size())
    snap.allocation = spare if spare is not None and pos <= spare.numel() else torch.empty(pos, dtype=torch.uint8)
    snap.buffer = snap.allocation[:pos]
    image = _bytes(snap.buffer)
    if rank == 0:
        snap.buffer[: len(blob)].numpy()[:] = memoryview(blob)
        snap.objects = Blob(_data_name(snap), 0, len(blob), checksum(CHECKSUM, blob), tuple(objects))
    for (name, keys, t, shape, offset), at in zip(chosen, offsets, strict=True):
        length = t.numel() * t.element_size()
        view = snap.buffer[at : at + length].view(t.dtype).view(t.shape)
        view.copy_(t.detach())
        snap.tensors.append(
            HostTensor(name, keys, view, shape, offset, at, checksum(CHECKSUM, image[at : at + length]))
        )
    return snap


def _data_name(snap: Snapshot) -> str:
    return f"rank-{snap.rank:05d}.{snap.save_id}.bin"


def _bytes(buffer: torch.Tensor) -> memoryview:
    array: Any = buffer.numpy()  # shares the snapshot's memory: no copy
    return memoryview(array)


def write_rank(loc: Location, snap: Snapshot) -> Manifest:
    """This rank's data file (the snapshot's buffer), made durable, then (ranks other than 0) its part of the manifest.

    Returns:
        The part: this rank's entries.
    """
    folder = step_folder(snap.step)
    loc.storage.makedirs(loc.join(folder))
    data_name = _data_name(snap)
    image = _bytes(snap.buffer)
    entries = [
        TensorEntry(
            name=t.name,
            keys=t.keys,
            shard=snap.rank,
            dtype=dtype_name(t.data.dtype),
            shape=t.shape,
            offset=t.offset,
            numel=t.data.numel(),
            file=data_name,
            file_offset=t.file_offset,
            length=t.data.numel() * t.data.element_size(),
            checksum=t.checksum,
        )
        for t in snap.tensors
    ]
    loc.storage.write_file(loc.join(folder, data_name), [(0, image)] if len(image) else [])
    part = Manifest(snap.step, snap.world_size, tuple(entries), snap.objects)
    if snap.rank != 0:  # rank 0 commits from the part in its memory
        loc.storage.write_atomic(loc.join(folder, f"part-{snap.rank:05d}.{snap.save_id}.json"), part.to_json())
    return part


def commit(loc: Location, snap: Snapshot, own: Manifest, part_timeout_s: float, lease: str | None = None) -> str:
    """Rank 0: wait for the other ranks' parts of this save, merge them after ``own``, and rename the manifest in.

    ``lease``: this save's lease on the folder (``leases.take``); gone means another process's prune removed the
    folder while it was written, and nothing is committed. Once renamed in, the manifest's data files are looked
    for once more (a prune that began before the lease was taken may have removed some): if one is gone, the
    manifest is removed again.

    Returns:
        The manifest's path in its storage.

    Raises:
        CheckpointError: some rank's part did not come within ``part_timeout_s``, the parts do not make a manifest
            that loads (the ranks disagree on a tensor's dtype or shape), or the folder was removed.
    """
    folder = loc.join(step_folder(snap.step))
    wanted = {f"part-{r:05d}.{snap.save_id}.json" for r in range(1, snap.world_size)}
    deadline = time.monotonic() + part_timeout_s
    while wanted:
        missing = wanted - set(loc.storage.listdir(folder))
        if not missing:
            break
        if time.monotonic() > deadline:
            ranks = sorted(int(m[5:10]) for m in missing)
            raise CheckpointError(
                f"step {snap.step}: ranks {ranks} did not write their part within {part_timeout_s:g} s; not committed"
            )
        time.sleep(PART_WAIT_POLL_S)
    others = [
        Manifest.from_json(loc.storage.read_small(loc.join(step_folder(snap.step), n), MAX_MANIFEST_BYTES), n)
        for n in sorted(wanted)
    ]
    merged = Manifest(snap.step, snap.world_size, tuple(e for p in [own, *others] for e in p.tensors), own.objects)
    path = loc.join(step_folder(snap.step), MANIFEST)
    removed = CheckpointError(f"step {snap.step}: another save's prune removed its folder while it was written")
    if lease is not None and not loc.storage.exists(lease):
        raise removed
    doc = merged.to_json()
    try:  # what every load checks first: ranks that disagree (one tensor, two dtypes) must not commit it
        Manifest.from_json(doc, "the merged manifest")
    except ValueError as err:
        raise CheckpointError(f"step {snap.step}: not committed, {err}") from None
    loc.storage.write_atomic(path, doc)
    files = sorted({e.file for e in merged.tensors} | ({merged.objects.file} if merged.objects else set()))
    if None in loc.storage.sizes([loc.join(step_folder(snap.step), f) for f in files]):
        with contextlib.suppress(OSError):
            loc.storage.remove(path)
        raise removed
    return path


def committed_steps(loc: Location) -> list[int]:
    """Steps of the committed checkpoints under the root, oldest first."""
    steps = []
    for name in loc.storage.listdir(loc.path):
        step = folder_step(name)
        if step is not None and loc.storage.exists(loc.join(name, MANIFEST)):
            steps.append(step)
    return sorted(steps)


def prune(loc: Location, newest: int, keep: int | None) -> list[int]:
    """Remove committed checkpoints beyond the newest ``keep`` and uncommitted folders older than ``newest``.

    ``newest``: the step just committed, which stays whatever its place: a run rolled back to an earlier step (after a
    loss spike, or a checkpoint that would not load) saves steps below the ones already there.

    A folder with a live lease (a save still writing it, a load reading it: see ``leases``) stays, for a later
    prune to remove; so does one that cannot be removed (logged: the new checkpoint is committed whatever happens
    here).

    Returns:
        The steps removed.
    """
    committed = committed_steps(loc)
    doomed = set(committed[:-keep] if keep else []) - {newest}
    for name in loc.storage.listdir(loc.path):
        step = folder_step(name)
        if step is not None and step < newest and step not in committed:
            doomed.add(step)  # a save that never committed (killed, or a rank failed), or one still writing
    removed = []
    for step in sorted(doomed):
        try:
            if _remove_unleased(loc, step_folder(step)):
                removed.append(step)
        except OSError as err:  # the new checkpoint is committed: a later save tries again
            logger.warning("could not remove checkpoint %s: %s", loc.url(step_folder(step)), err)
    return removed


def _remove_unleased(loc: Location, folder: str) -> bool:
    """Remove checkpoint ``folder`` unless a live lease is on it; whether it was removed.

    A committed one's manifest is moved aside first (uncounted from there on, whatever happens next), then the leases
    are looked at: a load takes its lease before it reads the manifest, so one that may be reading is seen, and the
    manifest goes back.
    """
    if leases.live(loc, folder):
        return False
    manifest = loc.join(folder, MANIFEST)
    if loc.storage.exists(manifest):
        parked = loc.join(folder, f"{MANIFEST}.pruned-{uuid.uuid4().hex}")
        try:
            loc.storage.rename(manifest, parked)
        except FileNotFoundError:
            pass  # another prune moved it first
        else:
            if leases.live(loc, folder):
                loc.storage.rename(parked, manifest)
                return False
    loc.storage.remove_tree(loc.join(folder))
    return True


def report(loc: Location, manifest_path: str, step: int, taken_at: float) -> bool:
    """Tell the scheduler about a committed 3FS checkpoint when running as a task; whether it was told.

    ``taken_at`` (the snapshot's time) lets a suspend tell the checkpoint it asked for from a save begun before.
    """
    from hfai import client, runcontrol

    if not loc.in_3fs or runcontrol.RunControl.from_env() is None:
        return False
    client.report_checkpoint(manifest_path, step, taken_at=taken_at)
    return True
