"""One wrapped unit: its flat fp32 shard, the gathered buffer its module computes with, and their lifetimes."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Sequence
from typing import Any

import torch

from haiscale.fsdp.comm import Comm, Pending
from haiscale.fsdp.flat import FlatLayout, Piece, layout_of
from haiscale.fsdp.memory import SpareMemory


@dataclasses.dataclass(frozen=True)
class ParamRef:
    """One parameter of the unit: its names (several when tied), where the module holds it, its shape."""

    names: tuple[str, ...]
    slots: tuple[tuple[torch.nn.Module, str], ...]  # (module, attribute) pairs that hold this tensor
    shape: torch.Size

    @property
    def name(self) -> str:
        """Its first name (tied parameters have several): the key of its ``Shard`` and its optimizer state."""
        return self.names[0]


class UnitState(enum.Enum):
    """Where a unit's gathered buffer is in its cycle (``Unit.state``): free, all-gather in flight, or ready."""

    FREE = "free"  # the gathered buffer has no memory
    GATHERING = "gathering"  # an all-gather into it is in flight
    READY = "ready"  # it holds every rank's shard


GradCallback = Callable[["Unit", Sequence[torch.Tensor | None]], None]


class _GatheredParams(torch.autograd.Function):
    """A unit's parameters as views of its gathered leaf, whose backward hands their gradients to a callback.

    Backward hands the gradients to the unit's callback as they come instead of returning a gradient for the
    leaf: autograd's split would assemble that one (the unit's size, in fresh memory) and pad it (again), only
    for it to be copied into the reduce-scatter's buffer.
    """

    @staticmethod
    def forward(ctx: Any, full: torch.Tensor, unit: Unit, on_grad: GradCallback) -> tuple[torch.Tensor, ...]:
        ctx.unit, ctx.on_grad = unit, on_grad
        ctx.set_materialize_grads(False)  # a parameter that got no gradient comes as None
        split: Any = full[: unit.layout.total].split  # untyped in torch's stubs
        views = split(list(unit.layout.numels))
        return tuple(v.view(ref.shape) for ref, v in zip(unit.params, views, strict=True))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[None, None, None]:
        ctx.on_grad(ctx.unit, grads)
        return None, None, None


class Unit:
    """A module whose parameters (those no unit nested in it owns) are sharded as one flat buffer.

    ``shard`` is this rank's ``1 / world_size`` of the flat parameters, in the master dtype (the parameters'
    own, float32 for mixed precision): the optimizer's parameter. Before the module runs, the shards are
    all-gathered into ``buffer`` (compute dtype) and the module's attributes are set to views of it; afterwards
    the buffer's storage is emptied (its memory kept in ``spare`` for the next gather on the CPU), so the views
    autograd saved stay valid and get their data back when the buffer is gathered again before backward (torch
    FSDP resizes the storage to zero and back).
    """

    def __init__(
        self,
        index: int,
        module: torch.nn.Module,
        params: list[ParamRef],
        values: list[torch.Tensor],
        comm: Comm,
        *,
        spare: SpareMemory,
        compute_dtype: torch.dtype,
        reduce_dtype: torch.dtype,
        reshard_after_forward: bool,
    ) -> None:
        self.index = index
        self.module = module
        self.params = params
        self.comm = comm
        self.spare = spare
        self.layout: FlatLayout = layout_of([v.numel() for v in values], comm.world_size)
        self.offsets = self.layout.offsets()
        self.compute_dtype = compute_dtype
        self.reduce_dtype = reduce_dtype
        self.reshard_after_forward = reshard_after_forward
        master = values[0].dtype
        device = values[0].device
        flat = torch.zeros(self.layout.padded, dtype=master, device=device)
        with torch.no_grad():
            for v, off in zip(values, self.offsets, strict=True):
                flat[off : off + v.numel()].copy_(v.detach().reshape(-1))
        self.flat_init = flat  # the whole flat buffer, until ``take_shard`` (after rank 0's values were taken)
        self.shard = torch.nn.Parameter(torch.empty(0, dtype=master, device=device))
        self.buffer = torch.empty(self.layout.padded, dtype=compute_dtype, device=device)
        self._nbytes = self.buffer.untyped_storage().nbytes()
        self.buffer.untyped_storage().resize_(0)  # its first gather allocates; later ones reuse ``spare``'s
        self.state = UnitState.FREE
        self._gather: Pending | None = None
        self.full: torch.Tensor | None = None  # this forward's leaf: views of it are the module's parameters
        self.backward_started = False
        # between uses the attributes are meta tensors of the right shape: reading their values raises instead
        # of touching freed memory (use ``full_state_dict()`` for the values); made once, set at every free
        self._metas = [torch.empty(ref.shape, dtype=compute_dtype, device="meta") for ref in params]
        self._placeholders()

    # ----- construction -----

    def take_shard(self) -> None:
        """Keep only this rank's part of the flat parameters (called once they hold rank 0's values)."""
        n, r = self.layout.shard_numel, self.comm.rank
        self.shard.data = self.flat_init[r * n : (r + 1) * n].clone()
        del self.flat_init

    def pieces(self) -> list[Piece]:
        """The part of each of the unit's parameters that this rank's shard holds, in parameter order."""
        return self.layout.pieces(self.comm.rank)

    # ----- gather and free -----

    def start_gather(self) -> None:
        """Start the all-gather of every rank's shard into ``buffer`` (nothing if gathered or in flight)."""
        if self.state is not UnitState.FREE:
            return
        src = self.shard.detach()
        if src.dtype != self.compute_dtype:
            src = src.to(self.compute_dtype)
        self.spare.fill(self.buffer.untyped_storage(), self._nbytes)
        self._gather = self.comm.all_gather(self.buffer, src)
        self.state = UnitState.GATHERING

    def wait_gather(self) -> None:
        """Make sure ``buffer`` holds the gathered parameters."""
        self.start_gather()
        if self._gather is not None:
            pending, self._gather = self._gather, None
            pending.wait()
        self.state = UnitState.READY

    def free(self) -> None:
        """Give the gathered buffer's memory back (waiting first for an all-gather still writing into it)."""
        if self.state is UnitState.FREE:
            return
        if self._gather is not None:
            pending, self._gather = self._gather, None
            pending.wait()
        self.spare.empty(self.buffer.untyped_storage())
        self.state = UnitState.FREE
        self._placeholders()

    # ----- the module's view of its parameters -----

    def bind(self, on_grad: GradCallback | None) -> None:
        """Point the module's parameter attributes at views of the gathered buffer.

        With ``on_grad`` (a forward that records a graph), the views come through ``_GatheredParams`` from a leaf
        tensor over the buffer's storage (its own version counter, so re-gathering before backward is not an
        in-place change autograd objects to): ``on_grad(unit, grads)`` runs once every parameter's gradient is
        there, with them as they are (no flat gradient is assembled: ``write_gradient`` puts them straight into
        the reduce-scatter's buffer). A unit used twice in one forward keeps the first leaf and gets its two
        gradient contributions in two calls.
        """
        if self.full is None:
            full = torch.empty(0, dtype=self.compute_dtype, device=self.buffer.device)
            full.set_(self.buffer.untyped_storage(), 0, (self.layout.padded,), (1,))
            self.full = full.requires_grad_(on_grad is not None)
        if on_grad is None:
            split: Any = self.full.detach()[: self.layout.total].split  # untyped in torch's stubs
            views = [v.view(ref.shape) for ref, v in zip(self.params, split(list(self.layout.numels)), strict=True)]
        else:
            apply: Any = _GatheredParams.apply  # untyped in torch's stubs
            views = list(apply(self.full, self, on_grad))
        self._set_attributes(views)

    def write_gradient(self, flat: torch.Tensor, grads: Sequence[torch.Tensor | None]) -> None:
        """Lay the parameters' gradients end to end into ``flat`` (padded size), in ``flat``'s dtype.

        A parameter that got no gradient gets zeros, and so does the padding.
        """
        with torch.no_grad():
            for g, off, n in zip(grads, self.offsets, self.layout.numels, strict=True):
                if g is None:
                    flat[off : off + n].zero_()
                else:
                    flat[off : off + n].view(g.shape).copy_(g)
            flat[self.layout.total :].zero_()

    def end_iteration(self) -> None:
        """Forget this iteration's leaf (its gradient was taken or will not come)."""
        self.full = None
        self.backward_started = False

    def _placeholders(self) -> None:
        self._set_attributes(self._metas)

    def _set_attributes(self, tensors: list[torch.Tensor]) -> None:
        """Point every slot of each parameter at its tensor.

        The slots are plain attributes (their parameters were taken out of ``_parameters``): set in the instance
        dict, as ``Module.__setattr__`` ends up doing after its checks, once per parameter and use.
        """
        for ref, t in zip(self.params, tensors, strict=True):
            for module, attr in ref.slots:
                module.__dict__[attr] = t

    # ----- sizes -----

    def gathered_bytes(self) -> int:
        """Bytes of the gathered buffer (also while an all-gather into it is in flight)."""
        return int(self.buffer.untyped_storage().nbytes())

    def resident_bytes(self) -> int:
        """Bytes of this rank's shard and its gradient (what stays between steps)."""
        n = self.shard.numel() * self.shard.element_size()
        grad = self.shard.grad
        return n + (0 if grad is None else grad.numel() * grad.element_size())
