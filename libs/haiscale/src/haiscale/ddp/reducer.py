"""The gradient reducer: buckets in hfreduce registered buffers, reduced from backward hooks as they fill."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from haiscale.ddp.buckets import BucketSpec, LaunchOrder
from haiscale.telemetry import StepMetrics
from hfreduce import Group, Work

logger = logging.getLogger(__name__)

_HFREDUCE_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


class Reducer:
    """Averages the gradients of ``params`` over an hfreduce group, overlapping with backward.

    Each bucket is one buffer (on the CPU an hfreduce registered buffer, reduced with no copy in or out; on a
    GPU a device tensor, which hfreduce stages through pinned host memory) and, with ``grads_as_views``, each
    parameter's ``.grad`` is a view into it, so autograd accumulates straight into the bucket. A hook after
    each gradient's accumulation marks it ready; a full bucket's allreduce (AVG) is queued at once on
    hfreduce's collective thread, buckets in index order on every rank, except the last, which fills when
    backward has nothing left to overlap with. At the end of backward (an autograd callback) the reducer
    reduces the last bucket on the calling thread and waits for the buckets still in flight, so ``backward()``
    returns with reduced gradients, as with torch DDP.

    Not thread-safe: one backward at a time (autograd's CPU engine runs hooks on the calling thread).
    """

    def __init__(
        self,
        group: Group,
        named_params: Sequence[tuple[str, torch.nn.Parameter]],
        buckets: Sequence[BucketSpec],
        *,
        find_unused_parameters: bool,
        grads_as_views: bool,
        overlap: bool,
        on_stop: Callable[[], None] | None = None,
        metrics: StepMetrics | None = None,
    ) -> None:
        self.group = group
        self.names = [n for n, _ in named_params]
        self.params = [p for _, p in named_params]
        self.specs = list(buckets)
        self.find_unused_parameters = find_unused_parameters
        self.grads_as_views = grads_as_views
        self.overlap = overlap
        self.sync_enabled = True
        self._on_stop = on_stop
        self.metrics = metrics if metrics is not None else StepMetrics(None)
        self._order = LaunchOrder(self.specs, len(self.params))
        self.buckets = [self._alloc(spec) for spec in self.specs]
        self._last = len(self.buckets) - 1
        self._bucket_bytes = sum(b.numel() * b.element_size() for b in self.buckets)
        self._wire_seen = 0  # hfreduce's sent + received when the last reduced step ended (telemetry on)
        self.views: list[torch.Tensor] = [torch.empty(0)] * len(self.params)
        for spec, bucket in zip(self.specs, self.buckets, strict=True):
            for s in spec.slots:
                self.views[s.param] = bucket[s.offset : s.offset + s.numel].view(self.params[s.param].shape)
        self._flags = self._alloc_flags() if find_unused_parameters else None
        self._works: list[Work] = []
        self._used_since_sync = [False] * len(self.params)
        self._fresh = [False] * len(self.params)  # grad was None before this step: stays None if unused everywhere
        self._callback_queued = False
        self._stopped = False
        self._handles = [_register(p, self._hook(i)) for i, p in enumerate(self.params)]

    # ----- setup -----

    def _alloc(self, spec: BucketSpec) -> torch.Tensor:
        param = self.params[spec.slots[0].param]
        if param.device.type == "cpu":
            buf: torch.Tensor = self.group.alloc(spec.numel, _HFREDUCE_DTYPES[param.dtype], as_torch=True)
            return buf
        return torch.zeros(spec.numel, dtype=param.dtype, device=param.device)

    def _alloc_flags(self) -> torch.Tensor:
        device = self.params[0].device
        if device.type == "cpu":
            flags: torch.Tensor = self.group.alloc(len(self.params), "float32", as_torch=True)
            return flags
        return torch.zeros(len(self.params), dtype=torch.float32, device=device)

    def broadcast_params(self, src: int) -> None:
        """Give every rank ``src``'s parameter values, bucket by bucket (the buckets serve as staging)."""
        with torch.no_grad():
            for spec, bucket in zip(self.specs, self.buckets, strict=True):
                for s in spec.slots:
                    self.views[s.param].copy_(self.params[s.param])
                self.group.broadcast(bucket, src=src)
                for s in spec.slots:
                    self.params[s.param].copy_(self.views[s.param])
                bucket.zero_()

    def attach_grads(self) -> None:
        """Move gradients the module already has into their bucket slots (None stays None)."""
        if not self.grads_as_views:
            return
        with torch.no_grad():
            for view, p in zip(self.views, self.params, strict=True):
                if p.grad is not None and not _same(p.grad, view):
                    view.copy_(p.grad)
                    p.grad = view

    # ----- per step -----

    def prepare(self) -> None:
        """Before a forward whose backward will be reduced.

        A ``.grad`` that ``zero_grad()`` set to None stays None: autograd then hands over a fresh gradient and
        the hook copies it into its slot (one pass over it), which costs less than zero-filling the slot for
        autograd to add into (a fill, then a pass reading both).
        """
        self._check_usable()
        if self._works:
            raise RuntimeError("haiscale DDP: a forward started while the previous backward's reduction is in flight")
        self.metrics.step_started()

    def _hook(self, index: int) -> Callable[[torch.Tensor], None]:
        def hook(_param: torch.Tensor) -> None:
            self._on_grad(index)

        return hook

    def _on_grad(self, index: int) -> None:
        if self._stopped:
            raise RuntimeError("haiscale DDP: backward after reducer.stop(); the reducer no longer reduces")
        self._used_since_sync[index] = True
        if not self.sync_enabled:
            return  # no_sync(): gradients accumulate in place, nothing is reduced
        if not self._callback_queued:
            engine: Any = torch.autograd.Variable._execution_engine
            engine.queue_callback(self._finish_backward)
            self._callback_queued = True
        if self._order.is_ready(index):
            raise RuntimeError(
                f"haiscale DDP: parameter {self.names[index]!r} got its gradient twice in one backward "
                "(reentrant backward or activation checkpointing through the DDP module is not supported)"
            )
        self._place(index)
        launch = self._order.mark_ready(index)
        if self.overlap:
            self._launch([b for b in launch if b != self._last])  # the last one runs at the end, on this thread

    def _place(self, index: int) -> None:
        """Make sure the bucket slot holds the parameter's gradient (a copy only if autograd replaced it).

        Inside backward grad mode is off (unless ``create_graph``), so ``no_grad()`` is entered only when it is
        on: entering and leaving it costs more than the copy of a small gradient.
        """
        if torch.is_grad_enabled():
            with torch.no_grad():
                self._place_now(index)
        else:
            self._place_now(index)

    def _place_now(self, index: int) -> None:
        p, view = self.params[index], self.views[index]
        grad = p.grad
        if grad is None:
            view.zero_()
            self._fresh[index] = True
            if self.grads_as_views:
                p.grad = view
        elif not _same(grad, view):
            view.copy_(grad)
            if self.grads_as_views:
                p.grad = view

    def _launch(self, indices: Sequence[int]) -> None:
        for b in indices:
            self._works.append(self.group.allreduce_async(self.buckets[b], "avg"))

    def _reduce_rest(self) -> None:
        """Reduce the buckets not launched yet (at least the last), in order, on this thread.

        Once the last bucket is full backward has nothing left to overlap with, so it is not handed to the
        collective thread (a wake-up there, another here when it is done, both threads taking turns at the GIL):
        ``Group.allreduce`` runs it here when nothing is queued, and queues it behind the others and waits
        otherwise, so every rank still issues the buckets in index order.
        """
        for b in range(len(self._works), len(self.buckets)):  # _works: the buckets launched, in order
            self.group.allreduce(self.buckets[b], "avg")

    def _finish_backward(self) -> None:
        """Autograd's end-of-backward callback: the remaining buckets, then wait for all of them."""
        self._callback_queued = False
        try:
            missing = self._order.unready()
            if missing and not self.find_unused_parameters:
                raise RuntimeError(_unused_message([self.names[i] for i in missing]))
            for i in missing:
                with torch.no_grad():
                    self._place(i)  # a parameter unused here contributes what its grad holds (zero after zero_grad)
                self._order.mark_ready(i)
            waited = time.perf_counter()
            try:
                self._reduce_rest()
            except BaseException:
                for work in self._works:  # a bucket in flight failed first: its error names the cause
                    work.wait()
                raise
            flags_work = self._launch_flags()
            works, self._works = self._works, []
            for work in works:
                work.wait()
            if flags_work is not None:
                flags_work.wait()
            waited = time.perf_counter() - waited
            self._publish()
            if self.metrics.enabled:
                self.metrics.reduced(waited, self._bucket_bytes, self._wire_delta())
        finally:
            self._works = []
            self._order.reset()

    def _wire_delta(self) -> int:
        """Bytes sent and received between nodes since the last reduced step (hfreduce's counters)."""
        c = self.group.counters()
        total = c.sent + c.received
        delta, self._wire_seen = total - self._wire_seen, total
        return delta

    def _launch_flags(self) -> Work | None:
        if self._flags is None:
            return None
        self._flags.copy_(torch.tensor(self._used_since_sync, dtype=torch.float32))
        return self.group.allreduce_async(self._flags, "max")

    def _publish(self) -> None:
        """Hand the reduced values to ``.grad``: copies only without views; unused-everywhere grads stay None."""
        unused = [] if self._flags is None else (self._flags == 0).nonzero().flatten().tolist()
        with torch.no_grad():
            if not self.grads_as_views:
                for i, p in enumerate(self.params):
                    if p.grad is None:
                        p.grad = self.views[i].clone()
                    else:
                        p.grad.copy_(self.views[i])
            for i in unused:
                if self._fresh[i]:
                    self.params[i].grad = None
        self._used_since_sync = [False] * len(self.params)
        self._fresh = [False] * len(self.params)

    # ----- lifetime -----

    def _check_usable(self) -> None:
        if self._stopped:
            raise RuntimeError("haiscale DDP: the reducer was stopped (reducer.stop()); wrap the model again")

    def stop(self) -> None:
        """Stop reducing: wait for what is in flight, remove the hooks, release the hfreduce group.

        The group is closed if this reducer holds the last reference to it. Gradients stay readable. Idempotent.
        """
        if self._stopped:
            return
        self._stopped = True
        self.metrics.flush()
        for handle in self._handles:
            handle.remove()
        try:
            for work in self._works:
                work.wait()
        finally:
            self._works = []
            if self._on_stop is not None:
                self._on_stop()

    @property
    def stopped(self) -> bool:
        """Whether ``stop()`` was called; a stopped reducer refuses to be used again."""
        return self._stopped


def _register(param: torch.nn.Parameter, hook: Callable[[torch.Tensor], None]) -> Any:
    register: Any = param.register_post_accumulate_grad_hook  # untyped in torch's stubs
    return register(hook)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.dtype == b.dtype


def _unused_message(names: list[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return (
        f"haiscale DDP: {len(names)} parameter(s) got no gradient in this backward: {shown}. Pass "
        "find_unused_parameters=True if parts of the model are not used in every step, or make sure the loss "
        "depends on every parameter that requires a gradient."
    )
