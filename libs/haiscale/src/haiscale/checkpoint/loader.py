"""Loading: match the state dict against the manifest before one byte of the caller's tensors changes.

Match the state dict against the manifest (a mismatch changes nothing), read and rebuild the pickled values (values
a load refuses change nothing), then read every needed slice in one batch and check its checksum. In place (the
default), a saved slice that lies wholly inside a contiguous CPU tensor's range is read straight into that tensor
(no staging buffer, no page faults, no copy) and checked there; the others are read into staging buffers and copied
once checked. Not in place, every slice is staged and checked before any tensor changes, so bad bytes change nothing
either.
"""

from __future__ import annotations

import io
import pickle
from collections import Counter
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import numpy
import torch

from haiscale.checkpoint.manifest import (
    MANIFEST,
    MAX_MANIFEST_BYTES,
    Blob,
    Key,
    Manifest,
    Shard,
    TensorEntry,
    checksum,
    dtype_name,
    dtype_of,
    leaves,
    numel,
    put,
)
from haiscale.checkpoint.saver import ALIGN, folder_step, step_folder
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
    """The folder name of the checkpoint to load: ``step``'s, or the newest committed one; None if none.

    One listing, then a look for the manifest of each candidate from the newest down until one is there.
    """
    names = loc.storage.listdir(loc.path)
    if MANIFEST in names:
        return ""  # the path is a checkpoint folder itself
    steps = sorted({s for s in map(folder_step, names) if s is not None and step in (None, s)}, reverse=True)
    return next((step_folder(s) for s in steps if loc.storage.exists(loc.join(step_folder(s), MANIFEST))), None)


def _describe(dtype: str, shape: tuple[int, ...]) -> str:
    return f"{dtype} {list(shape)}"


def _mismatch(name: str, saved: str, given: str) -> CheckpointMismatch:
    return CheckpointMismatch(f"{name}: the checkpoint has {saved}, the state dict {given}")


Slices = dict[str, list[TensorEntry]]  # each tensor's saved slices, by offset


def _slices_by_name(manifest: Manifest) -> Slices:
    """The manifest's saved slices grouped by tensor (names in the manifest's order), each group by offset.

    Built once per load: a sharded checkpoint holds a slice per tensor per rank, millions in a large one.
    """
    out: Slices = {}
    for e in manifest.tensors:
        out.setdefault(e.name, []).append(e)
    for group in out.values():
        group.sort(key=lambda e: e.offset)
    return out


def _plan(
    slices: Slices, values: set[str], state: dict[Any, Any], allocate_missing: bool
) -> tuple[list[_Want], list[tuple[tuple[Key, ...], Any]]]:
    """What to read into which tensor and which tensors to make, checking everything first.

    ``values``: the names of the checkpoint's pickled values.

    Raises:
        CheckpointMismatch: the first leaf (state dict order, then the checkpoint's) that does not match.
    """
    saved = {name: group[0] for name, group in slices.items()}  # (a manifest's slices of a name agree on these)
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
                raise _mismatch(name, "no such tensor" + (" (a value)" if name in values else ""), given)
            unfit = _cannot_hold_bytes(local)
            if unfit:
                raise _mismatch(name, _describe(entry.dtype, entry.shape), unfit)
            if entry.dtype != dtype_name(local.dtype) or entry.shape != shape:
                raise _mismatch(name, _describe(entry.dtype, entry.shape), given)
            start = value.offset if isinstance(value, Shard) else 0
            wants.append(_Want(name, start, start + local.numel(), local))
        elif name in values:
            continue
        else:
            found = _describe(entry.dtype, entry.shape) if entry else "no such value"
            raise _mismatch(name, found, f"a value of type {type(value).__name__}")
    for name, entry in saved.items():
        if name in seen:
            continue
        if not allocate_missing:
            raise _mismatch(name, _describe(entry.dtype, entry.shape), "no such tensor")
        _sources(slices, name, 0, numel(entry.shape))  # saved whole, in bytes checked there: then it is made
        t = torch.empty(entry.shape, dtype=dtype_of(entry.dtype))
        sets.append((entry.keys, t))
        wants.append(_Want(name, 0, t.numel(), t))
    return wants, sets


def _cannot_hold_bytes(t: torch.Tensor) -> str:
    """Why bytes cannot be loaded into ``t`` as it is (empty: they can)."""
    if t.is_meta:
        return "a tensor on the meta device (no memory to load into)"
    if t.layout != torch.strided:
        return f"a {t.layout} tensor (only strided tensors load)"
    if t.is_quantized:
        return "a quantized tensor (only plain dtypes load)"
    if any(stride == 0 and size > 1 for size, stride in zip(t.shape, t.stride(), strict=True)):
        return "an expanded tensor (elements that share memory cannot hold different values)"  # copy_ would raise
    return ""


def _sources(slices: Slices, name: str, start: int, stop: int) -> list[TensorEntry]:
    """The saved slices of tensor ``name`` that cover elements [start, stop).

    Raises:
        CheckpointMismatch: part of the range was saved by no rank.
    """
    covering = [e for e in slices.get(name, []) if e.offset < stop and e.offset + e.numel > start]
    out: list[TensorEntry] = []
    pos = start
    for e in covering:
        if e.offset > pos:
            break
        pos = max(pos, e.offset + e.numel)
        out.append(e)
    if pos < stop:
        raise CheckpointMismatch(f"{name}: elements {pos}..{stop} were saved by no rank")
    return out


def _checked(data: Bytes, length: int, crc: int, kind: str, where: str, note: str = "") -> memoryview:
    if len(data) != length or checksum(kind, data) != crc:
        raise CorruptCheckpoint(f"{where}: {len(data)} bytes read, checksum does not match the manifest{note}")
    return memoryview(data)


Slot = tuple[str, int, int]  # (file, file offset, length) of a saved slice


@dataclass(frozen=True)
class _Slice:
    """Saved bytes to read and check: a tensor's slice, or the pickled values (``name`` is for messages)."""

    name: str
    file: str
    file_offset: int
    length: int
    checksum: int

    @property
    def slot(self) -> Slot:
        return (self.file, self.file_offset, self.length)


def _slice(e: TensorEntry) -> _Slice:
    return _Slice(e.name, e.file, e.file_offset, e.length, e.checksum)


def _values_slice(b: Blob) -> _Slice:
    return _Slice("values", b.file, b.file_offset, b.length, b.checksum)


def _holds_bytes_as_saved(t: torch.Tensor) -> bool:
    """Whether the saved bytes can be written straight into ``t``'s memory.

    A contiguous CPU tensor without a conjugate or negative bit (those views read their memory conjugated or negated:
    ``copy_`` writes them).
    """
    return t.device.type == "cpu" and t.is_contiguous() and not t.is_conj() and not t.is_neg()


def _byte_view(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, writable, sharing its memory.

    Flattened with ``as_strided``: contiguous, its elements are one run, but ``view(-1)`` of a one-element tensor
    keeps the stride its dimension had (``x[::2]`` of two elements: 2), and the byte view of that failed.
    """
    array: Any = t.detach().as_strided((t.numel(),), (1,)).view(torch.uint8).numpy()
    return memoryview(array)


def _in_place(plan: list[tuple[_Want, list[TensorEntry]]]) -> dict[Slot, tuple[_Slice, memoryview]]:
    """The saved slices that can be read straight into the caller's tensor, and where in it.

    A slice can when its tensor is a contiguous CPU tensor and the slice lies wholly inside the range asked for
    (so its checksum covers bytes that all land there), and no other tensor of the plan shares that tensor's memory
    (tied weights: those are staged and copied after the checks, in order, so the last name's values win, as in
    ``load_state_dict``); the others are read into staging buffers and copied.
    """
    uses = Counter(_slice(e).slot for _, sources in plan for e in sources)
    out: dict[Slot, tuple[_Slice, memoryview]] = {}
    candidates = [(w, sources) for w, sources in plan if _holds_bytes_as_saved(w.target) and w.target.numel()]
    shared = _sharing_memory([w.target for w, _ in candidates])
    for i, (w, sources) in enumerate(candidates):
        if i in shared:
            continue
        size = w.target.element_size()
        view: memoryview | None = None
        for e in sources:
            inside = w.start <= e.offset and e.offset + e.numel <= w.stop and e.length == e.numel * size
            if inside and e.length and uses[_slice(e).slot] == 1:
                view = _byte_view(w.target) if view is None else view
                out[_slice(e).slot] = (_slice(e), view[(e.offset - w.start) * size :][: e.length])
    return out


def _sharing_memory(tensors: list[torch.Tensor]) -> set[int]:
    """The indexes of the (contiguous, non-empty) tensors whose memory overlaps another's.

    One sort of their byte ranges and a sweep (comparing each with every one before it took minutes for the
    100,000 tensors of a large mixture-of-experts model and its optimizer).
    """
    ranges = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size(), i) for i, t in enumerate(tensors))
    shared: set[int] = set()
    reach, reacher = -1, -1  # the furthest end of the ranges swept, and whose it is
    for lo, hi, i in ranges:
        if lo < reach:
            shared.update((i, reacher))
        if hi > reach:
            reach, reacher = hi, i
    return shared


def _read_slices(
    loc: Location, folder: str, kind: str, staged: list[_Slice], direct: dict[Slot, tuple[_Slice, memoryview]]
) -> dict[Slot, memoryview]:
    """Read every slice in one batch and check it; each slice's checked bytes, by slot.

    ``direct`` slices go into the caller's tensors, ``staged`` ones into new buffers (neighbours in a file as one
    range of up to ``READ_RANGE_BYTES``).

    Raises:
        CorruptCheckpoint: the first slice (in file order) short or failing its checksum.
    """
    ranges: list[tuple[str, int, int, list[_Slice]]] = []
    for e in sorted(staged, key=lambda e: e.slot):
        last = ranges[-1] if ranges else None
        if (
            last
            and last[0] == e.file
            and 0 <= e.file_offset - (last[1] + last[2]) <= ALIGN
            and e.file_offset + e.length - last[1] <= READ_RANGE_BYTES
        ):
            last[3].append(e)  # (the same list: a copy per slice was quadratic in a range's slices)
            ranges[-1] = (last[0], last[1], e.file_offset + e.length - last[1], last[3])
        else:
            ranges.append((e.file, e.file_offset, e.length, [e]))
    reads = [(f, start, n, numpy.empty(n, dtype=numpy.uint8).data, es) for f, start, n, es in ranges]
    reads += [(e.file, e.file_offset, e.length, view, [e]) for e, view in direct.values()]
    reads.sort(key=lambda r: (r[0], r[1]))  # each file front to back
    got = loc.storage.read_into([(loc.join(folder, f), start, n) for f, start, n, _, _ in reads], [r[3] for r in reads])
    out: dict[Slot, memoryview] = {}
    for (_, start, _, buffer, members), n in zip(reads, got, strict=True):
        for e in members:
            lo = e.file_offset - start
            part = buffer[lo : max(lo, min(n, lo + e.length))]
            note = f" (read in place: {e.name} holds them)" if e.slot in direct else ""
            out[e.slot] = _checked(part, e.length, e.checksum, kind, f"{e.file} ({e.name})", note)
    return out


def _copy(w: _Want, sources: list[TensorEntry], data: dict[Slot, memoryview]) -> None:
    """Copy the saved elements of ``w``'s range from staging buffers into its tensor (bytes to bytes)."""
    size = w.target.element_size()
    direct = _holds_bytes_as_saved(w.target)
    out = w.target if direct else torch.empty(w.target.shape, dtype=w.target.dtype)
    if not out.numel() or not sources:
        return
    dst: Any = _byte_view(out)
    for e in sources:
        lo, hi = max(w.start, e.offset), min(w.stop, e.offset + e.numel)
        src = data[_slice(e).slot]
        dst[(lo - w.start) * size : (hi - w.start) * size] = src[(lo - e.offset) * size : (hi - e.offset) * size]
    if not direct:
        with torch.no_grad():  # a Parameter (requires grad) takes the values as they are, as load_state_dict does
            w.target.copy_(out)


Values = dict[str, tuple[tuple[Key, ...], Any]]  # the pickled values: name -> (keys, value)
_NUMPY_REBUILDERS = (("numeric", "_frombuffer"), ("multiarray", "_reconstruct"), ("multiarray", "scalar"))


# What the values of a checkpoint may name without ``trusted``: the types training state holds (Python and numpy
# RNG states, numpy arrays and scalars, torch sizes, dtypes and devices, the collections and times), none of which
# runs code when it is rebuilt. Anything else (a class of the caller's, or os.system) needs ``trusted=True``.
SAFE_GLOBALS = frozenset(
    [("builtins", n) for n in ("complex", "set", "frozenset", "slice", "range", "bytearray", "bytes", "list")]
    + [("builtins", n) for n in ("dict", "tuple", "int", "float", "str", "bool")]
    + [("collections", n) for n in ("OrderedDict", "defaultdict", "deque", "Counter")]
    + [("datetime", n) for n in ("datetime", "date", "time", "timedelta", "timezone")]
    + [("numpy", "dtype"), ("numpy", "ndarray"), ("torch", "Size"), ("torch", "device")]
    + [(f"numpy.{core}.{m}", f) for core in ("core", "_core") for m, f in _NUMPY_REBUILDERS]
)


# What of those unpickling may call (REDUCE, NEWOBJ): what the values' own pickles call, at pickle protocol 5 (saves
# use it). The others (builtins' list, bytes, str..., numpy.ndarray) may only be named, as a defaultdict's factory or an
# array's class: called, bytes(10**12) or list(range(10**12)) fill memory from a few bytes of a hostile pickle.
CALLABLE_GLOBALS = frozenset(
    [("builtins", n) for n in ("complex", "slice", "range")]
    + [("collections", n) for n in ("OrderedDict", "defaultdict", "deque", "Counter")]
    + [("datetime", n) for n in ("datetime", "date", "time", "timedelta", "timezone")]
    + [("numpy", "dtype"), ("torch", "Size"), ("torch", "device")]
    + [(f"numpy.{core}.{m}", f) for core in ("core", "_core") for m, f in _NUMPY_REBUILDERS]
)


class UntrustedValues(ValueError):
    """The checkpoint's pickled values name a class or function that loading without ``trusted=True`` refuses."""


def _untrusted(what: str) -> UntrustedValues:
    return UntrustedValues(
        f"the checkpoint's values {what}, which a load runs when it rebuilds them: load it with trusted=True if you "
        "trust who wrote it"
    )


class _SafeUnpickler(pickle._Unpickler):
    """An unpickler that finds only ``SAFE_GLOBALS`` (and torch's dtypes) and calls only ``CALLABLE_GLOBALS``.

    A call may not make more than the pickle holds: no ``range`` for an argument (``Counter(range(10**12))``: its
    length is not in the pickle's bytes), no empty array larger than the pickle (``_reconstruct(ndarray, shape)``
    allocates the shape). Python's pure-Python unpickler (``pickle._Unpickler``): the C one's calls cannot be checked;
    the values of a checkpoint are small.
    """

    stack: list[Any]  # (the pure-Python unpickler's, set by load)
    append: Callable[[Any], None]

    def __init__(self, data: memoryview) -> None:
        super().__init__(io.BytesIO(data))
        self._limit_bytes = len(data)
        self._callables: dict[int, str] = {}  # id of each CALLABLE_GLOBALS object found -> its name

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in SAFE_GLOBALS or (
            module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        ):
            found = super().find_class(module, name)
            if (module, name) in CALLABLE_GLOBALS:
                self._callables[id(found)] = f"{module}.{name}"
            return found
        raise _untrusted(f"name {module}.{name}")

    def _call(self, func: Any, args: Any, kwargs: Any = None, new: bool = False) -> Any:
        """``func(*args, **kwargs)`` (``new``: ``func.__new__(func, ...)``), if the checks above let it."""
        name = self._callables.get(id(func))
        if name is None:
            raise _untrusted(f"call {getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', func)!s:.80}")
        given = [*args, *(kwargs or {}).values()]
        if any(isinstance(a, range) for a in given):
            raise _untrusted(f"pass a range to {name} (what it makes of one is not in the checkpoint's bytes)")
        if name.endswith("._reconstruct") and _array_bytes(given) > self._limit_bytes:
            raise _untrusted(f"make an array larger than their pickle with {name} ({given[1:3]!r:.80})")
        return func.__new__(func, *args, **(kwargs or {})) if new else func(*args, **(kwargs or {}))

    def _load_reduce(self) -> None:
        args = self.stack.pop()
        self.stack[-1] = self._call(self.stack[-1], args)

    def _load_newobj(self) -> None:
        args = self.stack.pop()
        self.append(self._call(self.stack.pop(), args, new=True))

    def _load_newobj_ex(self) -> None:
        kwargs, args = self.stack.pop(), self.stack.pop()
        self.append(self._call(self.stack.pop(), args, kwargs, new=True))

    def _instantiate(self, klass: Any, args: Any) -> None:  # protocols 0 and 1 (OBJ, INST)
        self.append(self._call(klass, tuple(args)))

    # every opcode that calls: REDUCE, NEWOBJ, NEWOBJ_EX here, OBJ and INST through _instantiate (Any: typeshed
    # types the table's functions as taking the C Unpickler)
    _CALLING_OPCODES: dict[int, Any] = {
        pickle.REDUCE[0]: _load_reduce,
        pickle.NEWOBJ[0]: _load_newobj,
        pickle.NEWOBJ_EX[0]: _load_newobj_ex,
    }
    dispatch = {**pickle._Unpickler.dispatch, **_CALLING_OPCODES}


def _array_bytes(args: list[Any]) -> int:
    """Bytes of the empty array ``_reconstruct(subtype, shape, dtype)`` makes (more than any limit if unknown)."""
    try:
        return int(numpy.dtype(args[2]).itemsize) * numel(tuple(int(d) for d in args[1]))
    except (IndexError, TypeError, ValueError):
        return 2**63


def _unpickle(data: memoryview, names: tuple[str, ...] | None, trusted: bool) -> Values:
    """The pickled values, each ``name -> (keys, value)`` (``names``: what the manifest said they are, if it did).

    Raises:
        UntrustedValues: not ``trusted``, and they name something outside ``SAFE_GLOBALS``, or make more than their
            bytes hold (see ``_SafeUnpickler``).
        CorruptCheckpoint: not ``trusted``, and they are not the manifest's values under their keys.
    """
    if trusted:
        trusted_values: Values = pickle.loads(data)
        return trusted_values
    values = _SafeUnpickler(data).load()
    if not isinstance(values, dict) or (names is not None and sorted(values) != sorted(names)):
        raise CorruptCheckpoint("values: not the values the manifest names")
    for name, item in values.items():
        ok = isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], tuple) and item[0]
        if not ok or ".".join(str(k) for k in item[0]) != name:
            raise CorruptCheckpoint(f"values: {name!r} is not kept under its own keys")
    return values


def read_into(
    loc: Location,
    folder: str,
    manifest: Manifest,
    state: dict[Any, Any],
    allocate_missing: bool,
    in_place: bool = True,
    trusted: bool = False,
) -> None:
    """Fill ``state`` from the checkpoint in ``folder`` (see the module docstring).

    ``trusted``: unpickle the values whatever they name (else only ``SAFE_GLOBALS``: ``UntrustedValues``).

    ``in_place``: read what can be straight into the caller's tensors (no staging buffer, no copy), checked after;
    otherwise every byte is read into staging buffers and checked before any tensor changes. The pickled values are
    read, checked and rebuilt before any tensor (a format 1 manifest does not name them: before the match, too), so
    values a load refuses (``UntrustedValues``, or ones that would replace the caller's tensors or dicts) change
    nothing, in place too; they are set last.
    """
    kind, blob = manifest.checksum_kind, manifest.objects
    _check_extents(loc, folder, manifest)
    values: Values | None = None
    if blob is not None and blob.names is None:
        values = _read_values(loc, folder, blob, kind, trusted)
    names = set(values) if values is not None else set(blob.names or ()) if blob is not None else set()
    slices = _slices_by_name(manifest)
    wants, made = _plan(slices, names, state, allocate_missing)
    plan = [(w, _sources(slices, w.name, w.start, w.stop)) for w in wants]
    if blob is not None and values is None:
        values = _read_values(loc, folder, blob, kind, trusted)
    sets = [*made, *(values or {}).values()]
    _check_settable(state, sets)
    direct = _in_place(plan) if in_place else {}
    staged = {_slice(e).slot: _slice(e) for _, es in plan for e in es if _slice(e).slot not in direct}
    data = _read_slices(loc, folder, kind, list(staged.values()), direct)
    for w, sources in plan:  # every check passed: now change the caller's state
        _copy(w, [e for e in sources if _slice(e).slot not in direct], data)
    for keys, value in sets:
        put(state, keys, value)


def _read_values(loc: Location, folder: str, blob: Blob, kind: str, trusted: bool) -> Values:
    """The checkpoint's pickled values, read (one call of their own), checked and rebuilt (see ``_unpickle``)."""
    raw = loc.storage.read_ranges([(loc.join(folder, blob.file), blob.file_offset, blob.length)])[0]
    return _unpickle(_checked(raw, blob.length, blob.checksum, kind, f"{blob.file} (values)"), blob.names, trusted)


def _check_settable(state: dict[Any, Any], sets: list[tuple[tuple[Key, ...], Any]]) -> None:
    """Every value and made tensor goes where ``state`` has nothing, a value, or an empty dict.

    None may go through a leaf (``put`` would fail halfway, the values before it set), replace one of the caller's
    tensors or a dict holding anything (a crafted checkpoint's value ``model`` replaced the whole model's state), or
    go into a mapping that cannot be changed.

    Raises:
        CheckpointMismatch: the first that cannot, named.
    """
    for keys, _ in sets:
        node: Any = state
        for depth, key in enumerate(keys):
            if not isinstance(node, MutableMapping):
                held = f"a {type(node).__name__} at {'.'.join(map(str, keys[:depth])) or 'the top'}"
                raise _mismatch(".".join(map(str, keys)), "a value or tensor there", held)
            if key not in node:
                break
            node = node[key]
        else:
            if isinstance(node, torch.Tensor | Shard) or (isinstance(node, Mapping) and node):
                raise _mismatch(".".join(map(str, keys)), "a value there", f"a {type(node).__name__}")


def _check_extents(loc: Location, folder: str, manifest: Manifest) -> None:
    """Check that every saved slice and the values lie inside their data file, before anything is read.

    From the files' sizes (one stat per data file), so nothing is allocated for what a manifest merely claims.

    Raises:
        CorruptCheckpoint: the first (in manifest order) whose file is missing or ends before it does, or slices
            that claim more bytes than the files hold (they share bytes, which no save writes: each name would be
            allocated anew by ``allocate_missing``).
    """
    items = [*map(_slice, manifest.tensors), *([_values_slice(manifest.objects)] if manifest.objects else [])]
    files = sorted({e.file for e in items})
    size_of = dict(zip(files, loc.storage.sizes([loc.join(folder, f) for f in files]), strict=True))
    for e in items:
        size = size_of[e.file]
        if size is None:
            raise CorruptCheckpoint(f"{e.file} ({e.name}): no such file in {loc.url(folder)}")
        if e.file_offset + e.length > size:
            raise CorruptCheckpoint(
                f"{e.file} ({e.name}): bytes {e.file_offset}..{e.file_offset + e.length} are past the end of the "
                f"file ({size} bytes)"
            )
    claimed, held = sum(e.length for e in items), sum(size or 0 for size in size_of.values())
    if claimed > held:  # a save writes each slice to bytes of its own: a manifest naming bytes twice is crafted
        raise CorruptCheckpoint(
            f"{loc.url(folder)}: the manifest names slices of {claimed} bytes in data files of {held}: some share bytes"
        )


def read_manifest(loc: Location, folder: str) -> Manifest:
    """The manifest of checkpoint ``folder`` under ``loc``.

    Raises:
        FileNotFoundError: no manifest there (pruned meanwhile).
        ValueError: the file is not a manifest of this format, not a regular file (a FIFO or ``/dev/zero`` behind
            the name would block or fill memory), or larger than ``MAX_MANIFEST_BYTES`` (names the file).
    """
    path = loc.join(folder, MANIFEST)
    size = loc.storage.sizes([path])[0]
    if size is not None and size > MAX_MANIFEST_BYTES:
        raise ValueError(f"{path}: {size} bytes, more than a manifest may be ({MAX_MANIFEST_BYTES})")
    return Manifest.from_json(loc.storage.read_small(path, MAX_MANIFEST_BYTES), path)
