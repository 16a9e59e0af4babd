"""``DistributedDataParallel``: torch DDP's constructor and behaviour, with hfreduce doing the reduction."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from haiscale.ddp import heap
from haiscale.ddp.buckets import ParamInfo, cap_bytes_of, plan_buckets
from haiscale.ddp.buffers import BufferBroadcaster
from haiscale.ddp.groups import SharedGroup, acquire_group, check_same_parameters, resolve_process_group
from haiscale.ddp.reducer import _HFREDUCE_DTYPES, Reducer
from haiscale.telemetry import StepMetrics, default_sink

_PREFIX = "module."


class DistributedDataParallel(torch.nn.Module):
    """Data parallelism over hfreduce, a drop-in for ``torch.nn.parallel.DistributedDataParallel``.

    Wrap a model after ``torch.distributed.init_process_group(...)``; the hfreduce group is derived from
    ``process_group`` (default: the default group): its ranks, its nodes, its store for the rendezvous.
    At construction every rank checks that all ranks hold the same parameters (names, shapes, dtypes),
    then takes rank 0's parameter and buffer values. Gradients are averaged over the group during
    backward, bucket by bucket (see ``Reducer``); ``backward()`` returns with the averaged gradients.

    Args:
        module: the model; its parameters must be on one device (CPU, or one GPU) and float32, float16 or
            bfloat16.
        device_ids: None for a CPU model; for a GPU model None or ``[its device]``, as torch DDP.
        output_device: None or the model's device (outputs stay where the model puts them).
        dim: must be 0 (accepted for torch DDP's signature; inputs are never scattered).
        broadcast_buffers: give every rank rank 0's buffers (e.g. BatchNorm statistics) before each forward
            whose backward is reduced.
        init_sync: take rank 0's parameters (frozen ones too) and buffers at construction.
        process_group: a torch ``ProcessGroup`` (gloo, nccl, ...); anything else is a TypeError.
        bucket_cap_mb: bucket size in MiB (default 25); a larger parameter gets a bucket of its own.
        find_unused_parameters: allow parameters that get no gradient in a backward; their gradient counts
            as zero on that rank, and one that no rank used keeps ``.grad`` None if it was None.
        check_reduction: ignored (deprecated in torch too).
        gradient_as_bucket_view: True (the default here; torch's is False): each ``.grad`` is a view into
            its bucket, so nothing is copied; False: ``.grad`` is a tensor of its own, copied into the
            bucket and back.
        static_graph: accepted; nothing depends on it.
        overlap: reduce each bucket as soon as it is full, during backward (default); False: reduce all
            buckets after backward (for measuring the overlap's gain).
        keep_freed_memory: for a CPU model, make glibc malloc keep freed memory in the process
            (``haiscale.ddp.heap.keep_freed_memory``: process-wide and lasting), so the gradients autograd
            allocates every backward are not page-faulted in again at every step (default True).

    Step time, allreduce wait and bytes go to the task's telemetry (``haiscale.telemetry``).
    """

    def __init__(
        self,
        module: torch.nn.Module,
        device_ids: Sequence[int | torch.device] | None = None,
        output_device: int | torch.device | None = None,
        dim: int = 0,
        broadcast_buffers: bool = True,
        init_sync: bool = True,
        process_group: Any = None,
        bucket_cap_mb: float | None = None,
        find_unused_parameters: bool = False,
        check_reduction: bool = False,
        gradient_as_bucket_view: bool = True,
        static_graph: bool = False,
        *,
        overlap: bool = True,
        keep_freed_memory: bool = True,
    ) -> None:
        super().__init__()
        named = _trainable(module)
        device = _check_device(named, device_ids, output_device)
        if dim != 0:
            raise ValueError(f"haiscale DDP does not scatter inputs: dim must be 0, got {dim}")
        pg = resolve_process_group(process_group)
        check_same_parameters(pg, named)
        if keep_freed_memory and device.type == "cpu":
            heap.keep_freed_memory()
        self.module = module
        self.device = device
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.static_graph = static_graph
        self.process_group = pg
        self._shared: SharedGroup = acquire_group(pg)
        specs = plan_buckets([_info(p) for _, p in named], cap_bytes_of(bucket_cap_mb))
        self.reducer = Reducer(
            self._shared.group,
            named,
            specs,
            find_unused_parameters=find_unused_parameters,
            grads_as_views=gradient_as_bucket_view,
            overlap=overlap,
            on_stop=self._shared.release,
            metrics=StepMetrics(default_sink()),
        )
        buffers = [b for _, b in module.named_buffers()]
        self._buffers_sync = BufferBroadcaster(self._shared.group, buffers)
        if init_sync:
            self.reducer.broadcast_params(self._shared.src_rank)
            frozen = [p for p in module.parameters() if not p.requires_grad]
            BufferBroadcaster(self._shared.group, frozen + buffers).broadcast(self._shared.src_rank)
        self.reducer.attach_grads()

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        """Run the wrapped module; when the backward will reduce, first ready the reducer and sync the buffers.

        With ``broadcast_buffers``, buffers are broadcast from the torch group's rank 0 before each such forward,
        as torch DDP does.
        """
        if torch.is_grad_enabled() and self.reducer.sync_enabled:
            self.reducer.prepare()
            if self.broadcast_buffers:
                self._buffers_sync.broadcast(self._shared.src_rank)
        return self.module(*inputs, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate gradients locally; the first backward after it reduces them all."""
        previous = self.reducer.sync_enabled
        self.reducer.sync_enabled = False
        try:
            yield
        finally:
            self.reducer.sync_enabled = previous

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any:
        """Load a state dict saved from this wrapper or from the bare model: whichever form matches more keys.

        The wrapper's keys start with ``module.``, as torch DDP's; the bare model's are what
        ``model.module.state_dict()`` gives, as HaiScale's examples save.
        """
        return super().load_state_dict(_with_prefix(state_dict, self.state_dict().keys()), strict, assign)


def _trainable(module: Any) -> list[tuple[str, torch.nn.Parameter]]:
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"haiscale DDP wraps a torch.nn.Module, got {type(module).__name__}")
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    if not named:
        raise RuntimeError(
            "haiscale DDP: the module has no parameter that requires a gradient; there is nothing to reduce"
        )
    for name, p in named:
        if p.dtype not in _HFREDUCE_DTYPES:
            raise TypeError(f"haiscale DDP reduces float32, float16 and bfloat16 parameters; {name!r} is {p.dtype}")
        if p.is_sparse:
            raise TypeError(f"haiscale DDP does not reduce sparse parameters ({name!r})")
    return named


def _check_device(
    named: list[tuple[str, torch.nn.Parameter]],
    device_ids: Sequence[int | torch.device] | None,
    output_device: int | torch.device | None,
) -> torch.device:
    devices = {p.device for _, p in named}
    if len(devices) > 1:
        raise ValueError(f"haiscale DDP needs the module's parameters on one device, found {sorted(map(str, devices))}")
    device = devices.pop()
    wanted = [torch.device(d) if not isinstance(d, int) else torch.device("cuda", d) for d in device_ids or []]
    if device.type == "cpu" and wanted:
        raise ValueError(f"device_ids must be None for a module on the CPU, got {list(device_ids or [])}")
    if len(wanted) > 1 or (wanted and wanted[0] != device):
        raise ValueError(f"device_ids must be None or [the module's device {device}], got {list(device_ids or [])}")
    if output_device is not None:
        out = torch.device("cuda", output_device) if isinstance(output_device, int) else torch.device(output_device)
        if out != device:
            raise ValueError(f"output_device must be None or the module's device {device}, got {out}")
    return device


def _info(p: torch.nn.Parameter) -> ParamInfo:
    return ParamInfo(numel=p.numel(), itemsize=p.element_size(), kind=f"{p.dtype}@{p.device}")


def _with_prefix(state_dict: Mapping[str, Any], own_keys: Any) -> Mapping[str, Any]:
    own = set(own_keys)
    as_given = sum(k in own for k in state_dict)
    prefixed = sum(_PREFIX + k in own for k in state_dict)
    if prefixed > as_given:
        out = type(state_dict)() if isinstance(state_dict, dict) else {}
        for k, v in state_dict.items():
            out[_PREFIX + k] = v
        if hasattr(state_dict, "_metadata"):
            out._metadata = {  # type: ignore[attr-defined]
                (_PREFIX + k if k else "module"): v for k, v in state_dict._metadata.items()
            }
        return out
    return state_dict


__all__ = ["DistributedDataParallel"]
