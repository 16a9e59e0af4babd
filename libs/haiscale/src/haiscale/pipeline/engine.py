"""The pipeline engine: one stage's module run over micro-batches in a schedule, with DDP across replicas."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

from haiscale.ddp import DistributedDataParallel
from haiscale.pipeline import schedule as sched
from haiscale.pipeline.transport import StageLink, TransferError
from hfreduce.distributed import node_key
from hfreduce.errors import PeerFailureError

logger = logging.getLogger(__name__)

Schedule = Callable[[int, int, int], list[sched.Action]]
_instances = [0]  # pipelines made in this process: the failure record's key (every rank makes them in one order)


class PipelineFailure(RuntimeError):
    """A step failed because a rank of the job failed; every rank that notices names the same one.

    Attributes:
        rank: global rank of the rank that failed first (the root cause, as recorded in the job's store).
        stage: this rank's stage; step: this rank's step count when it noticed.
    """

    def __init__(self, message: str, *, rank: int, stage: int, step: int) -> None:
        super().__init__(message)
        self.rank = rank
        self.stage = stage
        self.step = step


@dataclasses.dataclass
class StepStats:
    """What the last ``forward_backward`` measured on this stage.

    ``busy_s`` is the time spent in this stage's forward and backward compute (receives, sends and waits
    excluded); ``started``/``finished`` are ``time.monotonic()`` stamps (one clock for every process of a
    machine), so the step's span over all stages is ``max(finished) - min(started)``. Activation bytes are the
    bytes of the tensors autograd saved for backward (parameters excluded) plus the stage inputs held, summed
    over the micro-batches in flight.
    """

    busy_s: float = 0.0
    started: float = 0.0
    finished: float = 0.0
    peak_activation_bytes: int = 0
    peak_in_flight: int = 0
    offset_s: float = 0.0
    send_times: list[float] = dataclasses.field(default_factory=list)

    @property
    def wall_s(self) -> float:
        """Seconds from the step's start to its end on this rank."""
        return self.finished - self.started


@dataclasses.dataclass
class _Micro:
    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]
    loss: torch.Tensor | None
    nbytes: int


class Pipeline(torch.nn.Module):
    """One stage of a pipeline: runs its module over ``chunks`` micro-batches in ``schedule`` order.

    Use ``GPipe`` or ``PipeDream``; both take the same arguments.

    Args:
        module: this stage's layers (``partition(...)``), plain or wrapped in haiscale's
            ``DistributedDataParallel`` over the stage's DP group: gradients then accumulate over the
            micro-batches and are averaged over the replicas once, in the step's last backward.
        chunks: micro-batches per step; the batch size must be a multiple of it.
        process_group: the pipeline group (``make_subgroups``' ``pp_group``): its rank is the stage.
        offset_replicas: the paper's NIC fix (§V): replicas of a stage that share a node (ranks of the
            module's DP group on the same node, by ``FF_HFREDUCE_NODE_RANK``, torchrun's ``GROUP_RANK`` or
            the hostname) start their steps offset by a fraction of a micro-batch's time at the first stage
            (the ``k``-th of ``n`` replicas on a node by ``k / n`` of the last step's forward and backward
            time per micro-batch), so their sends to the next node do not all leave at once. Results are
            unchanged: only the start moves.
        dp_group: the DP group for ``offset_replicas`` when ``module`` is not a haiscale DDP wrapper.
    """

    schedule: Schedule = staticmethod(sched.one_f_one_b)

    def __init__(
        self,
        module: torch.nn.Module,
        chunks: int,
        process_group: Any = None,
        *,
        offset_replicas: bool = False,
        dp_group: Any = None,
    ) -> None:
        super().__init__()
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"the pipeline runs a torch.nn.Module, got {type(module).__name__}")
        if isinstance(module, torch.nn.parallel.DistributedDataParallel):
            raise TypeError(
                "wrap the stage in haiscale.ddp.DistributedDataParallel, not torch's: torch DDP decides at each "
                "forward whether the next backward reduces, which interleaved micro-batches (1F1B) break"
            )
        if not isinstance(chunks, int) or chunks < 1:
            raise ValueError(f"chunks (micro-batches per step) must be a positive int, got {chunks!r}")
        if not dist.is_initialized():
            raise RuntimeError("the pipeline needs torch.distributed: call init_process_group(...) first")
        self.module = module
        self.chunks = chunks
        self.process_group = process_group if process_group is not None else dist.group.WORLD
        self._link = StageLink(self.process_group)
        self.stage, self.num_stages = self._link.stage, self._link.num_stages
        self.stats = StepStats()
        self._steps = 0
        self._slot_s = 0.0  # forward + backward time per micro-batch at this stage, last step
        self._ddp = module if isinstance(module, DistributedDataParallel) else None
        self._param_ptrs = {p.data_ptr() for p in module.parameters()}
        self._failure_key = f"haiscale-pipeline/{_instances[0]}/failed"
        _instances[0] += 1
        self._offset_index, self._offset_count = 0, 1
        if offset_replicas:
            group = dp_group if dp_group is not None else (self._ddp.process_group if self._ddp else None)
            self._offset_index, self._offset_count = _place_on_node(group)

    @property
    def is_first_stage(self) -> bool:
        """Whether this rank runs stage 0, the one that takes the inputs."""
        return self.stage == 0

    @property
    def is_last_stage(self) -> bool:
        """Whether this rank runs the last stage, the one that computes the loss and returns outputs."""
        return self.stage == self.num_stages - 1

    # ----- public -----

    def forward_backward(
        self,
        *inputs: torch.Tensor,
        criterion: Callable[..., torch.Tensor] | None = None,
        labels: Sequence[torch.Tensor] = (),
        return_outputs: bool = False,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """One training step's forwards and backwards over ``chunks`` micro-batches.

        Pass the same arguments on every stage, as HaiScale's examples do: the first stage splits the batch into
        micro-batches along dim 0 (the others receive their inputs from the previous stage, and only check the
        batch), the last splits the labels. The last stage computes ``criterion(*outputs,
        *labels_of_the_micro_batch)`` per micro-batch and back-propagates it as it is: a criterion that should
        average over the step divides by ``chunks`` itself (as HaiScale's examples' ``GPTLoss(chunks)``).
        After it returns, the parameters' ``.grad`` hold the step's gradients (averaged over the replicas
        under DDP); call the optimizer as usual.

        Returns:
            ``(losses, outputs)``: on the last stage the micro-batches' losses (a tensor of ``chunks``
            values, detached) and, with ``return_outputs``, the outputs concatenated along dim 0; ``None``
            elsewhere.

        Raises:
            ValueError: a batch that ``chunks`` does not divide, or no ``criterion`` on the last stage.
            PipelineFailure: a rank of the job failed (names it); the groups are unusable afterwards.
        """
        # every stage checks what it is given, so that a bad call fails on every stage before anything is sent
        if criterion is None:
            raise ValueError("forward_backward needs criterion= (on every stage; the last one computes the loss)")
        xs = _split_or_empty(inputs, self.chunks, "input", needed=self.is_first_stage)
        ys = _split_or_empty(tuple(labels), self.chunks, "label", needed=self.is_last_stage)
        actions = type(self).schedule(self.chunks, self.stage, self.num_stages)
        # inside the DDP wrapper's no_sync() (accumulation over steps) no backward of this step reduces
        reduce = self._ddp.reducer.sync_enabled if self._ddp is not None else False
        run = _Run(xs, ys, criterion, len([a for a in actions if a.kind == "B"]), reduce)
        self.stats = StepStats(started=time.monotonic(), peak_in_flight=sched.peak_in_flight(actions))
        try:
            self._offset()
            for action in actions:
                if action.kind == "F":
                    self._forward(run, action.micro)
                else:
                    self._backward(run, action.micro)
            self._link.wait_sends()
        except BaseException as exc:
            raise self._failed(exc) from exc
        finally:
            if self._ddp is not None:
                self._ddp.reducer.sync_enabled = reduce
        self.stats.finished = time.monotonic()
        self._slot_s = self.stats.busy_s / self.chunks
        self._steps += 1
        if not self.is_last_stage:
            return None, None
        losses = torch.stack(run.losses)
        outputs = torch.cat(run.outputs) if return_outputs else None
        return losses, outputs

    def forward(self, *inputs: torch.Tensor) -> Any:
        """Forwards only (evaluation), micro-batch by micro-batch; the last stage returns the outputs.

        They come concatenated along dim 0 (a tuple if the model returns several tensors); the other stages return
        ``None``.
        """
        xs = _split_or_empty(inputs, self.chunks, "input", needed=self.is_first_stage)
        outs: list[list[torch.Tensor]] = []
        try:
            for x in xs:
                args = x if self.is_first_stage else self._link.recv_activations()
                out = _as_list(self.module(*args))
                if self.is_last_stage:
                    outs.append([o.detach() for o in out])
                else:
                    self._link.send_activations(out)
            self._link.wait_sends()
        except BaseException as exc:
            raise self._failed(exc) from exc
        if not self.is_last_stage:
            return None
        joined = [torch.cat(parts) for parts in zip(*outs, strict=True)]
        return joined[0] if len(joined) == 1 else tuple(joined)

    # ----- one micro-batch -----

    def _forward(self, run: _Run, i: int) -> None:
        inputs = run.xs[i] if self.is_first_stage else self._link.recv_activations()
        if self._ddp is not None:  # the step's first forward prepares the reducer (and broadcasts buffers)
            self._ddp.reducer.sync_enabled = run.reduce and run.forwards == 0
        run.forwards += 1
        saved: dict[int, int] = {}
        started = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(self._pack(saved), _unpack):
            outputs = _as_list(self.module(*inputs))
            loss = run.criterion(*outputs, *run.ys[i]) if self.is_last_stage else None
        self.stats.busy_s += time.perf_counter() - started
        for t in inputs:
            saved.setdefault(t.data_ptr(), t.numel() * t.element_size())
        nbytes = sum(saved.values())
        if self.is_last_stage:
            if loss is None or not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                raise ValueError(f"the criterion must return a one-element tensor, got {loss!r}")
            run.losses.append(loss.detach().reshape(()))
            run.outputs.append(outputs[0].detach())
        else:
            self.stats.send_times.append(time.monotonic())
            self._link.send_activations(outputs)
        run.live[i] = _Micro(inputs, outputs, loss, nbytes)
        run.live_bytes += nbytes
        self.stats.peak_activation_bytes = max(self.stats.peak_activation_bytes, run.live_bytes)

    def _backward(self, run: _Run, i: int) -> None:
        micro = run.live.pop(i)
        if micro.loss is not None:
            roots, grads = [micro.loss], None
        else:
            roots = [o for o in micro.outputs if o.requires_grad]
            grads = self._link.recv_grads(roots) if roots else None
        run.backwards += 1
        if self._ddp is not None:  # gradients accumulate locally; the step's last backward reduces them
            self._ddp.reducer.sync_enabled = run.reduce and run.backwards == run.total_backwards
        started = time.perf_counter()
        if roots:
            torch.autograd.backward(roots, grad_tensors=grads)
        self.stats.busy_s += time.perf_counter() - started
        run.live_bytes -= micro.nbytes
        if not self.is_first_stage:
            wanted = [t for t in micro.inputs if t.requires_grad]
            self._link.send_grads([t.grad if t.grad is not None else torch.zeros_like(t) for t in wanted])

    def _pack(self, saved: dict[int, int]) -> Callable[[torch.Tensor], torch.Tensor]:
        def pack(t: torch.Tensor) -> torch.Tensor:
            ptr = t.data_ptr()
            if ptr not in self._param_ptrs:
                saved.setdefault(ptr, t.numel() * t.element_size())
            return t

        return pack

    # ----- the NIC offset -----

    def _offset(self) -> None:
        if not self.is_first_stage or self._offset_index == 0 or self._slot_s <= 0:
            return
        delay = self._slot_s * self._offset_index / self._offset_count
        time.sleep(delay)
        self.stats.offset_s = delay

    # ----- failures -----

    def _failed(self, exc: BaseException) -> BaseException:
        """Name the rank that failed first: the neighbour or replica this rank saw fail, or an earlier one.

        The job's store may already record an earlier failure (a rank that saw the first one records it before it
        stops); that one wins.
        """
        me = dist.get_rank()
        culprit = self._culprit(exc)
        if culprit is None:
            if not isinstance(exc, Exception):
                return exc  # KeyboardInterrupt, SystemExit: not this library's to report
            culprit = me  # this rank itself failed (its module or criterion raised): the others will name it
        root = self._record(culprit)
        if root == me and culprit == me:
            return exc
        what = "this rank" if root == me else f"rank {root}"
        return PipelineFailure(
            f"pipeline step {self._steps} failed on rank {me} (stage {self.stage}): {what} failed first; "
            f"here: {type(exc).__name__}: {exc}",
            rank=root,
            stage=self.stage,
            step=self._steps,
        )

    def _culprit(self, exc: BaseException) -> int | None:
        if isinstance(exc, TransferError):
            return exc.peer
        for cause in _chain(exc):
            if isinstance(cause, PeerFailureError):  # from haiscale DDP's reduction over the DP group
                # hfreduce numbers the group's ranks node by node: the DP group's own ranks when each node's
                # ranks are consecutive (make_subgroups' layout)
                group = self._ddp.process_group if self._ddp is not None else None
                return dist.get_global_rank(group, cause.rank) if group is not None else cause.rank
        return None

    def _record(self, culprit: int) -> int:
        """The job-wide first failed rank: ``culprit`` unless another rank recorded one first."""
        try:
            store = dist.distributed_c10d._get_default_store()
            first = store.compare_set(self._failure_key, "", str(culprit))
            return int(first) if first else culprit
        except Exception:  # the store's host is gone (rank 0 died): this rank's own view is all there is
            logger.warning("cannot read the failure record; naming rank %d as seen here", culprit)
            return culprit


class GPipe(Pipeline):
    """GPipe: all the step's forwards, then all its backwards (``Pipeline`` has the arguments)."""

    schedule = staticmethod(sched.gpipe)


class PipeDream(Pipeline):
    """PipeDream's 1F1B with a flush per step: at most ``num_stages - stage`` micro-batches' activations live.

    Warm-up forwards, then one forward and one backward in turn, then the remaining backwards
    (``Pipeline`` has the arguments).
    """

    schedule = staticmethod(sched.one_f_one_b)


@dataclasses.dataclass
class _Run:
    xs: list[list[torch.Tensor]]
    ys: list[list[torch.Tensor]]
    criterion: Callable[..., torch.Tensor]
    total_backwards: int
    reduce: bool  # the step's last backward averages the gradients over the replicas (DDP, not in no_sync)
    forwards: int = 0
    backwards: int = 0
    live_bytes: int = 0
    live: dict[int, _Micro] = dataclasses.field(default_factory=dict)
    losses: list[torch.Tensor] = dataclasses.field(default_factory=list)
    outputs: list[torch.Tensor] = dataclasses.field(default_factory=list)


def split_batch(tensors: Sequence[Any], chunks: int, what: str) -> list[list[torch.Tensor]]:
    """``tensors`` cut into ``chunks`` micro-batches along dim 0: micro-batch ``i`` has every tensor's ``i``-th slice.

    Raises:
        ValueError: no tensor, a tensor without a batch dimension, different batch sizes, or a batch size
            that ``chunks`` does not divide.
        TypeError: an item is not a tensor.
    """
    if not tensors:
        raise ValueError(f"no {what} tensor given: the first stage needs the batch, the last the labels")
    sizes = set()
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{what} {i} is {type(t).__name__}, the pipeline splits tensors")
        if t.dim() == 0:
            raise ValueError(f"{what} {i} is a scalar: it has no batch dimension to split")
        sizes.add(t.shape[0])
    if len(sizes) > 1:
        raise ValueError(f"the {what} tensors have different batch sizes {sorted(sizes)}")
    batch = sizes.pop()
    if batch % chunks:
        raise ValueError(f"chunks={chunks} does not divide the {what} batch of {batch} samples")
    parts = [t.chunk(chunks) for t in tensors]
    return [[p[i] for p in parts] for i in range(chunks)]


def _split_or_empty(tensors: Sequence[Any], chunks: int, what: str, *, needed: bool) -> list[list[torch.Tensor]]:
    if tensors or needed:
        return split_batch(tensors, chunks, what)
    return [[] for _ in range(chunks)]


def _as_list(out: Any) -> list[torch.Tensor]:
    return list(out) if isinstance(out, tuple | list) else [out]


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: BaseException | None = exc
    while seen is not None:
        yield seen
        seen = seen.__cause__ or seen.__context__


def _place_on_node(group: Any) -> tuple[int, int]:
    """(index among the group's ranks on this node, how many of them there are)."""
    if group is None:
        return 0, 1
    mine = node_key(os.environ, socket.gethostname())
    everyone: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    me = dist.get_rank(group)
    same = [r for r, key in enumerate(everyone) if key == mine]
    return same.index(me), len(same)
