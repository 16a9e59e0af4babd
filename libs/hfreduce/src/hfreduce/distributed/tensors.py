"""Tensor plumbing for the torch backend: any tensor as bytes, and the local reductions of the fallback path."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from hfreduce.reduction import ReduceOp

OpName = str  # the name of a torch ReduceOp: "SUM", "AVG", "PREMUL_SUM", ...
NATIVE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
NATIVE_OPS = {"SUM": ReduceOp.SUM, "AVG": ReduceOp.AVG, "MAX": ReduceOp.MAX, "MIN": ReduceOp.MIN}
_BITWISE = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}


def _noop() -> None:
    return None


def host_bytes(t: torch.Tensor) -> tuple[torch.Tensor, Callable[[], None]]:
    """A flat uint8 CPU tensor of ``t``'s bytes, and a function writing it back into ``t``.

    For a contiguous CPU tensor the bytes are ``t``'s own memory and the function does nothing.
    """
    if t.device.type == "cpu" and t.is_contiguous():
        return t.detach().reshape(-1).view(torch.uint8), _noop
    host = t.detach().to("cpu", copy=True).contiguous()

    def finish() -> None:
        with torch.no_grad():
            t.copy_(host)

    return host.reshape(-1).view(torch.uint8), finish


def wire(flat: torch.Tensor) -> npt.NDArray[np.float16]:
    """An even-length uint8 CPU tensor seen as float16 storage: hfreduce moves it bit for bit."""
    return flat.numpy().view(np.float16)


def padded(nbytes: int) -> int:
    """``nbytes`` rounded up to even: ``wire`` sees bytes as 2-byte float16 elements."""
    return nbytes + (nbytes & 1)


def as_dtype(raw: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The uint8 bytes ``raw`` read as a tensor of ``like``'s dtype and shape.

    They are copied first when they do not start at a multiple of the element size, which ``view`` refuses.
    """
    if raw.storage_offset() % like.element_size():
        raw = raw.clone()
    return raw.view(like.dtype).reshape(like.shape)


def reduce_op(op: Any, what: str, dtype: torch.dtype) -> tuple[OpName, float | torch.Tensor | None]:
    """The name of ``opts.reduceOp`` (and PREMUL_SUM's factor); raises naming what cannot be reduced."""
    kind: str = (op.op if hasattr(op, "op") else op).name
    factor = op.factor if kind == "PREMUL_SUM" else None
    floating = dtype.is_floating_point or dtype.is_complex
    if kind in _BITWISE and floating:
        raise TypeError(f"hfreduce backend: {what} with {kind} needs an integer or bool tensor, not {dtype}")
    if kind in ("AVG", "PREMUL_SUM") and not floating:
        raise TypeError(f"hfreduce backend: {what} with {kind} needs a floating-point tensor, not {dtype}")
    if kind in ("MAX", "MIN") and dtype.is_complex:
        raise TypeError(f"hfreduce backend: {what} with {kind} is not defined for {dtype}")
    if kind not in (*NATIVE_OPS, *_BITWISE, "PRODUCT", "PREMUL_SUM"):
        raise NotImplementedError(f"hfreduce backend: {what} with reduce op {kind} is not supported")
    return kind, factor


def is_native(t: torch.Tensor, kind: OpName) -> bool:
    """Whether hfreduce reduces ``t`` itself (else: gather every rank's copy and reduce locally)."""
    return t.dtype in NATIVE_DTYPES and kind in NATIVE_OPS


def combine(rows: Sequence[torch.Tensor], kind: OpName) -> torch.Tensor:
    """The reduction of every rank's copy (in rank order), for the dtypes and ops hfreduce does not reduce."""
    stack = torch.stack(list(rows))
    if kind in ("SUM", "PREMUL_SUM"):
        return stack.sum(0, dtype=stack.dtype)
    if kind == "AVG":
        return stack.mean(0)
    if kind == "MAX":
        return stack.amax(0)
    if kind == "MIN":
        return stack.amin(0)
    if kind == "PRODUCT":
        return stack.prod(0, dtype=stack.dtype)
    out = rows[0].clone()
    for row in rows[1:]:
        _BITWISE[kind](out, row, out=out)
    return out
