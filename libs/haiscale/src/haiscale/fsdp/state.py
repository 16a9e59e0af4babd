"""Full and sharded state dicts of an FSDP model and its optimizers, by the model's own parameter names."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from haiscale.checkpoint import Shard
from haiscale.fsdp.comm import TorchComm

if TYPE_CHECKING:
    from haiscale.fsdp.unit import Unit
    from haiscale.fsdp.wrapper import FullyShardedDataParallel as FSDP


def _gather(fsdp: FSDP, unit: Unit, shard: torch.Tensor) -> torch.Tensor:
    """Every rank's ``shard`` (a tensor shaped like the unit's shard) as the unit's padded flat tensor."""
    out = torch.empty(unit.layout.padded, dtype=shard.dtype, device=shard.device)
    # the process group's own all-gather: any dtype, no registered buffer (called between steps)
    TorchComm(fsdp.process_group).all_gather(out, shard.detach().contiguous()).wait()
    return out


def _unflatten(unit: Unit, flat: torch.Tensor) -> list[torch.Tensor]:
    """Each parameter's part of the unit's flat tensor, in its shape (copies: they outlive ``flat``)."""
    return [
        flat[off : off + ref.shape.numel()].view(ref.shape).clone()
        for ref, off in zip(unit.params, unit.offsets, strict=True)
    ]


def _my_part(unit: Unit, per_param: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """This rank's shard of the unit from each parameter's whole value (or from this rank's pieces)."""
    out = torch.zeros(unit.layout.shard_numel, dtype=dtype, device=unit.shard.device)
    for piece, value in zip(unit.pieces(), per_param, strict=True):
        flat = value.reshape(-1)  # the whole parameter's value, or (as many elements) already this rank's piece
        src = flat if flat.numel() == piece.numel else flat[piece.param_offset : piece.param_offset + piece.numel]
        out[piece.shard_offset : piece.shard_offset + piece.numel].copy_(src)
    return out


def _others(fsdp: FSDP) -> dict[str, torch.Tensor]:
    """Buffers and frozen parameters: what the module's own state dict still holds."""
    return dict(fsdp.module.state_dict())


# ----- model -----


def full_state_dict(fsdp: FSDP) -> dict[str, torch.Tensor]:
    """Every parameter gathered, plus the buffers, under the bare model's keys and in its order.

    A collective: every rank of the process group must call it, and every rank gets the whole state.
    """
    values: dict[str, torch.Tensor] = {}
    for unit in fsdp.units:
        for ref, value in zip(unit.params, _unflatten(unit, _gather(fsdp, unit, unit.shard)), strict=True):
            for name in ref.names:
                values[name] = value
    others = _others(fsdp)
    return {k: values[k] if k in values else others[k] for k in fsdp._state_keys}


def load_full_state_dict(fsdp: FSDP, state_dict: Mapping[str, Any]) -> None:
    """Check every key and shape first; then each rank copies its shards' part and the buffers.

    Raises:
        KeyError: a key of the model is missing, or the state dict has a key the model does not.
        ValueError: a tensor's shape differs from the model's.
    """
    missing = [k for k in fsdp._state_keys if k not in state_dict]
    if missing:
        raise KeyError(f"haiscale FSDP: the state dict lacks {missing[0]!r} ({len(missing)} missing keys)")
    extra = [k for k in state_dict if k not in set(fsdp._state_keys)]
    if extra:
        raise KeyError(f"haiscale FSDP: the state dict has {extra[0]!r}, which the model does not ({len(extra)} extra)")
    for unit in fsdp.units:
        for ref in unit.params:
            got = state_dict[ref.name]
            if not isinstance(got, torch.Tensor) or got.shape != ref.shape:
                shape = list(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
                raise ValueError(
                    f"haiscale FSDP: {ref.name!r} is {shape} in the state dict, {list(ref.shape)} in the model"
                )
    with torch.no_grad():
        for unit in fsdp.units:
            part = _my_part(unit, [state_dict[ref.name].detach() for ref in unit.params], unit.shard.dtype)
            unit.shard.copy_(part)
        others = _others(fsdp)
        fsdp.module.load_state_dict({k: state_dict[k] for k in others}, strict=True)


def sharded_state_dict(fsdp: FSDP) -> dict[str, Any]:
    """This rank's ``Shard`` of each parameter (a view of its flat shard: global shape, flat offset), plus buffers.

    No communication. The shards are views of the live parameters, not copies: the next optimizer step changes them.
    """
    shards: dict[str, Any] = {}
    for unit in fsdp.units:
        data = unit.shard.detach()
        for piece, ref in zip(unit.pieces(), unit.params, strict=True):
            local = data[piece.shard_offset : piece.shard_offset + piece.numel]
            shards[ref.name] = Shard(local, tuple(ref.shape), piece.param_offset)
    others = _others(fsdp)
    return {k: shards[k] if k in shards else others[k] for k in fsdp._state_keys if k in shards or k in others}


# ----- optimizers -----


def _state_of(optimizers: list[Any], unit: Unit) -> tuple[Any, dict[str, Any]]:
    """The optimizer holding the unit's shard, and its state for it (empty before its first step).

    Raises:
        ValueError: no optimizer has the shard among its parameters.
    """
    for opt in optimizers:
        if any(p is unit.shard for group in opt.param_groups for p in group["params"]):
            return opt, opt.state.get(unit.shard, {})
    raise ValueError(f"haiscale FSDP: no optimizer given holds unit {unit.index}'s parameters (fsdp.parameters())")


def _is_sharded(unit: Unit, value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.shape == unit.shard.shape


def full_optim_state_dict(fsdp: FSDP, optimizers: list[Any]) -> dict[str, Any]:
    """The optimizers' state per parameter name: shard-shaped tensors gathered and split, the rest copied to each.

    A collective (every rank calls it, every rank gets it all); a unit whose optimizer has no state yet is absent.

    Raises:
        ValueError: no optimizer given holds one of the units' shards.
    """
    out: dict[str, Any] = {}
    for unit in fsdp.units:
        _, st = _state_of(optimizers, unit)
        per_param: list[dict[str, Any]] = [{} for _ in unit.params]
        for key in sorted(st):
            value = st[key]
            if _is_sharded(unit, value):
                for entry, full in zip(per_param, _unflatten(unit, _gather(fsdp, unit, value)), strict=True):
                    entry[key] = full
            else:
                for entry in per_param:
                    entry[key] = value.clone() if isinstance(value, torch.Tensor) else value
        for ref, entry in zip(unit.params, per_param, strict=True):
            if entry:
                out[ref.name] = entry
    return out


def sharded_optim_state_dict(fsdp: FSDP, optimizers: list[Any]) -> dict[str, Any]:
    """This rank's optimizer state per parameter name: ``Shard`` views of shard-shaped tensors, scalars as they are.

    Raises:
        ValueError: no optimizer given holds one of the units' shards.
    """
    out: dict[str, Any] = {}
    for unit in fsdp.units:
        _, st = _state_of(optimizers, unit)
        for piece, ref in zip(unit.pieces(), unit.params, strict=True):
            entry: dict[str, Any] = {}
            for key in sorted(st):
                value = st[key]
                if _is_sharded(unit, value):
                    local = value.detach()[piece.shard_offset : piece.shard_offset + piece.numel]
                    entry[key] = Shard(local, tuple(ref.shape), piece.param_offset)
                else:
                    entry[key] = value
            if entry:
                out[ref.name] = entry
    return out


def _load_optim(fsdp: FSDP, optimizers: list[Any], state: Mapping[str, Any], what: str) -> None:
    plans: list[tuple[Any, Unit, dict[str, Any]]] = []
    for unit in fsdp.units:
        opt, _ = _state_of(optimizers, unit)
        entries = [state.get(ref.name) for ref in unit.params]
        if all(e is None for e in entries):
            continue
        absent = [ref.name for ref, e in zip(unit.params, entries, strict=True) if e is None]
        if absent:
            raise KeyError(f"haiscale FSDP: the {what} optimizer state lacks {absent[0]!r}")
        first: Mapping[str, Any] = entries[0]  # type: ignore[assignment]
        new: dict[str, Any] = {}
        for key, value in first.items():
            if isinstance(value, Shard) or (isinstance(value, torch.Tensor) and value.dim() > 0):
                parts = [_local(e[key], ref) for e, ref in zip(entries, unit.params, strict=True)]  # type: ignore[index]
                new[key] = _my_part(unit, parts, parts[0].dtype)
            else:
                new[key] = value.clone() if isinstance(value, torch.Tensor) else value
        plans.append((opt, unit, new))
    for opt, unit, new in plans:  # all checked: now change the optimizers
        opt.state[unit.shard] = new


def _local(value: Any, ref: Any) -> torch.Tensor:
    if isinstance(value, Shard):
        return value.local.detach()
    if not isinstance(value, torch.Tensor) or value.shape != ref.shape:
        raise ValueError(f"haiscale FSDP: optimizer state for {ref.name!r} is not a tensor of shape {list(ref.shape)}")
    return value.detach()


def load_full_optim_state_dict(fsdp: FSDP, optimizers: list[Any], state: Mapping[str, Any]) -> None:
    """Set the optimizers' state from ``full_optim_state_dict``'s form; each rank keeps its shards' part.

    Everything is checked before any optimizer changes; a unit with no entry in ``state`` keeps its state.

    Raises:
        KeyError: ``state`` has some but not all of a unit's parameters.
        ValueError: a tensor's shape is not its parameter's, or no optimizer holds a unit's shard.
    """
    _load_optim(fsdp, optimizers, state, "full")


def load_sharded_optim_state_dict(fsdp: FSDP, optimizers: list[Any], state: Mapping[str, Any]) -> None:
    """Set the optimizers' state from ``Shard``s (or whole tensors) per parameter name, as loaded by checkpoint.

    Everything is checked before any optimizer changes; a unit with no entry in ``state`` keeps its state.

    Raises:
        KeyError: ``state`` has some but not all of a unit's parameters.
        ValueError: a whole tensor's shape is not its parameter's, or no optimizer holds a unit's shard.
    """
    _load_optim(fsdp, optimizers, state, "sharded")
