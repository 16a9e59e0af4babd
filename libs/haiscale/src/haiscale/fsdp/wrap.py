"""Auto-wrap policies: which submodules become units of their own (sharded, gathered and freed together)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

import torch

# A policy is asked bottom-up, for every submodule but the root: should ``module`` be a unit of its own, given
# the number of parameter elements in it that no unit below it took?
WrapPolicy = Callable[[torch.nn.Module, int], bool]


@dataclasses.dataclass(frozen=True)
class ModuleWrapPolicy:
    """Every submodule that is an instance of one of ``classes`` is a unit (e.g. the transformer block)."""

    classes: tuple[type[torch.nn.Module], ...]

    def __init__(self, classes: Iterable[type[torch.nn.Module]]) -> None:
        found = tuple(classes)
        for cls in found:
            if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
                raise TypeError(f"ModuleWrapPolicy takes torch.nn.Module subclasses, got {cls!r}")
        if not found:
            raise ValueError("ModuleWrapPolicy needs at least one module class")
        object.__setattr__(self, "classes", found)

    def __call__(self, module: torch.nn.Module, unwrapped_numel: int) -> bool:
        """Whether ``module`` is an instance of one of ``classes`` (its size does not matter)."""
        return isinstance(module, self.classes)


@dataclasses.dataclass(frozen=True)
class SizeWrapPolicy:
    """Wrap a submodule once it holds enough parameter elements (torch's ``size_based_auto_wrap_policy``).

    A submodule holding at least ``min_num_params`` parameter elements not taken by a unit below it is a unit.
    """

    min_num_params: int

    def __post_init__(self) -> None:
        if isinstance(self.min_num_params, bool) or not isinstance(self.min_num_params, int):
            raise TypeError(f"min_num_params must be an int, got {type(self.min_num_params).__name__}")
        if self.min_num_params < 1:
            raise ValueError(f"min_num_params must be at least 1, got {self.min_num_params}")

    def __call__(self, module: torch.nn.Module, unwrapped_numel: int) -> bool:
        """Whether ``unwrapped_numel`` (elements not taken by a unit below ``module``) reaches ``min_num_params``."""
        return unwrapped_numel >= self.min_num_params


def plan_units(root: torch.nn.Module, policy: WrapPolicy | None) -> list[torch.nn.Module]:
    """The modules that become units: the ones ``policy`` picks (children before parents), then ``root``.

    ``root`` takes every parameter no other unit took.

    Raises:
        TypeError: ``policy`` is not callable.
    """
    units: list[torch.nn.Module] = []
    if policy is not None:
        if not callable(policy):
            raise TypeError(f"auto_wrap_policy must be callable (module, unwrapped_numel) -> bool, got {policy!r}")
        for child in root.children():
            _visit(child, policy, units)
    units.append(root)
    return units


def _visit(module: torch.nn.Module, policy: WrapPolicy, units: list[torch.nn.Module]) -> int:
    """Visit ``module``'s subtree bottom-up; return its parameter elements not taken by a unit."""
    if any(m is module for m in units):  # a module reached twice (shared) is one unit
        return 0
    unwrapped = sum(p.numel() for p in module.parameters(recurse=False))
    for child in module.children():
        unwrapped += _visit(child, policy, units)
    if unwrapped and policy(module, unwrapped):
        units.append(module)
        return 0
    return unwrapped
