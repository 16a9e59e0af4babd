"""The public surface: ``Group`` and its collectives (sync and async), on numpy arrays and torch tensors."""

from __future__ import annotations

import concurrent.futures
import math
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from hfreduce.agreement import CallSignature
from hfreduce.config import GroupConfig
from hfreduce.control import query_status
from hfreduce.counters import Counters
from hfreduce.group import Runtime
from hfreduce.node_memory import Registered
from hfreduce.reduction import DType, ReduceOp
from hfreduce.tensors import Flat, PinnedPool, address_view, flatten, is_torch

_DTYPE_NAMES = {"float32": DType.F32, "float16": DType.F16, "bfloat16": DType.BF16}
# A collective as ``Group`` queues it: its name (the control server's record), the buffer it writes, the body
# that runs it on the runtime, and the call every rank must make alike (checked before the body runs).
_Job = tuple[str, Flat, Callable[[], Counters], CallSignature]
_T = TypeVar("_T")


class Work:
    """Handle of an async collective. The buffer must not be touched until ``wait()`` returns."""

    def __init__(self, future: concurrent.futures.Future[None]) -> None:
        self._future = future

    def wait(self, timeout_s: float | None = None) -> None:
        """Block until done; re-raise the collective's error (e.g. PeerFailureError)."""
        self._future.result(timeout=timeout_s)

    def is_completed(self) -> bool:
        """True once the collective has ended, with or without an error (``wait()`` then returns at once)."""
        return self._future.done()

    def add_done_callback(self, fn: Callable[[BaseException | None], None]) -> None:
        """Call ``fn(error or None)`` once the collective ends, on the thread that ran it (or now, if it has)."""
        self._future.add_done_callback(lambda fut: fn(fut.exception()))


class Group:
    """One rank's membership of an hfreduce group; collectives must be called in the same order by all.

    Collectives run one at a time, in call order: ``x_async`` queues one on a background thread and returns a
    Work handle; ``x`` runs it on the calling thread when nothing is queued (no thread hand-off: a small
    message's latency is mostly hand-offs), else queues it and waits. Every blocking step is bounded by
    ``config.timeout_s``; when a rank dies or hangs, the others raise PeerFailureError naming it, and the group is
    unusable afterwards.
    """

    def __init__(self, config: GroupConfig, *, control_listener: socket.socket | None = None) -> None:
        """Join the group; returns once the rendezvous has connected this rank to its peers.

        Global rank 0 serves the rendezvous on ``config.master_port``, or on ``control_listener`` when given (a
        socket it bound itself, listening on that port).
        """
        self.config = config
        self._rt = Runtime(config, control_listener)
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="hfreduce-coll")
        self._stage = PinnedPool()
        self._registered: dict[int, tuple[Registered, int]] = {}
        self._queue_lock = threading.Lock()
        self._queued = 0  # collectives queued or running, the one on a calling thread included
        self._running = threading.Lock()  # held by the collective that runs (one at a time, in queue order)

    @classmethod
    def from_env(cls, **overrides: Any) -> Group:
        """Join using ``GroupConfig.from_env`` (HAI launcher variables plus ``FF_HFREDUCE_*`` options)."""
        return cls(GroupConfig.from_env(**overrides))

    @property
    def rank(self) -> int:
        """This rank's global rank, in ``[0, world_size)``."""
        return self.config.rank

    @property
    def world_size(self) -> int:
        """Number of ranks in the group, over all nodes."""
        return self.config.world_size

    @property
    def seq(self) -> int:
        """Collectives this rank has entered (the control server's view is ``status()``)."""
        return self._rt.seq

    # ----- collectives -----

    def allreduce(self, buf: Any, op: ReduceOp | str = ReduceOp.SUM) -> None:
        """Reduce ``buf`` over all ranks, in place, with ``op`` (sum, avg, max, min)."""
        self._call(self._allreduce(buf, op))

    def allreduce_async(self, buf: Any, op: ReduceOp | str = ReduceOp.SUM) -> Work:
        """Queue ``allreduce`` and return its handle; ``buf`` must not be touched until ``wait()`` returns."""
        return self._submit(self._allreduce(buf, op))

    def _allreduce(self, buf: Any, op: ReduceOp | str) -> _Job:
        flat, rop = self._flat(buf), ReduceOp(op)
        reg = self._lookup(flat)
        call = CallSignature("allreduce", len(flat.array), flat.dtype, rop, registered=reg is not None)
        return "allreduce", flat, lambda: self._rt.allreduce(flat.array, flat.dtype, rop, registered=reg), call

    def allgather_registered(self, buf: Any, out: Any = None) -> None:
        """All-gather inside registered buffer ``buf`` (from ``alloc``): see ``allgather_registered_async``."""
        self._call(self._allgather_registered(buf, out))

    def allgather_registered_async(self, buf: Any, out: Any = None) -> Work:
        """Queue an all-gather inside registered buffer ``buf`` (from ``alloc``) and return its handle.

        ``buf`` is ``world_size`` equal blocks; block ``rank`` holds this rank's input. Once done, every block
        holds its rank's input: in ``out`` when given (a contiguous CPU buffer of ``buf``'s size and dtype, e.g.
        the tensor the result is used from: no copy out of ``buf`` afterwards; ``buf``'s other blocks are then
        unspecified), else in ``buf``. Within a node nothing is reduced and no zeros are sent, unlike an
        allreduce of ``buf`` zero outside this rank's block. Neither buffer may be touched, nor ``out``'s storage
        resized, until ``wait()`` returns; ``out`` stays resizable afterwards (a torch tensor is viewed by
        address, not through ``.numpy()``, which would pin its storage's size).

        Raises:
            ValueError: ``buf`` is not a registered buffer, its size is not a multiple of ``world_size``, or
                ``out`` differs from it in size or dtype.
            TypeError: ``out`` is not a contiguous CPU buffer.
        """
        return self._submit(self._allgather_registered(buf, out))

    def _allgather_registered(self, buf: Any, out: Any) -> _Job:
        flat = self._flat(buf)
        reg, n, dest = self._registered_blocks(flat, out, len(flat.array))
        call = CallSignature("allgather_reg", n, flat.dtype, registered=True)
        return "allgather", flat, lambda: self._rt.allgather_registered(reg, n, flat.dtype, dest), call

    def reduce_scatter_registered(self, buf: Any, out: Any = None, op: ReduceOp | str = ReduceOp.SUM) -> None:
        """Reduce-scatter of registered buffer ``buf`` (from ``alloc``): see ``reduce_scatter_registered_async``."""
        self._call(self._reduce_scatter_registered(buf, out, op))

    def reduce_scatter_registered_async(self, buf: Any, out: Any = None, op: ReduceOp | str = ReduceOp.SUM) -> Work:
        """Queue a reduce-scatter of registered buffer ``buf`` (from ``alloc``) and return its handle.

        ``buf`` is ``world_size`` equal blocks, every rank's whole buffer its input. Once done, ``out`` (a
        contiguous CPU buffer of one block, viewed by address as in ``allgather_registered_async``), or when it is
        None block ``rank`` of ``buf``, holds the reduction with ``op`` of block ``rank`` over the ranks; the rest
        of ``buf`` is unspecified. At one or two nodes an fp32 buffer has only the blocks this rank needs reduced
        and one block sent between nodes, instead of an allreduce of all of it. Neither buffer may be touched
        until ``wait()`` returns.

        Raises:
            ValueError: ``buf`` is not a registered buffer, its size is not a multiple of ``world_size``, or
                ``out`` is not one block of its dtype.
            TypeError: ``out`` is not a contiguous CPU buffer.
        """
        return self._submit(self._reduce_scatter_registered(buf, out, op))

    def _reduce_scatter_registered(self, buf: Any, out: Any, op: ReduceOp | str) -> _Job:
        flat, rop = self._flat(buf), ReduceOp(op)
        reg, n, dest = self._registered_blocks(flat, out, len(flat.array) // self.world_size)
        call = CallSignature("reduce_scatter_reg", n, flat.dtype, rop, registered=True)
        return (
            "reduce_scatter",
            flat,
            lambda: self._rt.reduce_scatter_registered(reg, n, flat.dtype, rop, dest),
            call,
        )

    def _registered_blocks(self, flat: Flat, out: Any, out_numel: int) -> tuple[Registered, int, Any]:
        """The registration of ``flat``, its size and the array ``out`` is viewed as (checked: see the callers)."""
        reg = self._lookup(flat)
        n = len(flat.array)
        if reg is None:
            raise ValueError("this collective needs a buffer from Group.alloc (the whole of it)")
        if n % self.world_size:
            raise ValueError(f"size {n} is not a multiple of world_size ({self.world_size})")
        if out is None:
            return reg, n, None
        dest = address_view(out)
        if dest.dtype is not flat.dtype or len(dest.array) != out_numel:
            raise ValueError(f"out must be {flat.dtype.value} x {out_numel}")
        return reg, n, dest.array

    def reduce(self, buf: Any, dst: int, op: ReduceOp | str = ReduceOp.SUM) -> None:
        """Reduce every rank's ``buf`` into rank ``dst``'s with ``op``.

        Other ranks' buffers are unchanged, registered buffers excepted: they all receive the result.
        """
        self._call(self._reduce(buf, dst, op))

    def reduce_async(self, buf: Any, dst: int, op: ReduceOp | str = ReduceOp.SUM) -> Work:
        """Queue ``reduce`` and return its handle; ``buf`` must not be touched until ``wait()`` returns.

        Raises:
            ValueError: ``dst`` is not a rank of the group (nothing is queued).
        """
        return self._submit(self._reduce(buf, dst, op))

    def _reduce(self, buf: Any, dst: int, op: ReduceOp | str) -> _Job:
        self._check_rank(dst)
        flat, rop = self._flat(buf), ReduceOp(op)
        reg = self._lookup(flat)
        keep = dst == self.rank
        return (
            "reduce",
            flat,
            lambda: self._rt.allreduce(flat.array, flat.dtype, rop, keep=keep, registered=reg, reduce_only=True),
            CallSignature("reduce", len(flat.array), flat.dtype, rop, root=dst, registered=reg is not None),
        )

    def broadcast(self, buf: Any, src: int) -> None:
        """Copy rank ``src``'s ``buf`` into every rank's ``buf``."""
        self._call(self._broadcast(buf, src))

    def broadcast_async(self, buf: Any, src: int) -> Work:
        """Queue ``broadcast`` and return its handle; ``buf`` must not be touched until ``wait()`` returns.

        Raises:
            ValueError: ``src`` is not a rank of the group (nothing is queued).
        """
        return self._submit(self._broadcast(buf, src))

    def _broadcast(self, buf: Any, src: int) -> _Job:
        self._check_rank(src)
        flat = self._flat(buf)
        call = CallSignature("broadcast", len(flat.array), flat.dtype, root=src)
        return "broadcast", flat, lambda: self._rt.broadcast(flat.array, src), call

    def allgather(self, out: Any, inp: Any) -> None:
        """``out`` (``world_size`` times the size of ``inp``) receives every rank's ``inp``, by rank."""
        self._call(self._allgather(out, inp))

    def allgather_async(self, out: Any, inp: Any) -> Work:
        """Queue ``allgather`` and return its handle; the buffers must not be touched until ``wait()`` returns.

        Raises:
            TypeError: ``out`` and ``inp`` have different dtypes.
            ValueError: ``out`` is not ``world_size`` times the size of ``inp``.
        """
        return self._submit(self._allgather(out, inp))

    def _allgather(self, out: Any, inp: Any) -> _Job:
        flat_out, flat_in = self._flat(out), self._flat(inp)
        self._check_multiple(flat_out, flat_in)
        call = CallSignature("allgather", len(flat_in.array), flat_in.dtype)
        return "allgather", flat_out, lambda: self._rt.allgather(flat_out.array, flat_in.array, flat_in.dtype), call

    def reduce_scatter(self, out: Any, inp: Any, op: ReduceOp | str = ReduceOp.SUM) -> None:
        """``out`` receives block ``rank`` of the reduction of every rank's ``inp`` (``world_size`` blocks)."""
        self._call(self._reduce_scatter(out, inp, op))

    def reduce_scatter_async(self, out: Any, inp: Any, op: ReduceOp | str = ReduceOp.SUM) -> Work:
        """Queue ``reduce_scatter`` and return its handle; the buffers must not be touched until ``wait()`` returns.

        Raises:
            TypeError: ``out`` and ``inp`` have different dtypes.
            ValueError: ``inp`` is not ``world_size`` times the size of ``out``.
        """
        return self._submit(self._reduce_scatter(out, inp, op))

    def _reduce_scatter(self, out: Any, inp: Any, op: ReduceOp | str) -> _Job:
        flat_out, flat_in, rop = self._flat(out), self._flat(inp), ReduceOp(op)
        self._check_multiple(flat_in, flat_out)
        return (
            "reduce_scatter",
            flat_out,
            lambda: self._rt.reduce_scatter(flat_out.array, flat_in.array, flat_in.dtype, rop),
            CallSignature("reduce_scatter", len(flat_out.array), flat_in.dtype, rop),
        )

    def barrier(self) -> None:
        """Return once every rank has called barrier (a one-element allreduce through the trees)."""
        self._call(self._barrier())

    def barrier_async(self) -> Work:
        """Queue ``barrier``; its handle completes once every rank has entered the barrier."""
        return self._submit(self._barrier())

    def _barrier(self) -> _Job:
        token = np.zeros(1, dtype=np.float32)
        flat = Flat(token, DType.F32, 0, lambda: None)
        return (
            "barrier",
            flat,
            lambda: self._rt.allreduce(token, DType.F32, ReduceOp.SUM),
            CallSignature("barrier", 1, DType.F32),
        )

    # ----- registered buffers, counters, status, lifetime -----

    def alloc(self, shape: int | Sequence[int], dtype: str = "float32", *, as_torch: bool = False) -> Any:
        """A zero-filled buffer in shared memory, allreduced with no copy in or out.

        Every local rank of the node must call ``alloc`` with the same shape and dtype, in the same order
        (like gradient buckets). Returns a numpy array (bf16 as uint16 bits) or, with ``as_torch``, a
        tensor. Only the whole buffer takes the zero-copy path; a slice of it is copied like any tensor.
        """
        dt = _DTYPE_NAMES[dtype]
        dims = (shape,) if isinstance(shape, int) else tuple(shape)
        count = math.prod(dims)
        future = self._worker.submit(self._exclusive, self._rt.register, count * dt.itemsize)
        reg = future.result()
        arr = reg.segments[self.config.local_rank].array(dt.storage, count).reshape(dims)
        self._registered[arr.__array_interface__["data"][0]] = (reg, count * dt.itemsize)
        if not as_torch:
            return arr
        import torch

        if dt is DType.BF16:
            return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(arr)

    def counters(self) -> Counters:
        """Bytes copied, reduced, sent and received by this rank so far, by phase."""
        return self._worker.submit(self._exclusive, self._rt.counters.copy).result()

    def status(self) -> list[dict[str, Any]]:
        """Every rank's collective sequence number and state, from the control server."""
        return query_status(self.config.master_addr, self.config.master_port)

    def close(self) -> None:
        """Leave the group: wait for queued collectives, then release sockets and shared memory."""
        self._worker.shutdown(wait=True)
        self._exclusive(self._rt.close)

    def __enter__(self) -> Group:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- helpers -----

    def _flat(self, buf: Any) -> Flat:
        return flatten(buf, stage=self._stage if is_torch(buf) else None)

    def _lookup(self, flat: Flat) -> Registered | None:
        entry = self._registered.get(flat.data_ptr)
        if entry is None or entry[1] != flat.array.nbytes:
            return None
        return entry[0]

    def _submit(self, job: _Job) -> Work:
        """Queue ``job`` on the collective thread."""
        with self._queue_lock:
            self._queued += 1
            return Work(self._worker.submit(self._run, job))

    def _call(self, job: _Job) -> None:
        """Run ``job`` now on this thread if nothing is queued, else queue it and wait; raise its error."""
        with self._queue_lock:
            inline = self._queued == 0
            if inline:
                self._queued = 1
        if not inline:
            self._submit(job).wait()
            return
        self._run(job)

    def _run(self, job: _Job) -> None:
        """Run a queued ``job`` when the ones before it are done; it leaves the queue before its Work completes."""
        name, flat, body, call = job
        try:
            with self._running:
                self._rt.run(name, body, call)
                flat.finish()
        finally:
            with self._queue_lock:
                self._queued -= 1

    def _exclusive(self, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` while no collective runs: the runtime is used by one thread at a time."""
        with self._running:
            return fn(*args)

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} not in [0, {self.world_size})")

    def _check_multiple(self, big: Flat, small: Flat) -> None:
        if big.dtype is not small.dtype:
            raise TypeError(f"dtypes differ: {big.dtype.value} and {small.dtype.value}")
        if len(big.array) != len(small.array) * self.world_size:
            raise ValueError(f"size {len(big.array)} must be world_size ({self.world_size}) x {len(small.array)}")
