"""Adapting user buffers (numpy arrays, torch CPU and CUDA tensors) to flat numpy storage arrays."""

from __future__ import annotations

import ctypes
import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from hfreduce.reduction import Array, DType

_NUMPY_DTYPES = {np.dtype(np.float32): DType.F32, np.dtype(np.float16): DType.F16}


@dataclasses.dataclass
class Flat:
    """A contiguous 1-D storage view of a user buffer, and how to publish results back to it."""

    array: Array
    dtype: DType
    data_ptr: int
    finish: Callable[[], None]  # copy back (non-contiguous or CUDA); a no-op when ``array`` is the buffer


def is_torch(obj: object) -> bool:
    """Whether ``obj`` is a torch object, told by its type's module so that numpy callers never import torch."""
    return type(obj).__module__.startswith("torch")


def flatten(buf: Any, *, stage: Callable[[int], Any] | None = None) -> Flat:
    """View ``buf`` as a flat storage array; non-contiguous buffers go through a temporary copy.

    Raises:
        TypeError: unsupported type or dtype.
    """
    if isinstance(buf, np.ndarray):
        return _flatten_numpy(buf)
    if is_torch(buf):
        return _flatten_torch(buf, stage)
    raise TypeError(f"hfreduce reduces numpy arrays and torch tensors, not {type(buf).__name__}")


def address_view(buf: Any) -> Flat:
    """A flat storage array over the memory of a contiguous CPU buffer, for results written straight into it.

    A torch tensor is viewed by address rather than through ``.numpy()``, which marks its storage as not
    resizable for good: a tensor whose storage is given back between uses (FSDP's gathered parameters) can
    still be. The caller keeps the tensor alive, its storage at its size, until the collective is done.

    Raises:
        TypeError: not a contiguous CPU buffer of a supported dtype.
    """
    if not is_torch(buf):
        if not isinstance(buf, np.ndarray) or not buf.flags.c_contiguous:
            raise TypeError("out must be a contiguous numpy array or CPU tensor")
        return _flatten_numpy(buf)
    import torch

    dtypes = {torch.float32: DType.F32, torch.float16: DType.F16, torch.bfloat16: DType.BF16}
    dtype = dtypes.get(buf.dtype)
    if dtype is None or buf.device.type != "cpu" or not buf.is_contiguous():
        raise TypeError(f"out must be a contiguous CPU tensor of float32, float16 or bfloat16, got {buf.dtype}")
    n = buf.numel()
    raw = (ctypes.c_char * (n * dtype.itemsize)).from_address(buf.data_ptr()) if n else bytearray(0)
    return Flat(np.frombuffer(raw, dtype=dtype.storage, count=n), dtype, buf.data_ptr(), lambda: None)


def _flatten_numpy(arr: Array) -> Flat:
    dtype = _NUMPY_DTYPES.get(arr.dtype)
    if dtype is None and arr.dtype.name == "bfloat16":  # ml_dtypes arrays
        dtype = DType.BF16
    if dtype is None:
        raise TypeError(f"unsupported dtype {arr.dtype}; use float32, float16 or bfloat16")
    if not arr.flags.writeable:
        raise ValueError("hfreduce works in place: the array must be writeable")
    if arr.flags.c_contiguous:
        flat = arr.reshape(-1).view(dtype.storage)
        return Flat(flat, dtype, arr.__array_interface__["data"][0], lambda: None)
    tmp = np.ascontiguousarray(arr).reshape(-1).view(dtype.storage)

    def finish() -> None:
        arr[...] = tmp.view(arr.dtype).reshape(arr.shape)

    return Flat(tmp, dtype, 0, finish)


def _flatten_torch(tensor: Any, stage: Callable[[int], Any] | None) -> Flat:
    import torch

    dtypes = {torch.float32: DType.F32, torch.float16: DType.F16, torch.bfloat16: DType.BF16}
    dtype = dtypes.get(tensor.dtype)
    if dtype is None:
        raise TypeError(f"unsupported dtype {tensor.dtype}; use float32, float16 or bfloat16")
    t = tensor.detach()
    if t.is_cuda:
        return _stage_cuda(t, dtype, stage)
    if t.is_contiguous():
        return Flat(_torch_storage_view(t.view(-1), dtype), dtype, t.data_ptr(), lambda: None)
    tmp = t.contiguous().view(-1)

    def finish() -> None:
        t.copy_(tmp.view(t.shape))

    return Flat(_torch_storage_view(tmp, dtype), dtype, 0, finish)


def _torch_storage_view(t: Any, dtype: DType) -> Array:
    import torch

    if dtype is DType.BF16:
        view: Array = t.view(torch.int16).numpy().view(np.uint16)
        return view
    arr: Array = t.numpy()
    return arr


def _stage_cuda(t: Any, dtype: DType, stage: Callable[[int], Any] | None) -> Flat:
    """D2H into a pinned host buffer on the caller's current stream, reduce on the CPU, H2D back.

    The D2H is queued on the caller's current stream, so it is ordered after the kernels that produced
    ``t``; we wait for it before the CPU reads. The H2D is queued on the same stream (from the collective
    thread), so later kernels see the result; the pinned buffer goes back to the pool with an event and
    is reused only once that copy has completed. Each in-flight collective has its own buffer.
    """
    import torch

    if not isinstance(stage, PinnedPool):
        raise ValueError("CUDA tensors need a group with a pinned staging pool")
    stream = torch.cuda.current_stream(t.device)
    src = t if t.is_contiguous() else t.contiguous()
    nbytes = src.numel() * src.element_size()
    buf = stage(nbytes)
    host = buf[:nbytes].view(src.dtype)
    host.copy_(src.view(-1), non_blocking=True)
    stream.synchronize()

    def finish() -> None:
        with torch.cuda.stream(stream):
            t.copy_(host.view(t.shape), non_blocking=True)
        event_type: Any = torch.cuda.Event  # untyped constructor in torch's stubs
        done = event_type()
        done.record(stream)
        stage.release(buf, done)

    return Flat(_torch_storage_view(host, dtype), dtype, 0, finish)


class PinnedPool:
    """Pinned host buffers for CUDA staging; a buffer is reused only after its last H2D completed."""

    def __init__(self) -> None:
        self._free: list[tuple[Any, Any]] = []  # (buffer, event of its last H2D)
        self._lock = threading.Lock()

    def __call__(self, nbytes: int) -> Any:
        """A pinned uint8 CPU tensor of at least ``nbytes``: a free one whose last H2D is done, else a new one."""
        import torch

        with self._lock:
            for i, (buf, event) in enumerate(self._free):
                if buf.numel() >= nbytes and (event is None or event.query()):
                    del self._free[i]
                    return buf
        return torch.empty(max(nbytes, 1), dtype=torch.uint8, pin_memory=True)

    def release(self, buf: Any, event: Any) -> None:
        """Return ``buf`` to the pool; it is handed out again once ``event`` (its last H2D copy, or None) is done."""
        with self._lock:
            self._free.append((buf, event))
            del self._free[:-4]  # keep a few; the rest are freed once their copies finish
