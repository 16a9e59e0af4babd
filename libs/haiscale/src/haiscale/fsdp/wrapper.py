"""``FullyShardedDataParallel``: ZeRO-3 over any torch.distributed process group (hfreduce's backend, gloo, nccl)."""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.utils import _pytree as pytree

from haiscale.fsdp import state as state_fns
from haiscale.fsdp.build import Owned, assign_params, check_devices, check_same_units, resolve_process_group
from haiscale.fsdp.comm import Comm, HFReduceComm, Pending, TorchComm, broadcast
from haiscale.fsdp.flat import layout_of
from haiscale.fsdp.memory import SpareMemory
from haiscale.fsdp.unit import Unit
from haiscale.fsdp.wrap import WrapPolicy, plan_units

OptimizerFactory = Callable[[list[torch.nn.Parameter]], Any]


@dataclasses.dataclass(frozen=True)
class MixedPrecision:
    """Which dtypes FSDP computes and reduces in; the shards keep the parameters' own dtype (the fp32 masters).

    Compute in ``param_dtype`` (the gathered parameters, and floating inputs of the wrapped module when
    ``cast_inputs``), reduce gradients in ``reduce_dtype`` (default: ``param_dtype``, as torch FSDP), keep the
    shards, their gradients and the optimizer state in the parameters' own dtype.
    """

    param_dtype: torch.dtype = torch.bfloat16
    reduce_dtype: torch.dtype | None = None
    cast_inputs: bool = True

    def __post_init__(self) -> None:
        for what, dt in (("param_dtype", self.param_dtype), ("reduce_dtype", self.reduce_dtype)):
            if dt is not None and dt not in (torch.float32, torch.float16, torch.bfloat16):
                raise ValueError(f"MixedPrecision.{what} must be float32, float16 or bfloat16, got {dt}")


class FullyShardedDataParallel(torch.nn.Module):
    """Fully sharded data parallelism (ZeRO-3, the paper's HaiScale FSDP) over a torch process group.

    The module is split into units (``auto_wrap_policy`` picks submodules; the root takes the rest). Each rank
    keeps ``1 / world_size`` of every unit's parameters as one flat shard (``parameters()`` of this wrapper:
    give them to the optimizer), so parameters, gradients and optimizer state are all sharded. Before a
    unit's forward its shards are all-gathered, and freed after it; again before its backward. With
    ``prefetch`` the next unit's all-gather (in the previous iteration's order) starts while this unit
    computes. When a unit's backward is done its gradient is reduce-scattered (averaged) into its shard's
    ``.grad``, while backward goes on; ``backward()`` returns once all have arrived.

    Args:
        module: the model; trainable parameters float32, float16 or bfloat16 on one device. Frozen
            parameters and buffers stay as they are (replicated), taken from rank 0 with ``sync_module_states``.
        process_group: a torch ``ProcessGroup`` (default: the default group): ``hfreduce``, gloo, nccl.
        auto_wrap_policy: ``ModuleWrapPolicy`` (by class), ``SizeWrapPolicy`` (by size), or a callable
            ``(module, unwrapped_numel) -> bool``; None: the whole model is one unit.
        mixed_precision: a ``MixedPrecision`` (bf16 compute, fp32 masters); None: compute in the parameters'
            dtype.
        prefetch: overlap the next unit's all-gather with this unit's compute, in forward and backward.
        step_in_backward: ``make_optimizer(params) -> optimizer``: one optimizer per unit, stepped (then its
            gradient dropped) as soon as that unit's gradient shard arrives, during backward (the paper's split
            optimizer step); ``optimizers`` lists them. Then do not call ``step()`` yourself, and gradients are
            not accumulated over several backwards nor visible after backward (no clipping by global norm).
        sync_module_states: start every rank from rank 0's parameters and buffers.
        collectives: ``"hfreduce"`` (default): all-gathers and reduce-scatters as allreduces of hfreduce
            registered buffers, over an hfreduce group formed from ``process_group`` (as haiscale DDP does;
            a few buffers per unit size are kept, ``comm.registered_bytes()``); ``"torch"``: the process
            group's own ``all_gather_single``/``reduce_scatter_single`` (e.g. NCCL on GPUs).

    Original parameter attributes (``model.layer.weight``) hold the gathered values only while their unit
    runs; between uses they are meta tensors (shape and dtype only). Use ``state_dict()``/``full_state_dict()``
    or ``sharded_state_dict()`` for the values.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        process_group: Any = None,
        *,
        auto_wrap_policy: WrapPolicy | None = None,
        mixed_precision: MixedPrecision | None = None,
        prefetch: bool = True,
        step_in_backward: OptimizerFactory | None = None,
        sync_module_states: bool = True,
        collectives: str = "hfreduce",
    ) -> None:
        super().__init__()
        _check_arguments(module, mixed_precision, step_in_backward, collectives)
        owned = assign_params(module, plan_units(module, auto_wrap_policy))
        if not owned:
            raise RuntimeError("haiscale FSDP: the module has no parameter that requires a gradient; nothing to shard")
        self.device = check_devices(owned)
        pg = resolve_process_group(process_group)
        check_same_units(pg, owned)  # every check before anything changes
        self.module = module
        self.process_group = pg
        self.mixed_precision = mixed_precision
        self.prefetch = prefetch
        self.comm = self._make_comm(collectives, owned)
        self.spare_memory = SpareMemory()
        self._state_keys = list(module.state_dict(keep_vars=True).keys())
        self.units = [self._make_unit(i, o) for i, o in enumerate(owned)]
        for unit in self.units:
            if sync_module_states:
                broadcast(pg, unit.flat_init)
            unit.take_shard()
        if sync_module_states:
            with torch.no_grad():
                for t in [p for p in module.parameters() if not p.requires_grad] + list(module.buffers()):
                    broadcast(pg, t.data)
        self.flat_params = torch.nn.ParameterList([u.shard for u in self.units])
        self.optimizers: list[Any] = []
        if step_in_backward is not None:
            self.optimizers = [step_in_backward([u.shard]) for u in self.units]
        self._fwd_order: list[Unit] = []
        self._cur_fwd: list[Unit] = []
        self._bwd_order: list[Unit] = []
        self._cur_bwd: list[Unit] = []
        self._pending: collections.deque[tuple[Unit, Pending, torch.Tensor]] = collections.deque()
        self._callback_queued = False
        self._failed: BaseException | None = None
        self._handles = []
        for unit in self.units:
            self._handles.append(unit.module.register_forward_pre_hook(self._pre_forward_hook(unit)))
            self._handles.append(unit.module.register_forward_hook(self._post_forward_hook(unit)))

    def _dtypes(self, master: torch.dtype) -> tuple[torch.dtype, torch.dtype]:
        """(compute, reduce) dtypes of a unit whose parameters are ``master``."""
        mp = self.mixed_precision
        compute = mp.param_dtype if mp else master
        return compute, ((mp.reduce_dtype or compute) if mp else master)

    def _make_comm(self, collectives: str, owned: list[Owned]) -> Comm:
        if collectives == "torch":
            return TorchComm(self.process_group)
        world = dist.get_world_size(self.process_group)
        sizes = []
        for o in owned:
            padded = layout_of([v.numel() for v in o.values], world).padded
            sizes += [(padded, dt) for dt in self._dtypes(o.values[0].dtype)]
        return HFReduceComm.over(self.process_group, sizes)

    def _make_unit(self, index: int, owned: Owned) -> Unit:
        """Take the unit's parameters out of their modules into a ``Unit`` (its flat buffer, not yet sharded)."""
        compute, reduce = self._dtypes(owned.values[0].dtype)
        for ref in owned.params:
            for mod, attr in ref.slots:
                del mod._parameters[attr]
        return Unit(
            index,
            owned.module,
            owned.params,
            [v.detach() for v in owned.values],
            self.comm,
            spare=self.spare_memory,
            compute_dtype=compute,
            reduce_dtype=reduce,
            reshard_after_forward=owned.module is not self.module,
        )

    # ----- forward -----

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the wrapped module (floating inputs cast to ``param_dtype`` under mixed precision with ``cast_inputs``).

        Raises:
            RuntimeError: a collective failed before (the model is unusable), or the previous backward's
                reductions are still in flight.
        """
        self._begin_forward()
        mp = self.mixed_precision
        if mp is not None and mp.cast_inputs:
            args, kwargs = _cast_floats((args, kwargs), mp.param_dtype)
        return self.module(*args, **kwargs)

    def _begin_forward(self) -> None:
        if self._failed is not None:
            raise RuntimeError(f"haiscale FSDP: unusable after a failed collective: {self._failed}")
        if self._pending:
            raise RuntimeError(
                "haiscale FSDP: a forward started while the previous backward's reductions are in flight"
            )
        for unit in self.units:  # a forward without backward leaves the root gathered: its values may be stale
            unit.end_iteration()
            unit.free()
        if self._cur_fwd:
            self._fwd_order, self._cur_fwd = self._cur_fwd, []

    def _pre_forward_hook(self, unit: Unit) -> Callable[..., None]:
        def hook(_module: torch.nn.Module, _args: Any) -> None:
            if unit not in self._cur_fwd:
                self._cur_fwd.append(unit)
            self._guard(unit.wait_gather)
            if self.prefetch:
                nxt = _after(self._fwd_order, unit)
                if nxt is not None:
                    self._guard(nxt.start_gather)
            unit.bind(self._on_grad if torch.is_grad_enabled() else None)

        return hook

    def _post_forward_hook(self, unit: Unit) -> Callable[..., Any]:
        def hook(_module: torch.nn.Module, _args: Any, output: Any) -> Any:
            recording = torch.is_grad_enabled()
            if recording:
                for t in pytree.tree_leaves(output):
                    if isinstance(t, torch.Tensor) and t.requires_grad:
                        register: Any = t.register_hook  # untyped in torch's stubs
                        register(self._pre_backward_hook(unit))
            if not recording or (unit.reshard_after_forward and unit is not self._kept_for_backward()):
                unit.free()
            return output

        return hook

    def _kept_for_backward(self) -> Unit | None:
        """The unit whose forward runs last and whose backward runs first (by the previous iteration's orders).

        It stays gathered from its forward to its backward, as freeing it would only gather it again at once
        (one all-gather a step fewer; the peak is the same, backward starts by gathering it).
        """
        if not self._fwd_order:
            return None
        first = next((u for u in self._bwd_order if u.reshard_after_forward), None)
        return first if first is self._fwd_order[-1] else None

    # ----- backward -----

    def _pre_backward_hook(self, unit: Unit) -> Callable[[torch.Tensor], None]:
        def hook(_grad: torch.Tensor) -> None:
            self._queue_callback()
            self._guard(unit.wait_gather)  # also after a recomputing forward (activation checkpointing) freed it
            if unit.backward_started:
                return
            unit.backward_started = True
            self._cur_bwd.append(unit)
            if self.prefetch:
                nxt = _after(self._bwd_order, unit)
                if nxt is not None:
                    self._guard(nxt.start_gather)

        return hook

    def _on_grad(self, unit: Unit, grads: Sequence[torch.Tensor | None]) -> None:
        """A unit's gradient is complete (its parameters are used no more in this backward): reduce-scatter it.

        Then free the gathered parameters, and with step-in-backward step the shards whose gradients have arrived.
        """
        self._queue_callback()
        if all(g is None for g in grads):
            return
        with torch.no_grad():
            out = torch.empty(unit.layout.shard_numel, dtype=unit.reduce_dtype, device=unit.buffer.device)
            write = functools.partial(unit.write_gradient, grads=grads)
            started = self._guard(lambda: self.comm.reduce_scatter_mean(out, write, unit.layout.padded))
            self._pending.append((unit, started, out))
        unit.free()
        if self.optimizers:
            self._drain(block=False)

    def _queue_callback(self) -> None:
        if not self._callback_queued:
            engine: Any = torch.autograd.Variable._execution_engine
            engine.queue_callback(self._finish_backward)
            self._callback_queued = True

    def _finish_backward(self) -> None:
        """Autograd's end-of-backward callback: wait for the gradients still in flight; free what is gathered."""
        self._callback_queued = False
        self._drain(block=True)
        for unit in self.units:
            unit.free()
            unit.end_iteration()
        self._bwd_order, self._cur_bwd = self._cur_bwd, []

    def _drain(self, *, block: bool) -> None:
        """Hand arrived gradient shards to ``.grad`` (in the order they were started); with ``block`` all."""
        while self._pending:
            unit, pending, out = self._pending[0]
            if not block and not pending.done():
                return
            self._pending.popleft()
            self._guard(pending.wait)
            with torch.no_grad():
                g = out if out.dtype == unit.shard.dtype else out.to(unit.shard.dtype)
                if unit.shard.grad is None:
                    unit.shard.grad = g
                else:
                    unit.shard.grad.add_(g)
            if self.optimizers:
                opt = self.optimizers[unit.index]
                opt.step()
                unit.shard.grad = None

    def _guard(self, fn: Callable[[], Any]) -> Any:
        """Run a collective step; after a failure (a peer died) the wrapper refuses further use."""
        try:
            return fn()
        except BaseException as exc:
            self._failed = exc
            self._pending.clear()
            raise

    # ----- state -----

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The model's own ``state_dict()`` keys and values, gathered (every rank gets all of it; a collective)."""
        return state_fns.full_state_dict(self)

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        """``full_state_dict()`` (the bare model's keys, as torch FSDP's default full state dict)."""
        if args or kwargs:
            raise TypeError("haiscale FSDP: state_dict() takes no arguments; use full_state_dict()")
        return self.full_state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any:
        """Load a full state dict (the bare model's keys); each rank keeps its shards' part."""
        if not strict or assign:
            raise ValueError("haiscale FSDP: load_state_dict supports strict=True, assign=False only")
        state_fns.load_full_state_dict(self, state_dict)

    def sharded_state_dict(self) -> dict[str, Any]:
        """This rank's part: ``haiscale.checkpoint.Shard`` views of its shards, one per parameter, plus buffers.

        Each ``Shard`` has the parameter's global shape and flat offset: ``checkpoint.save``/``load`` with it on any
        world size (load fills in place).
        """
        return state_fns.sharded_state_dict(self)

    def full_optim_state_dict(self, optimizers: Any) -> dict[str, Any]:
        """The optimizer state (one optimizer, or the ``step_in_backward`` list) per parameter name, gathered."""
        return state_fns.full_optim_state_dict(self, _as_list(optimizers))

    def load_full_optim_state_dict(self, optimizers: Any, state: Mapping[str, Any]) -> None:
        """Put a ``full_optim_state_dict()`` into the optimizers; each rank keeps its shards' part.

        Raises:
            KeyError: ``state`` has some but not all of a unit's parameters.
            ValueError: a tensor's shape is not its parameter's, or no optimizer given holds a unit's shard.
        """
        state_fns.load_full_optim_state_dict(self, _as_list(optimizers), state)

    def sharded_optim_state_dict(self, optimizers: Any) -> dict[str, Any]:
        """This rank's part of the optimizer state per parameter name (``Shard``s; scalars as they are)."""
        return state_fns.sharded_optim_state_dict(self, _as_list(optimizers))

    def load_sharded_optim_state_dict(self, optimizers: Any, state: Mapping[str, Any]) -> None:
        """Put a loaded sharded optimizer state into the optimizers.

        Its tensors are ``Shard``s, or whole tensors that ``checkpoint.load(..., allocate_missing=True)`` made for
        an optimizer that had no state yet.
        """
        state_fns.load_sharded_optim_state_dict(self, _as_list(optimizers), state)

    def close(self) -> None:
        """Remove the hooks, release the hfreduce group (closed with its last user) and spare memory. Idempotent."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.comm.close()
        self.spare_memory.release()

    # ----- sizes -----

    def resident_bytes(self, optimizers: Any = None) -> int:
        """This rank's bytes of parameter shards, their gradients and (given) optimizer state."""
        total = sum(u.resident_bytes() for u in self.units)
        for opt in _as_list(optimizers) if optimizers is not None else self.optimizers:
            for u in self.units:
                for v in opt.state.get(u.shard, {}).values():
                    if isinstance(v, torch.Tensor):
                        total += v.numel() * v.element_size()
        return total

    def gathered_bytes(self) -> int:
        """Bytes of gathered parameters right now (buffers, and all-gathers in flight)."""
        return sum(u.gathered_bytes() for u in self.units)


def _check_arguments(module: Any, mixed_precision: Any, step_in_backward: Any, collectives: Any) -> None:
    if collectives not in ("hfreduce", "torch"):
        raise ValueError(f"collectives must be 'hfreduce' or 'torch', got {collectives!r}")
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"haiscale FSDP wraps a torch.nn.Module, got {type(module).__name__}")
    if any(isinstance(m, FullyShardedDataParallel) for m in module.modules()):
        raise ValueError("haiscale FSDP: the module already contains a FullyShardedDataParallel; wrap once")
    if mixed_precision is not None and not isinstance(mixed_precision, MixedPrecision):
        raise TypeError(f"mixed_precision must be a haiscale.fsdp.MixedPrecision, got {mixed_precision!r}")
    if step_in_backward is not None and not callable(step_in_backward):
        raise TypeError(f"step_in_backward must be callable (params) -> optimizer, got {step_in_backward!r}")


def _after(order: list[Unit], unit: Unit) -> Unit | None:
    for i, u in enumerate(order[:-1]):
        if u is unit:
            return order[i + 1]
    return None


def _cast_floats(tree: Any, dtype: torch.dtype) -> Any:
    def cast(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            return x.to(dtype)
        return x

    return pytree.tree_map(cast, tree)


def _as_list(optimizers: Any) -> list[Any]:
    if isinstance(optimizers, Iterable) and not hasattr(optimizers, "state"):
        return list(optimizers)
    return [optimizers]


__all__ = ["FullyShardedDataParallel", "MixedPrecision"]
