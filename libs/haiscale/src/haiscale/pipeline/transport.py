"""Activations and gradients between neighbouring stages: point-to-point sends on the pipeline group.

An activation message is a fixed-size header (an int64 tensor: how many tensors, then per tensor its dtype,
whether it wants a gradient, its shape) followed by one message per tensor, so a stage needs to know nothing
about its neighbour's output shapes. Gradients go back without a header: the sender of the activations knows
their shapes. Sends are asynchronous (``isend``) and waited for at the end of the step, so two neighbours may
send to each other at once; receives block. A pair's messages arrive in the order they were sent (gloo, nccl
and hfreduce keep it), which is all the schedules rely on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

MAX_TENSORS = 16
MAX_DIMS = 8
_FIELDS = 3 + MAX_DIMS  # dtype code, wants grad, ndim, dims
_DTYPES = [
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
]


class TransferError(RuntimeError):
    """A send to or receive from a neighbouring stage failed.

    Attributes:
        peer: the global rank of the neighbour.
    """

    def __init__(self, message: str, *, peer: int) -> None:
        super().__init__(message)
        self.peer = peer


def encode_header(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The header describing ``tensors`` (see the module docstring).

    Raises:
        TypeError: an item is not a tensor, or has a dtype the header cannot carry.
        ValueError: too many tensors, or too many dimensions.
    """
    if len(tensors) > MAX_TENSORS:
        raise ValueError(f"a stage passes at most {MAX_TENSORS} tensors to the next, this one passes {len(tensors)}")
    header = torch.zeros(1 + MAX_TENSORS * _FIELDS, dtype=torch.int64)
    header[0] = len(tensors)
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(
                f"a stage's outputs must be tensors (or a tuple of tensors); item {i} is {type(t).__name__}"
            )
        if t.dtype not in _DTYPES:
            raise TypeError(f"output {i} of the stage is {t.dtype}, which the pipeline does not send")
        if t.dim() > MAX_DIMS:
            raise ValueError(f"output {i} of the stage has {t.dim()} dimensions, at most {MAX_DIMS} are sent")
        at = 1 + i * _FIELDS
        fields = [_DTYPES.index(t.dtype), int(t.requires_grad), t.dim(), *t.shape]
        header[at : at + len(fields)] = torch.tensor(fields, dtype=torch.int64)
    return header


def decode_header(header: torch.Tensor) -> list[tuple[torch.dtype, bool, tuple[int, ...]]]:
    """(dtype, wants grad, shape) of every tensor a header describes."""
    values = header.tolist()
    out = []
    for i in range(int(values[0])):
        at = 1 + i * _FIELDS
        code, wants_grad, ndim = values[at : at + 3]
        out.append((_DTYPES[code], bool(wants_grad), tuple(values[at + 3 : at + 3 + ndim])))
    return out


class StageLink:
    """This stage's sends to and receives from its neighbours on the pipeline group ``group``."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.stage = dist.get_rank(group)
        self.num_stages = dist.get_world_size(group)
        self._pending: list[tuple[Any, int, list[torch.Tensor]]] = []  # (work, peer stage, tensors kept alive)

    def global_rank(self, stage: int) -> int:
        """The global rank of the pipeline group's ``stage`` (to name a failed neighbour)."""
        return dist.get_global_rank(self.group, stage)

    def send_activations(self, tensors: Sequence[torch.Tensor]) -> None:
        """Start sending this stage's outputs, header first, to the next stage; ``wait_sends`` waits for them.

        Raises:
            TypeError: an output has a dtype the pipeline does not send.
            ValueError: more than ``MAX_TENSORS`` outputs, or one of more than ``MAX_DIMS`` dimensions.
            TransferError: a send could not be started (names the next stage's rank).
        """
        out = [t.detach().contiguous() for t in tensors]
        header = encode_header(tensors)
        for t in [header, *out]:
            self._isend(t, self.stage + 1)

    def recv_activations(self) -> list[torch.Tensor]:
        """The previous stage's outputs; floating ones it computed with grad want a gradient (``requires_grad``)."""
        peer = self.stage - 1
        header = torch.empty(1 + MAX_TENSORS * _FIELDS, dtype=torch.int64)
        self._recv(header, peer)
        tensors = []
        for dtype, wants_grad, shape in decode_header(header):
            t = torch.empty(shape, dtype=dtype)
            self._recv(t, peer)
            tensors.append(t.requires_grad_() if wants_grad else t)
        return tensors

    def send_grads(self, grads: Sequence[torch.Tensor]) -> None:
        """Start sending the gradients of the received activations back to the previous stage (no header)."""
        for g in grads:
            self._isend(g.detach().contiguous(), self.stage - 1)

    def recv_grads(self, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The next stage's gradients of the activations ``like`` this stage sent it: one per tensor, same shapes.

        Raises:
            TransferError: a receive failed (names the next stage's rank).
        """
        grads = []
        for t in like:
            g = torch.empty(t.shape, dtype=t.dtype)
            self._recv(g, self.stage + 1)
            grads.append(g)
        return grads

    def wait_sends(self) -> None:
        """Wait for every send started since the last call (the end of a step).

        Raises:
            TransferError: a send failed (names the rank it went to).
        """
        pending, self._pending = self._pending, []
        for work, peer, _ in pending:
            self._wait(work, peer, "send to")

    def _isend(self, t: torch.Tensor, peer: int) -> None:
        try:
            work = dist.isend(t, group=self.group, group_dst=peer)
        except Exception as exc:
            raise self._error(peer, "send to", exc) from exc
        self._pending.append((work, peer, [t]))

    def _recv(self, t: torch.Tensor, peer: int) -> None:
        try:
            work = dist.irecv(t, group=self.group, group_src=peer)
        except Exception as exc:
            raise self._error(peer, "receive from", exc) from exc
        self._wait(work, peer, "receive from")

    def _wait(self, work: Any, peer: int, what: str) -> None:
        try:
            work.wait()
        except Exception as exc:
            raise self._error(peer, what, exc) from exc

    def _error(self, peer: int, what: str, exc: BaseException) -> TransferError:
        rank = self.global_rank(peer)
        return TransferError(f"{what} stage {peer} (rank {rank}) failed: {exc}", peer=rank)
