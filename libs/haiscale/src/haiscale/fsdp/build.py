"""From a module and a wrap plan to units: which parameters each unit owns, checked before anything changes."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from haiscale.fsdp.unit import ParamRef

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclasses.dataclass
class Owned:
    """The trainable parameters one unit module owns (not owned by a unit nested in it), in module order."""

    module: torch.nn.Module
    params: list[ParamRef]
    values: list[torch.nn.Parameter]


def resolve_process_group(process_group: Any) -> Any:
    """``process_group``, or the default group.

    Raises:
        TypeError: not a torch ``ProcessGroup``.
        RuntimeError: no default group, this rank is not a member, or the group was destroyed.
    """
    if process_group is None:
        if not dist.is_initialized():
            raise RuntimeError(
                "haiscale FSDP: call torch.distributed.init_process_group(...) before wrapping the model "
                "(or pass process_group=)"
            )
        return c10d._get_default_group()
    if process_group is dist.GroupMember.NON_GROUP_MEMBER:
        raise RuntimeError("haiscale FSDP: this rank is not a member of process_group")
    if not isinstance(process_group, dist.ProcessGroup):
        raise TypeError(
            "haiscale FSDP: process_group must be a torch.distributed ProcessGroup (from init_process_group or "
            f"new_group), got {type(process_group).__name__}"
        )
    if process_group not in c10d._world.pg_map:
        raise RuntimeError("haiscale FSDP: process_group is not registered with torch.distributed (destroyed?)")
    return process_group


def assign_params(root: torch.nn.Module, unit_modules: list[torch.nn.Module]) -> list[Owned]:
    """Give each trainable parameter to the innermost unit module that contains it.

    Returns one ``Owned`` per unit module that owns at least one parameter, in ``unit_modules`` order.

    Raises:
        ValueError: a parameter (tied weights) is reached from two units: they must be in one unit.
        TypeError: a trainable parameter is not floating point, or is sparse.
    """
    units = {id(m): i for i, m in enumerate(unit_modules)}
    owner_of: dict[int, int] = {}  # id(param) -> unit index
    refs: dict[int, tuple[list[str], list[tuple[torch.nn.Module, str]], torch.nn.Parameter]] = {}
    order: list[int] = []

    def visit(module: torch.nn.Module, prefix: str, owner: int) -> None:
        owner = units.get(id(module), owner)
        for attr, p in module._parameters.items():
            if p is None or not p.requires_grad:
                continue
            name = prefix + attr
            if p.dtype not in _FLOAT_DTYPES or p.is_sparse:
                kind = "sparse" if p.is_sparse else str(p.dtype)
                raise TypeError(
                    f"haiscale FSDP shards dense float32, float16 and bfloat16 parameters; {name!r} is {kind}"
                )
            seen = owner_of.setdefault(id(p), owner)
            if seen != owner:
                first = refs[id(p)][0][0]
                raise ValueError(
                    f"haiscale FSDP: parameter {name!r} is the same tensor as {first!r} but in another unit "
                    "(tied weights): wrap so that both modules are in one unit"
                )
            names, slots, _ = refs.setdefault(id(p), ([], [], p))
            if id(p) not in order:
                order.append(id(p))
            if all(m is not module or a != attr for m, a in slots):
                slots.append((module, attr))
            if name not in names:
                names.append(name)
        for child_name, child in module._modules.items():
            if child is not None:
                visit(child, f"{prefix}{child_name}.", owner)

    visit(root, "", units[id(root)])
    owned = [Owned(m, [], []) for m in unit_modules]
    for pid in order:
        names, slots, p = refs[pid]
        o = owned[owner_of[pid]]
        o.params.append(ParamRef(tuple(names), tuple(slots), p.shape))
        o.values.append(p)
    return [o for o in owned if o.params]


def check_devices(owned: list[Owned]) -> torch.device:
    """The one device every trainable parameter is on.

    Raises:
        ValueError: parameters on several devices.
    """
    devices = {p.device for o in owned for p in o.values}
    if len(devices) != 1:
        raise ValueError(
            f"haiscale FSDP needs the module's parameters on one device, found {sorted(map(str, devices))}"
        )
    return devices.pop()


def check_same_units(pg: Any, owned: list[Owned]) -> None:
    """Every rank of ``pg`` has the same units with the same parameters (names, shapes, dtypes, in order).

    Raises:
        RuntimeError: names the first rank, unit and parameter that differ from rank 0's (all ranks raise).
    """
    mine = [[(r.name, list(r.shape), str(v.dtype)) for r, v in zip(o.params, o.values, strict=True)] for o in owned]
    everyone: list[Any] = [None] * dist.get_world_size(pg)
    dist.all_gather_object(everyone, mine, group=pg)
    reference = everyone[0]
    for rank, theirs in enumerate(everyone[1:], start=1):
        if len(theirs) != len(reference):
            raise RuntimeError(f"haiscale FSDP: rank {rank} has {len(theirs)} units, rank 0 {len(reference)}")
        for unit, (a, b) in enumerate(zip(reference, theirs, strict=True)):
            for x, y in zip(a, b, strict=False):
                if x != y:
                    raise RuntimeError(
                        f"haiscale FSDP: rank {rank}'s parameters differ from rank 0's in unit {unit}: "
                        f"{y[0]!r} {y[1]} {y[2]} there, {x[0]!r} {x[1]} {x[2]} on rank 0"
                    )
            if len(a) != len(b):
                raise RuntimeError(
                    f"haiscale FSDP: rank {rank}'s unit {unit} has {len(b)} parameters, rank 0's {len(a)}"
                )
