"""Loading: check everything against the manifest before one byte of the caller's tensors changes.

Match the state dict against the manifest, read every needed slice in batches, check the crc32s, and only then
copy into the caller's tensors (a mismatch or a bad checksum changes nothing).
"""

from __future__ import annotations

import pickle
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy
import torch

from haiscale.checkpoint.manifest import (
    MANIFEST,
    Key,
    Manifest,
    Shard,
    TensorEntry,
    dtype_name,
    dtype_of,
    leaves,
    put,
)
from haiscale.checkpoint.saver import ALIGN, committed_steps, step_folder
from haiscale.checkpoint.storage import Bytes, Location

READ_RANGE_BYTES = 64 << 20  # neighbouring slices are read together up to this size


class CheckpointMismatch(ValueError):
    """The state dict does not match the checkpoint; the message names the first tensor or value that differs."""


class CorruptCheckpoint(ValueError):
    """Bytes read from a checkpoint do not match the checksum its manifest recorded."""


@dataclass(frozen=True)
class Loaded:
    """What ``load`` read: the checkpoint's step and where it is."""

    step: int
    url: str
    world_size: int


@dataclass
class _Want:
    """Elements [start, stop) of tensor ``name`` go to ``target`` (a flat view of the caller's tensor)."""

    name: str
    start: int
    stop: int
    target: torch.Tensor


def find_checkpoint(loc: Location, step: int | None) -> str | None:
    """The folder name of the checkpoint to load: ``step``'s, or the newest committed one; None if none."""
    if loc.storage.exists(loc.join(MANIFEST)):
        return ""  # the path is a checkpoint folder itself
    steps = committed_steps(loc)
    if step is None:
        return step_folder(steps[-1]) if steps else None
    return step_folder(step) if step in steps else None


def _describe(dtype: str, shape: tuple[int, ...]) -> str:
    return f"{dtype} {list(shape)}"


def _mismatch(name: str, saved: str, given: str) -> CheckpointMismatch:
    return CheckpointMismatch(f"{name}: the checkpoint has {saved}, the state dict {given}")


def _plan(
    manifest: Manifest, objects: dict[str, tuple[tuple[Key, ...], Any]], state: dict[Any, Any], allocate_missing: bool
) -> tuple[list[_Want], list[tuple[tuple[Key, ...], Any]]]:
    """What to read into which tensor and which values to set, checking everything first.

    Raises:
        CheckpointMismatch: the first leaf (state dict order, then the checkpoint's) that does not match.
    """
    saved: dict[str, TensorEntry] = {}
    for e in manifest.tensors:
        saved.setdefault(e.name, e)
    wants: list[_Want] = []
    sets: list[tuple[tuple[Key, ...], Any]] = []
    seen: set[str] = set()
    for name, _, _, value in leaves(state):
        seen.add(name)
        entry = saved.get(name)
        if isinstance(value, torch.Tensor | Shard):
            local = value.local if isinstance(value, Shard) else value
            shape = value.global_shape if isinstance(value, Shard) else tuple(value.shape)
            given = _describe(dtype_name(local.dtype), shape)
            if entry is None:
                raise _mismatch(name, "no such tensor" + (" (a value)" if name in objects else ""), given)
            if entry.dtype != dtype_name(local.dtype) or entry.shape != shape:
                raise _mismatch(name, _describe(entry.dtype, entry.shape), given)
            start = value.offset if isinstance(value, Shard) else 0
            wants.append(_Want(name, start, start + local.numel(), local))
        elif name in objects:
            continue
        else:
            found = _describe(entry.dtype, entry.shape) if entry else "no such value"
            raise _mismatch(name, found, f"a value of type {type(value).__name__}")
    for name, entry in saved.items():
        if name in seen:
            continue
        if not allocate_missing:
            raise _mismatch(name, _describe(entry.dtype, entry.shape), "no such tensor")
        t = torch.empty(entry.shape, dtype=dtype_of(entry.dtype))
        sets.append((entry.keys, t))
        wants.append(_Want(name, 0, t.numel(), t))
    sets.extend(v for n, v in objects.items())
    return wants, sets


def _sources(manifest: Manifest, want: _Want) -> Iterator[TensorEntry]:
    """The saved slices that cover ``want``'s range.

    Raises:
        CheckpointMismatch: part of the range was saved by no rank.
    """
    covering = sorted(
        (
            e
            for e in manifest.tensors
            if e.name == want.name and e.offset < want.stop and e.offset + e.numel > want.start
        ),
        key=lambda e: e.offset,
    )
    pos = want.start
    for e in covering:
        if e.offset > pos:
            break
        pos = max(pos, e.offset + e.numel)
        yield e
    if pos < want.stop:
        raise CheckpointMismatch(f"{want.name}: elements {pos}..{want.stop} were saved by no rank")


def _checked(data: Bytes, length: int, crc: int, where: str) -> memoryview:
    if len(data) != length or zlib.crc32(data) != crc:
        raise CorruptCheckpoint(f"{where}: {len(data)} bytes read, checksum does not match the manifest")
    return memoryview(data)


Slot = tuple[str, int, int]  # (file, file offset, length) of a saved slice


def _read_slices(loc: Location, folder: str, entries: list[TensorEntry]) -> dict[Slot, memoryview]:
    """Every slice's bytes, checked: neighbours in a file are read as one range (up to ``READ_RANGE_BYTES``)."""
    ranges: list[tuple[str, int, int, list[TensorEntry]]] = []
    for e in sorted(entries, key=lambda e: (e.file, e.file_offset)):
        last = ranges[-1] if ranges else None
        if (
            last
            and last[0] == e.file
            and 0 <= e.file_offset - (last[1] + last[2]) <= ALIGN
            and e.file_offset + e.length - last[1] <= READ_RANGE_BYTES
        ):
            ranges[-1] = (last[0], last[1], e.file_offset + e.length - last[1], [*last[3], e])
        else:
            ranges.append((e.file, e.file_offset, e.length, [e]))
    read = loc.storage.read_ranges([(loc.join(folder, f), start, n) for f, start, n, _ in ranges])
    out: dict[Slot, memoryview] = {}
    for (_, start, _, members), raw in zip(ranges, read, strict=True):
        view = memoryview(raw)
        for e in members:
            part = view[e.file_offset - start : e.file_offset - start + e.length]
            out[(e.file, e.file_offset, e.length)] = _checked(part, e.length, e.crc32, f"{e.file} ({e.name})")
    return out


def _copy(w: _Want, sources: list[TensorEntry], data: dict[Slot, memoryview]) -> None:
    """Copy the saved elements of ``w``'s range into its tensor (bytes to bytes, through numpy views)."""
    size = w.target.element_size()
    contiguous = w.target.is_contiguous()
    out = w.target if contiguous else torch.empty(w.target.shape, dtype=w.target.dtype)
    if not out.numel():
        return
    dst: Any = out.view(-1).view(torch.uint8).numpy()
    for e in sources:
        lo, hi = max(w.start, e.offset), min(w.stop, e.offset + e.numel)
        src = numpy.frombuffer(data[(e.file, e.file_offset, e.length)], dtype=numpy.uint8)
        dst[(lo - w.start) * size : (hi - w.start) * size] = src[(lo - e.offset) * size : (hi - e.offset) * size]
    if not contiguous:
        w.target.copy_(out)


def read_into(loc: Location, folder: str, manifest: Manifest, state: dict[Any, Any], allocate_missing: bool) -> None:
    """Fill ``state`` from the checkpoint in ``folder`` (see the module docstring)."""
    objects: dict[str, tuple[tuple[Key, ...], Any]] = {}
    if manifest.objects is not None:
        b = manifest.objects
        raw = loc.storage.read_ranges([(loc.join(folder, b.file), b.file_offset, b.length)])[0]
        objects = pickle.loads(_checked(raw, b.length, b.crc32, f"{b.file} (values)"))
    wants, sets = _plan(manifest, objects, state, allocate_missing)
    plan = [(w, list(_sources(manifest, w))) for w in wants]
    entries = list({(e.file, e.file_offset, e.length): e for _, es in plan for e in es}.values())
    data = _read_slices(loc, folder, entries)
    for w, sources in plan:  # every check passed: now change the caller's state
        _copy(w, sources, data)
    for keys, value in sets:
        put(state, keys, value)


def read_manifest(loc: Location, folder: str) -> Manifest:
    """The manifest of checkpoint ``folder`` under ``loc``.

    Raises:
        ValueError: the file is not a manifest of this format (names the file).
    """
    path = loc.join(folder, MANIFEST)
    return Manifest.from_json(loc.storage.read_small(path), path)
