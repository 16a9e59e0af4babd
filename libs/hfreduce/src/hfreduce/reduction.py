"""Reduce operators, dtypes and the accumulation rule (fp32 arithmetic, bf16 held as uint16 bits)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[Any]
F32Array = npt.NDArray[np.float32]


class ReduceOp(enum.Enum):
    """Element-wise reduction. AVG is SUM divided by the world size once, at the tree root."""

    SUM = "sum"
    AVG = "avg"
    MAX = "max"
    MIN = "min"


class DType(enum.Enum):
    """Data types hfreduce reduces. BF16 is stored as raw uint16 bits in numpy."""

    F32 = "float32"
    F16 = "float16"
    BF16 = "bfloat16"

    @property
    def storage(self) -> np.dtype[Any]:
        """The numpy dtype that holds it (uint16 for BF16, which numpy lacks)."""
        return _STORAGE[self]

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return 4 if self is DType.F32 else 2


_STORAGE: dict[DType, np.dtype[Any]] = {
    DType.F32: np.dtype(np.float32),
    DType.F16: np.dtype(np.float16),
    DType.BF16: np.dtype(np.uint16),
}

Combine = Callable[[Array, Array, Array], object]


def combine_fn(op: ReduceOp) -> Combine:
    """The numpy ufunc applying ``op`` to two arrays into ``out`` (NaN propagates for MAX/MIN)."""
    if op in (ReduceOp.SUM, ReduceOp.AVG):
        return lambda a, b, out: np.add(a, b, out=out)
    if op is ReduceOp.MAX:
        return lambda a, b, out: np.maximum(a, b, out=out)
    return lambda a, b, out: np.minimum(a, b, out=out)


def to_f32(dtype: DType, src: Array, out: F32Array) -> None:
    """Widen ``src`` (storage of ``dtype``) into ``out`` exactly."""
    if dtype is DType.BF16:
        wide = out.view(np.uint32)
        np.copyto(wide, src, casting="unsafe")
        np.left_shift(wide, 16, out=wide)
    else:
        np.copyto(out, src, casting="same_kind")


def from_f32(dtype: DType, src: F32Array, out: Array, scratch: npt.NDArray[np.uint32]) -> None:
    """Round ``src`` to ``dtype`` (round to nearest even, NaN stays NaN) into ``out``.

    ``scratch`` is a uint32 array at least as long as ``src`` (used for BF16 only).
    """
    if dtype is not DType.BF16:
        np.copyto(out, src, casting="same_kind")
        return
    bits = src.view(np.uint32)
    tmp = scratch[: len(src)]
    np.right_shift(bits, 16, out=tmp)
    np.bitwise_and(tmp, 1, out=tmp)
    np.add(tmp, 0x7FFF, out=tmp)
    np.add(tmp, bits, out=tmp)
    np.right_shift(tmp, 16, out=tmp)
    np.copyto(out, tmp, casting="unsafe")
    nans = np.isnan(src)
    if nans.any():
        out[nans] = (bits[nans] >> 16).astype(np.uint16) | np.uint16(0x0040)


def bf16_bits(values: npt.ArrayLike) -> npt.NDArray[np.uint16]:
    """Round float values to bf16 and return its uint16 bits (for tests and callers without torch)."""
    src = np.ascontiguousarray(values, dtype=np.float32).ravel()
    out = np.empty(len(src), dtype=np.uint16)
    from_f32(DType.BF16, src, out, np.empty(len(src), dtype=np.uint32))
    return out


def bf16_values(bits: npt.NDArray[np.uint16]) -> F32Array:
    """uint16 bf16 bits widened to float32."""
    out = np.empty(len(bits), dtype=np.float32)
    to_f32(DType.BF16, bits, out)
    return out


def unit_roundoff(dtype: DType) -> float:
    """Relative rounding error bound u of one rounding to ``dtype`` (2**-24, 2**-11, 2**-8)."""
    return {DType.F32: 2.0**-24, DType.F16: 2.0**-11, DType.BF16: 2.0**-8}[dtype]
