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
length, checksum), so a loader finds any tensor without reading anything else. Format 2 checksums with CRC-32C
(the ``crc32c`` package, hardware-accelerated: about 3x zlib's crc32 here); format 1 manifests (zlib's crc32)
still load.
"""

from __future__ import annotations

import functools
import json
import operator
import zlib
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import asdict, dataclass, fields
from typing import Any

import crc32c
import torch

FORMAT = "haiscale-checkpoint/2"
MANIFEST = "MANIFEST.json"
# bytes a manifest file may have (about 3 million saved slices): a larger one is refused before it is read
MAX_MANIFEST_BYTES = 1 << 30
CHECKSUMS = {"haiscale-checkpoint/1": "crc32", FORMAT: "crc32c"}  # each format's checksum: its JSON field too


def checksum(kind: str, data: bytes | bytearray | memoryview) -> int:
    """The checksum ``kind`` (``"crc32c"``, or format 1's ``"crc32"``) of ``data``; both release the GIL."""
    return int(crc32c.crc32c(data)) if kind == "crc32c" else zlib.crc32(data)


@dataclass
class Shard:
    """One rank's flat slice of a global tensor (see the module docstring)."""

    local: torch.Tensor
    global_shape: tuple[int, ...]
    offset: int

    def __post_init__(self) -> None:
        """Checks and normalizes the fields now: a wrong one would be found only by the background write.

        Integers of any kind (numpy's, a 0-d integer tensor) become ``int``; a float is refused, not rounded.
        """
        if not isinstance(self.local, torch.Tensor):
            raise TypeError(f"a Shard's local part is a tensor, not {type(self.local).__name__}")
        try:
            self.global_shape = tuple(operator.index(d) for d in self.global_shape)
            self.offset = operator.index(self.offset)
        except TypeError as err:
            raise TypeError(f"a Shard's global_shape and offset are integers: {err}") from None
        if any(d < 0 for d in self.global_shape):
            raise ValueError(f"a Shard's global_shape {list(self.global_shape)} has a negative dimension")
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
    checksum: int  # of the ``length`` bytes, of the manifest's ``checksum_kind``


@dataclass(frozen=True)
class Blob:
    """The pickled non-tensor values: ``length`` bytes at ``file_offset`` of ``file``.

    ``names``: the values' names (format 2), so a load matches the state dict before reading them, and reads them
    before the tensors; None in a format 1 manifest (a load reads them before it matches the state dict).
    """

    file: str
    file_offset: int
    length: int
    checksum: int
    names: tuple[str, ...] | None = None


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
    checksum_kind: str = CHECKSUMS[FORMAT]  # "crc32" in a format 1 manifest

    def to_json(self) -> bytes:
        """The manifest as JSON in the current ``FORMAT`` (checksums under the field named by their kind)."""
        if self.checksum_kind != CHECKSUMS[FORMAT]:
            raise ValueError(f"format {FORMAT!r} checksums with {CHECKSUMS[FORMAT]}, not {self.checksum_kind}")
        doc = {
            "format": FORMAT,
            "step": self.step,
            "world_size": self.world_size,
            "tensors": [_renamed(asdict(t), "checksum", self.checksum_kind) for t in self.tensors],
            "objects": _renamed(asdict(self.objects), "checksum", self.checksum_kind) if self.objects else None,
        }
        return json.dumps(doc, indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> Manifest:
        """Parse a manifest file's bytes (any format of ``CHECKSUMS``); ``where`` names the file in errors.

        Every field is checked before anything trusts it (a manifest may be crafted by hand): types and ranges,
        file names that stay in the checkpoint's folder, lengths that are the elements' bytes, slices inside their
        tensor's shape, and one dtype, shape and keys per tensor name.

        Raises:
            ValueError: not JSON, an unknown format version, or a field missing, of the wrong type or out of
                range (named with its entry).
        """
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict):
                raise ValueError(f"a JSON {type(doc).__name__.replace('dict', 'object')}, not an object")
            kind = CHECKSUMS.get(doc.get("format"))  # type: ignore[arg-type]
            if kind is None:
                raise ValueError(f"format {_short(doc.get('format'))}, expected one of {sorted(CHECKSUMS)}")
            step, world_size = _integer("step", doc["step"]), _integer("world_size", doc["world_size"], 1)
            if not isinstance(doc["tensors"], list):
                raise ValueError("tensors is not a list")
            files_ok: set[str] = set()
            tensors = tuple(_tensor_entry(i, t, kind, world_size, files_ok) for i, t in enumerate(doc["tensors"]))
            _check_names_agree(tensors)
            objects = _blob(doc["objects"], kind) if doc["objects"] is not None else None
            return cls(step, world_size, tensors, objects, kind)
        except (ValueError, KeyError, TypeError, RecursionError) as err:
            raise ValueError(f"{where}: not a checkpoint manifest ({err})") from None


MAX_NUMEL = 2**63 - 1  # elements a tensor can have (torch counts them in int64)
UINT32 = 2**32


def _short(value: Any, limit_chars: int = 100) -> str:
    """``repr(value)`` for a message, cut to about ``limit_chars``: a crafted manifest's fields may be megabytes."""
    text = repr(value)
    return text if len(text) <= limit_chars else f"{text[:limit_chars]}... ({len(text)} characters)"


def _integer(what: str, value: Any, least: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{what} {_short(value)} is not an integer >= {least}")
    return value


def _checksum_field(what: str, value: Any, kind: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < UINT32:
        raise ValueError(f"{what}{kind} {_short(value)} is not a 32-bit checksum")
    return value


def file_name_ok(name: Any) -> bool:
    """Whether ``name`` is a plain file name: it names a file in the checkpoint's own folder, nowhere else."""
    bad = not isinstance(name, str) or name in ("", ".", "..") or any(c in name for c in "/\\\0")
    return not bad


def _file_name(what: str, name: Any) -> str:
    if not file_name_ok(name):
        raise ValueError(f"{what}file {_short(name)} is not a name of a file in the checkpoint's folder")
    return str(name)


ENTRY_FIELDS = frozenset(f.name for f in fields(TensorEntry))  # in a file, "checksum" is named by its kind


@functools.lru_cache(maxsize=64)
def _itemsize(name: str) -> int | None:
    """Bytes per element of the dtype a manifest names; None for a name that is no dtype."""
    try:
        return int(dtype_of(name).itemsize)
    except ValueError:
        return None


def _tensor_entry(index: int, entry: Any, kind: str, world_size: int, files_ok: set[str]) -> TensorEntry:
    """Entry ``index`` of a manifest's tensors, checked (see ``Manifest.from_json``).

    The checks run as one expression over the fields (a manifest may hold millions of entries); an entry that
    fails them is checked again field by field by ``_explain_entry``, which says what is wrong.
    """
    try:
        name, keys, shape, dtype = entry["name"], entry["keys"], entry["shape"], entry["dtype"]
        offset, count, length, shard = entry["offset"], entry["numel"], entry["length"], entry["shard"]
        file, file_offset, crc = entry["file"], entry["file_offset"], entry[kind]
        itemsize = _itemsize(dtype) if type(dtype) is str else None
        ok = (
            type(entry) is dict
            and len(entry) == len(ENTRY_FIELDS)
            and type(name) is str
            and type(keys) is list
            and all(type(k) is str or type(k) is int for k in keys)
            and ".".join(map(str, keys)) == name != ""
            and type(shape) is list
            and all(type(d) is int and d >= 0 for d in shape)
            and type(offset) is int
            and type(count) is int
            and offset >= 0
            and count >= 0
            and offset + count <= _numel(tuple(shape)) <= MAX_NUMEL
            and itemsize is not None
            and type(length) is int
            and length == count * itemsize
            and type(shard) is int
            and 0 <= shard < world_size
            and _known_file(file, files_ok)
            and type(file_offset) is int
            and file_offset >= 0
            and type(crc) is int
            and 0 <= crc < UINT32
        )
    except (KeyError, TypeError):
        ok = False
    if not ok:
        _explain_entry(index, entry, kind, world_size)
        raise ValueError(f"tensors[{index}] is not a saved slice")  # (_explain_entry names the field)
    return TensorEntry(name, tuple(keys), shard, dtype, tuple(shape), offset, count, file, file_offset, length, crc)


def _known_file(name: Any, files_ok: set[str]) -> bool:
    """``file_name_ok``, remembered in ``files_ok`` (a manifest names few files, each many times)."""
    if name in files_ok:
        return True
    if not file_name_ok(name):
        return False
    files_ok.add(name)
    return True


def _explain_entry(index: int, fields: Any, kind: str, world_size: int) -> None:
    """Raise a ValueError naming the first field of entry ``index`` that is wrong (see ``_tensor_entry``)."""
    if not isinstance(fields, dict):
        raise ValueError(f"tensors[{index}] is not an object")
    unknown = sorted(set(fields) - (ENTRY_FIELDS - {"checksum"}) - {kind})
    if unknown:
        raise ValueError(f"tensors[{index}]: unknown fields {_short(unknown)}")
    name = fields.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"tensors[{index}]: name {_short(name)} is not a non-empty string")
    at = f"tensors[{index}] ({name if len(name) <= 100 else _short(name)}): "
    keys = fields["keys"]
    if (
        not isinstance(keys, list)
        or not keys
        or any(isinstance(k, bool) or not isinstance(k, str | int) for k in keys)
        or ".".join(str(k) for k in keys) != name
    ):
        raise ValueError(f"{at}keys {_short(keys)} do not make the name {_short(name)}")
    shape = fields["shape"]
    if not isinstance(shape, list) or any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in shape):
        raise ValueError(f"{at}shape {_short(shape)} is not a list of integers >= 0")
    if _numel(tuple(shape)) > MAX_NUMEL:
        raise ValueError(f"{at}shape {_short(shape)} has more elements than a tensor can hold")
    try:
        itemsize = dtype_of(fields["dtype"]).itemsize if isinstance(fields["dtype"], str) else 0
    except ValueError as err:
        raise ValueError(f"{at}{err}") from None
    if not itemsize:
        raise ValueError(f"{at}unknown dtype {_short(fields['dtype'])} in the manifest")
    offset, count = _integer(f"{at}offset", fields["offset"]), _integer(f"{at}numel", fields["numel"])
    if offset + count > _numel(tuple(shape)):
        raise ValueError(f"{at}elements {offset}..{offset + count} do not fit its shape {_short(shape)}")
    length = fields["length"]
    if length != count * itemsize or isinstance(length, bool):
        raise ValueError(
            f"{at}length {_short(length)} is not {count} elements of {fields['dtype']} ({count * itemsize} bytes)"
        )
    shard = _integer(f"{at}shard", fields["shard"])
    if shard >= world_size:
        raise ValueError(f"{at}shard {shard} is not a rank of world_size {world_size}")
    _file_name(at, fields["file"])
    _integer(f"{at}file_offset", fields["file_offset"])
    _checksum_field(at, fields[kind], kind)


def _check_names_agree(tensors: tuple[TensorEntry, ...]) -> None:
    """Every saved slice of one tensor name has that tensor's dtype, shape and keys."""
    first: dict[str, int] = {}
    for i, e in enumerate(tensors):
        j = first.setdefault(e.name, i)
        f = tensors[j]
        if (e.dtype, e.shape, e.keys) != (f.dtype, f.shape, f.keys):
            raise ValueError(
                f"tensors[{i}] ({e.name}): {e.dtype} {list(e.shape)}, but tensors[{j}] is {f.dtype} {list(f.shape)}"
                + (f" under keys {list(f.keys)}, not {list(e.keys)}" if e.keys != f.keys else "")
            )


def _blob(fields: Any, kind: str) -> Blob:
    """A manifest's ``objects`` (the pickled values), checked."""
    if not isinstance(fields, dict):
        raise ValueError("objects is not an object")
    names = fields.get("names")
    if names is not None and (not isinstance(names, list) or not all(isinstance(n, str) for n in names)):
        raise ValueError(f"objects: names {_short(names)} is not a list of strings")
    return Blob(
        file=_file_name("objects: ", fields["file"]),
        file_offset=_integer("objects: file_offset", fields["file_offset"]),
        length=_integer("objects: length", fields["length"]),
        checksum=_checksum_field("objects: ", fields[kind], kind),
        names=None if names is None else tuple(names),
    )


def _renamed(fields: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    """``fields`` with key ``old`` renamed ``new`` (KeyError if it has no ``old``)."""
    out = {k: v for k, v in fields.items() if k != old}
    out[new] = fields[old]
    return out


def _numel(shape: tuple[int, ...]) -> int:
    """Elements of ``shape``; past ``MAX_NUMEL``, ``MAX_NUMEL + 1`` (multiplied no further).

    A crafted manifest's shape of a million dimensions, multiplied out, is a product of millions of digits: its
    multiplications take time quadratic in them (an hour for a few megabytes of manifest).
    """
    if 0 in shape:
        return 0
    n = 1
    for d in shape:
        n *= d
        if abs(n) > MAX_NUMEL:
            return MAX_NUMEL + 1
    return n


def numel(shape: tuple[int, ...]) -> int:
    """Elements of a tensor of ``shape`` (1 for a scalar's ``()``; ``MAX_NUMEL + 1`` for any count past it)."""
    return _numel(shape)


def dtype_name(dtype: torch.dtype) -> str:
    """How the manifest writes a torch dtype: its name without ``torch.`` (``"bfloat16"``)."""
    return str(dtype).removeprefix("torch.")


def dtype_of(name: str) -> torch.dtype:
    """The torch dtype a manifest names (``dtype_name``'s inverse).

    Raises:
        ValueError: torch has no such dtype, or it is a quantized one.
    """
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {_short(name)} in the manifest")
    if dtype in _QUANTIZED:  # (no save writes one; torch.empty of one fails an internal assert)
        raise ValueError(f"dtype {name!r} in the manifest is quantized: no checkpoint holds one")
    return dtype


_QUANTIZED = frozenset(
    d for d in (getattr(torch, n, None) for n in ("qint8", "quint8", "qint32", "quint4x2", "quint2x4")) if d is not None
)


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
