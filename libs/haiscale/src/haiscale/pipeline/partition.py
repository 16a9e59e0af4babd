"""Cutting a sequential model into pipeline stages: ``SequentialModel`` and ``partition``."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch


class SequentialModel(torch.nn.Sequential):
    """``torch.nn.Sequential`` whose layers may take and return several tensors.

    A layer that returns a tuple hands its items to the next layer as positional arguments (a layer returning
    one tensor hands it as the only argument), so models whose blocks pass ``(x, mask, ...)`` along can be cut
    into stages by ``partition``. The model's output is the last layer's: one tensor, or a tuple.
    """

    def forward(self, *args: Any) -> Any:
        """Run the layers in order, each on the previous one's outputs as positional arguments."""
        for layer in self:
            out = layer(*args)
            args = out if isinstance(out, tuple) else (out,)
        return args[0] if len(args) == 1 else args


def stage_bounds(num_layers: int, pp_size: int, balance: Sequence[int] | None = None) -> list[tuple[int, int]]:
    """The ``[start, end)`` layer range of every stage.

    Stage ``s`` gets ``balance[s]`` layers, or without ``balance`` a share as even as possible (the first stages
    take one more when the layers do not divide).

    Raises:
        ValueError: ``pp_size`` below 1, more stages than layers, or a ``balance`` that does not have one
            positive count per stage summing to ``num_layers``.
    """
    if pp_size < 1:
        raise ValueError(f"pp_size must be at least 1, got {pp_size}")
    if balance is None:
        if pp_size > num_layers:
            raise ValueError(f"cannot cut {num_layers} layers into {pp_size} stages (each needs at least one)")
        base, extra = divmod(num_layers, pp_size)
        counts = [base + (1 if s < extra else 0) for s in range(pp_size)]
    else:
        counts = [int(c) for c in balance]
        if len(counts) != pp_size:
            raise ValueError(f"balance {counts} has {len(counts)} entries, there are {pp_size} stages (pp_size)")
        if any(c < 1 for c in counts):
            raise ValueError(f"balance {counts}: every stage needs at least one layer")
        if sum(counts) != num_layers:
            raise ValueError(f"balance {counts} sums to {sum(counts)} layers, the model has {num_layers}")
    bounds, start = [], 0
    for c in counts:
        bounds.append((start, start + c))
        start += c
    return bounds


def partition(
    model: torch.nn.Module, pp_rank: int, pp_size: int, balance: Sequence[int] | None = None
) -> SequentialModel:
    """The layers of ``model`` that stage ``pp_rank`` of ``pp_size`` runs, as a ``SequentialModel``.

    Layers keep their names in the model (``"3"`` for the fourth layer of an ``nn.Sequential``), so a stage's
    ``state_dict()`` keys are the full model's keys for those layers.

    Args:
        model: a ``torch.nn.Sequential`` (``SequentialModel`` included).
        pp_rank: this stage, in ``[0, pp_size)`` (``pp_group.rank()``).
        pp_size: the number of stages (``pp_group.size()``).
        balance: layers per stage; default as even as possible.

    Raises:
        TypeError: ``model`` is not a ``torch.nn.Sequential``.
        ValueError: ``pp_rank`` out of range, or a ``balance`` that does not fit (see ``stage_bounds``).
    """
    if not isinstance(model, torch.nn.Sequential):
        raise TypeError(
            f"partition cuts a torch.nn.Sequential (or haiscale.pipeline.SequentialModel), got {type(model).__name__}"
        )
    if not 0 <= pp_rank < pp_size:
        raise ValueError(f"pp_rank {pp_rank} not in [0, {pp_size})")
    start, end = stage_bounds(len(model), pp_size, balance)[pp_rank]
    named = list(model.named_children())[start:end]
    return SequentialModel(OrderedDict(named))
