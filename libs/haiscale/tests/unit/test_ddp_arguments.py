"""Bad constructor arguments are refused before any collective, naming the problem; state dict keys."""

from __future__ import annotations

import collections

import pytest
import torch

from haiscale.ddp import DistributedDataParallel
from haiscale.ddp.wrapper import _with_prefix


def test_a_module_without_trainable_parameters_is_refused() -> None:
    frozen = torch.nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(RuntimeError, match="no parameter that requires a gradient"):
        DistributedDataParallel(frozen)
    with pytest.raises(RuntimeError, match="no parameter that requires a gradient"):
        DistributedDataParallel(torch.nn.ReLU())


def test_a_process_group_that_is_not_a_torch_group_is_refused() -> None:
    with pytest.raises(TypeError, match=r"process_group must be a torch\.distributed ProcessGroup.*got str"):
        DistributedDataParallel(torch.nn.Linear(2, 2), process_group="gloo")


def test_without_init_process_group_the_error_says_what_to_call() -> None:
    with pytest.raises(RuntimeError, match=r"call torch.distributed.init_process_group\(...\) before wrapping"):
        DistributedDataParallel(torch.nn.Linear(2, 2))


def test_devices_dtypes_and_dim_are_checked() -> None:
    with pytest.raises(ValueError, match="device_ids must be None for a module on the CPU"):
        DistributedDataParallel(torch.nn.Linear(2, 2), device_ids=[0])
    with pytest.raises(ValueError, match="output_device must be None or the module's device cpu"):
        DistributedDataParallel(torch.nn.Linear(2, 2), output_device="cuda:0")
    with pytest.raises(TypeError, match=r"'weight' is torch\.float64"):
        DistributedDataParallel(torch.nn.Linear(2, 2).double())
    with pytest.raises(ValueError, match="dim must be 0"):
        DistributedDataParallel(torch.nn.Linear(2, 2), dim=1)
    with pytest.raises(TypeError, match=r"wraps a torch\.nn\.Module, got function"):
        DistributedDataParallel(lambda x: x)  # type: ignore[arg-type]


def test_state_dict_keys_with_or_without_the_wrapper_prefix_load() -> None:
    own = ["module.w", "module.b"]
    bare = collections.OrderedDict(w=1, b=2)
    bare._metadata = {"": {"version": 1}}  # type: ignore[attr-defined]
    mapped = _with_prefix(bare, own)
    assert list(mapped) == own and mapped._metadata == {"module": {"version": 1}}  # type: ignore[attr-defined]
    prefixed = {"module.w": 1, "module.b": 2}
    assert _with_prefix(prefixed, own) is prefixed
    # a model whose own top-level submodule is called "module": keys that already match stay as they are
    nested = ["module.module.w"]
    assert list(_with_prefix({"module.w": 1}, nested)) == ["module.module.w"]
    assert list(_with_prefix({"module.module.w": 1}, nested)) == ["module.module.w"]
