"""What a checkpoint holds and how a state dict maps onto it.

A state dict is a tree of dicts (string or integer keys) whose leaves are tensors, ``Shard``s or other
picklable values; a leaf's name is its keys joined by dots (``optim.state.0.exp_avg``).

- A **tensor** is the same on every rank (replicated, as DDP keeps parameters): rank 0 writes it.
- A **Shard** is one rank's flat slice of a larger tensor: ``local`` holds elements ``[offset, offset +
  local.numel())`` of the global tensor flattened in row-major order (ZeRO's flat partition; a split along
  dim 0 of a contiguous tensor is such a slice too). Every rank writes its own slices; a loader on any number
  of ranks asks for whatever slices it holds, and reads them from whichever saved slices overlap.
- Any **other value** (step, RNG states, data position, optimizer hyper-parameters) is pickled: rank 0's
  values are the checkpoint's.

The manifest records, for each saved slice, (name, shard, dtype, shape, offset, numel, file, file offset,
length, crc32), so a loader finds any tensor without reading anything else.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import asdict, dataclass
from typing import Any

import torch

FORMAT = "haiscale-checkpoint/1"
MANIFEST = "MANIFEST.json"


@dataclass
class Shard:
    """One rank's flat slice of a global tensor (see the module docstring)."""

    local: torch.Tensor
    global_shape: tuple[int, ...]
    offset: int

    def __post_init__(self) -> None:
        self.global_shape = tuple(int(d) for d in self.global_shape)
        numel = _numel(self.global_shape)
        if self.offset < 0 or self.offset + self.local.numel() > numel:
            raise ValueError(
                f"a shard of {self.local.numel()} elements at offset {self.offset} does not fit a tensor of "
                f"shape {list(self.global_shape)} ({numel} elements)"
            )


@dataclass(frozen=True)
class TensorEntry:
    """One saved slice of a tensor and where its bytes are.

    ``numel`` elements from ``offset`` of tensor ``name`` (global ``shape``), stored as ``length`` bytes at
    ``file_offset`` of ``file``.
    """

    name: str
    keys: tuple[str | int, ...]
    shard: int
    dtype: str
    shape: tuple[int, ...]
    offset: int
    numel: int
    file: str
    file_offset: int
    length: int
    crc32: int


@dataclass(frozen=True)
class Blob:
    """The pickled non-tensor values: ``length`` bytes at ``file_offset`` of ``file``."""

    file: str
    file_offset: int
    length: int
    crc32: int


@dataclass(frozen=True)
class Manifest:
    """A checkpoint's table of contents: every saved slice and the pickled values, and where their bytes are.

    Each rank writes the part for its own files; rank 0 merges the parts into ``MANIFEST``, written last and
    atomically: a checkpoint counts only once that file is there.
    """

    step: int
    world_size: int
    tensors: tuple[TensorEntry, ...]
    objects: Blob | None

    def to_json(self) -> bytes:
        """The manifest as JSON (with the format version ``from_json`` checks)."""
        doc = {
            "format": FORMAT,
            "step": self.step,
            "world_size": self.world_size,
            "tensors": [asdict(t) for t in self.tensors],
            "objects": asdict(self.objects) if self.objects else None,
        }
        return json.dumps(doc, indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> Manifest:
        """Parse a manifest file's bytes; ``where`` names the file in errors.

        Raises:
            ValueError: not JSON, another format version, or a field missing or of the wrong type.
        """
        try:
            doc = json.loads(data)
            if doc.get("format") != FORMAT:
                raise ValueError(f"format {doc.get('format')!r}, expected {FORMAT!r}")
            tensors = tuple(
                TensorEntry(**{**t, "shape": tuple(t["shape"]), "keys": tuple(t["keys"])}) for t in doc["tensors"]
            )
            objects = Blob(**doc["objects"]) if doc["objects"] else None
            return cls(int(doc["step"]), int(doc["world_size"]), tensors, objects)
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{where}: not a checkpoint manifest ({err})") from None


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def numel(shape: tuple[int, ...]) -> int:
    """Elements of a tensor of ``shape`` (1 for a scalar's ``()``)."""
    return _numel(shape)


def dtype_name(dtype: torch.dtype) -> str:
    """How the manifest writes a torch dtype: its name without ``torch.`` (``"bfloat16"``)."""
    return str(dtype).removeprefix("torch.")


def dtype_of(name: str) -> torch.dtype:
    """The torch dtype a manifest names (``dtype_name``'s inverse).

    Raises:
        ValueError: torch has no such dtype.
    """
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in the manifest")
    return dtype


Key = str | int
Leaf = tuple[str, tuple[Key, ...], MutableMapping[Any, Any], Any]


def leaves(state: Mapping[Any, Any], keys: tuple[Key, ...] = ()) -> Iterator[Leaf]:
    """(name, keys from the root, the dict holding it, its value) of every leaf, depth first in insertion order.

    Raises:
        TypeError: a key that is not a string or integer, or a tensor inside a list or tuple.
    """
    for key, value in state.items():
        if isinstance(key, bool) or not isinstance(key, str | int):
            raise TypeError(f"state dict keys are strings or integers, not {type(key).__name__} (under {keys!r})")
        path = (*keys, key)
        if isinstance(value, Mapping):
            yield from leaves(value, path)
            continue
        name = _leaf_name(path)
        if isinstance(value, list | tuple) and _has_tensor(value):
            raise TypeError(f"{name}: tensors inside a list or tuple are not supported (use a dict)")
        yield name, path, state, value  # type: ignore[misc]


def _leaf_name(keys: tuple[Key, ...]) -> str:
    return ".".join(str(k) for k in keys)


def put(state: MutableMapping[Any, Any], keys: tuple[Key, ...], value: Any) -> None:
    """Set ``state[k0][k1]...[kn] = value``, making the missing dicts on the way."""
    for key in keys[:-1]:
        state = state.setdefault(key, {})
    state[keys[-1]] = value


def _has_tensor(value: Any) -> bool:
    if isinstance(value, torch.Tensor | Shard):
        return True
    if isinstance(value, list | tuple):
        return any(_has_tensor(v) for v in value)
    if isinstance(value, Mapping):
        return any(_has_tensor(v) for v in value.values())
    return False
