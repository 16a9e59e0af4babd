"""The torch.distributed backend ``"hfreduce"``: a Python ``ProcessGroup`` whose collectives run on ``hfreduce.Group``.

torch 2.13 lets Python backends subclass ``torch.distributed.ProcessGroup`` only (its ``Backend`` class has no
Python constructor), so the object the creator returns *is* the process group. Every collective returns a
``Work`` (``RaisingWork``, a Python subclass) around a ``torch.futures.Future`` that completes with the output
tensors, so ``work.get_future()`` (DDP comm hooks) works and ``work.wait()`` raises the collective's error.

Order: hfreduce runs collectives one at a time in submission order, and all ranks must submit in the same
order. A collective that is one hfreduce call (``allreduce`` of float tensors, ``broadcast``, ...) is
submitted from the caller's thread; one that needs two calls, the second shaped by the first's result
(``all_to_all`` with split sizes), runs on this backend's own thread, and while one is pending, later
collectives queue behind it there, so every rank submits the same sequence.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import functools
import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, TCPStore  # the classes torch.distributed re-exports
from torch.futures import Future

from hfreduce.api import Work as HFWork
from hfreduce.config import options_from_env
from hfreduce.distributed import tensors as tx
from hfreduce.distributed.p2p import PeerLinks
from hfreduce.distributed.rendezvous import join_store
from hfreduce.errors import GroupClosedError

logger = logging.getLogger(__name__)

BACKEND_NAME = "hfreduce"
Tensors = list[torch.Tensor]
Start = Callable[[], HFWork]


class ProcessGroupHFReduce(dist.ProcessGroup):
    """torch process group over an hfreduce group formed through torch's store (see ``join_store``)."""

    def __init__(self, store: Any, rank: int, size: int, timeout: datetime.timedelta, **options: Any) -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]  # the stubs know only the C++ constructor
        # FF_HFREDUCE_TIMEOUT_S, when set, wins over torch's timeout (30 min by default) for hfreduce's steps
        from_env = options_from_env().get("timeout_s")
        timeout_s = from_env if isinstance(from_env, float) else _timeout_s(timeout)
        _keep_server(store)
        generation = _generation(store, size)
        self.hf, self.layout = join_store(
            store, rank, size, prefix=f"hfreduce/{generation}", timeout_s=timeout_s, **options
        )
        self._me = rank
        self._lock = threading.RLock()
        self._queued = 0  # collectives submitted to self._thread and not yet handed to hfreduce
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="hfreduce-torch")
        self._p2p = PeerLinks(
            store,
            rank,
            size,
            timeout_s=timeout_s,
            # not a closure over self: the links would hold the group in a cycle, so a destroyed group (its store's
            # connections, its sockets) lived on until the cyclic garbage collector ran
            describe=functools.partial(_node_and_local_rank, self.layout),
            route_to=os.environ.get("MASTER_ADDR"),
            prefix=f"hfreduce-p2p/{generation}",
        )

    def getBackendName(self) -> str:
        """``"hfreduce"``: what ``dist.get_backend`` reports for this group."""
        return BACKEND_NAME

    def __repr__(self) -> str:
        return f"ProcessGroupHFReduce(rank={self._me}, size={self.size()}, nodes={self.layout.num_nodes})"

    # ----- reductions -----

    def allreduce(self, tensors: Tensors, opts: Any = None) -> dist.Work:  # type: ignore[override]
        """``dist.all_reduce``: hfreduce's trees for float32/16 and bfloat16 with SUM, AVG, MAX or MIN.

        PREMUL_SUM scales the tensor, then sums. Other dtypes and ops gather every rank's tensor and reduce
        locally, in rank order, so every rank computes the same result.
        """
        t = _one(tensors, "all_reduce")
        kind, factor = tx.reduce_op(_op(opts), "all_reduce", t.dtype)
        if factor is not None:  # PREMUL_SUM: scale, then sum
            with torch.no_grad():
                t.mul_(factor)
            kind = "SUM"
        if not tx.is_native(t, kind):
            return self._via_gather(t, t, kind, keep=True)
        op = tx.NATIVE_OPS[kind]
        return self._simple(lambda: self.hf.allreduce_async(t, op), [t])

    def allreduce_coalesced(self, tensors: Tensors, opts: Any = None) -> dist.Work:
        """``dist.all_reduce_coalesced``: one allreduce of the tensors concatenated, copied back when it is done."""
        if not tensors:
            return _done([])
        flat = torch.cat([t.detach().reshape(-1) for t in tensors])
        work = self.allreduce([flat], _reduce_opts(dist.AllreduceOptions(), opts))

        def scatter_back(done: Future[Tensors]) -> Tensors:
            done.wait()  # re-raises the allreduce's error
            offset = 0
            with torch.no_grad():
                for t in tensors:
                    t.copy_(flat[offset : offset + t.numel()].view(t.shape))
                    offset += t.numel()
            return tensors

        return RaisingWork(work.get_future().then(scatter_back))

    def reduce(self, tensors: Tensors, opts: Any = None) -> dist.Work:  # type: ignore[override]
        """``dist.reduce``: the root's tensor receives the result; every other rank's tensor stays unchanged."""
        t = _one(tensors, "reduce")
        root = self._root(opts, "reduce")
        kind, factor = tx.reduce_op(_op(opts), "reduce", t.dtype)
        src = t
        if factor is not None:  # scale a copy: the buffers of ranks other than the root stay unchanged
            src, kind = t.detach().mul(factor), "SUM"
        if not tx.is_native(t, kind):
            return self._via_gather(src, t, kind, keep=root == self._me)
        op = tx.NATIVE_OPS[kind]
        dst = self.layout.hf_rank(root)

        def finish() -> None:
            if src is not t and root == self._me:
                with torch.no_grad():
                    t.copy_(src)

        return self._simple(lambda: self.hf.reduce_async(src, dst, op), [t], finish)

    def reduce_scatter(self, outputs: Tensors, inputs: list[Tensors], opts: Any = None) -> dist.Work:  # type: ignore[override]
        """``dist.reduce_scatter``: the inputs (one per rank) are concatenated, then reduce-scattered."""
        out = _one(outputs, "reduce_scatter")
        parts = _one(inputs, "reduce_scatter")
        _check_parts(parts, out, self.size(), "reduce_scatter")
        ordered = [parts[r] for r in self.layout.torch_ranks]
        inp = torch.cat([p.detach().reshape(-1) for p in ordered])
        return self._reduce_scatter(out, inp, opts, "reduce_scatter")

    def reduce_scatter_single(self, output: torch.Tensor, inp: torch.Tensor, opts: Any = None) -> dist.Work:
        """``dist.reduce_scatter_tensor``: ``output`` receives this rank's block of the reduced ``inp``.

        Raises:
            ValueError: ``inp`` does not hold world size times ``output``'s elements.
        """
        _check_tensor(output, "reduce_scatter_tensor")
        _check_tensor(inp, "reduce_scatter_tensor")
        if inp.numel() != output.numel() * self.size():
            raise ValueError(
                f"hfreduce backend: reduce_scatter_tensor input has {inp.numel()} elements, "
                f"needs world size ({self.size()}) x {output.numel()}"
            )
        if not self.layout.is_identity:
            blocks = inp.detach().reshape(self.size(), -1)
            inp = blocks[list(self.layout.torch_ranks)].reshape(-1)
        return self._reduce_scatter(output, inp, opts, "reduce_scatter_tensor")

    def reduce_scatter_tensor_coalesced(self, outputs: Tensors, inputs: Tensors, opts: Any = None) -> dist.Work:
        """One ``reduce_scatter_tensor`` per pair of tensors; the work completes when they all have."""
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs, strict=True)]
        return _all_of(works, outputs)

    def _reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, opts: Any, what: str) -> dist.Work:
        kind, factor = tx.reduce_op(_op(opts), what, out.dtype)
        if inp.dtype != out.dtype:
            raise TypeError(f"hfreduce backend: {what} input is {inp.dtype}, output {out.dtype}")
        if factor is not None:
            inp = inp.detach().mul(factor)
            kind = "SUM"
        if not tx.is_native(out, kind):
            return self._reduce_scatter_via_gather(out, inp, kind)
        flat = inp.detach().contiguous()
        op = tx.NATIVE_OPS[kind]
        return self._simple(lambda: self.hf.reduce_scatter_async(out, flat, op), [out])

    def _via_gather(self, src: torch.Tensor, t: torch.Tensor, kind: tx.OpName, *, keep: bool) -> dist.Work:
        """Reduce a dtype/op hfreduce does not: gather every rank's ``src`` and reduce locally.

        The reduction runs in rank order, so it is the same on every rank; the result goes into ``t`` if ``keep``.
        """
        gathered, start, rows = self._gather_bytes(src)

        def finish() -> None:
            if keep:
                with torch.no_grad():
                    t.copy_(tx.combine([tx.as_dtype(r, src) for r in rows(gathered)], kind))

        return self._simple(start, [t], finish)

    def _reduce_scatter_via_gather(self, out: torch.Tensor, inp: torch.Tensor, kind: tx.OpName) -> dist.Work:
        gathered, start, rows = self._gather_bytes(inp)
        block = self.layout.hf_rank(self._me)  # inp is already in hfreduce rank order

        def finish() -> None:
            total = tx.combine([r.view(inp.dtype) for r in rows(gathered)], kind)
            with torch.no_grad():
                out.copy_(total.reshape(self.size(), -1)[block].view(out.shape))

        return self._simple(start, [out], finish)

    # ----- data movement -----

    def broadcast(self, tensors: Tensors, opts: Any = None) -> dist.Work:  # type: ignore[override]
        """``dist.broadcast``: any dtype, moved as bytes when hfreduce has no such dtype."""
        t = _one(tensors, "broadcast")
        src = self.layout.hf_rank(self._root(opts, "broadcast"))
        if t.dtype in tx.NATIVE_DTYPES:
            return self._simple(lambda: self.hf.broadcast_async(t, src), [t])
        flat, write_back = tx.host_bytes(t)
        buf = flat if flat.numel() % 2 == 0 else torch.cat([flat, flat.new_zeros(1)])

        def finish() -> None:
            if buf is not flat:
                flat.copy_(buf[: flat.numel()])
            write_back()

        return self._simple(lambda: self.hf.broadcast_async(tx.wire(buf), src), [t], finish)

    def allgather(self, outputs: list[Tensors], inputs: Tensors, opts: Any = None) -> dist.Work:  # type: ignore[override]
        """``dist.all_gather``: an allgather of every rank's bytes, copied into the outputs by torch rank."""
        outs, t = _one(outputs, "all_gather"), _one(inputs, "all_gather")
        _check_parts(outs, t, self.size(), "all_gather")
        gathered, start, rows = self._gather_bytes(t)

        def finish() -> None:
            blocks = rows(gathered)
            with torch.no_grad():
                for r, o in enumerate(outs):
                    o.copy_(tx.as_dtype(blocks[r], o))

        return self._simple(start, outs, finish)

    def all_gather_single(self, output: torch.Tensor, inp: torch.Tensor, opts: Any = None) -> dist.Work:
        """``dist.all_gather_into_tensor``: straight into ``output`` when it is a contiguous CPU tensor.

        Raises:
            ValueError: ``output`` is not world size times ``inp`` or has another dtype.
        """
        _check_tensor(output, "all_gather_into_tensor")
        _check_tensor(inp, "all_gather_into_tensor")
        if output.numel() != inp.numel() * self.size() or output.dtype != inp.dtype:
            raise ValueError(
                f"hfreduce backend: all_gather_into_tensor output ({output.dtype}, {output.numel()} elements) "
                f"must be world size ({self.size()}) x input ({inp.dtype}, {inp.numel()})"
            )
        direct = output.device.type == "cpu" and output.is_contiguous() and self.layout.is_identity
        if direct and inp.dtype in tx.NATIVE_DTYPES:
            src = inp.detach().contiguous()
            return self._simple(lambda: self.hf.allgather_async(output, src), [output])
        gathered, start, rows = self._gather_bytes(inp)

        def finish() -> None:
            with torch.no_grad():
                output.copy_(torch.cat(rows(gathered)).view(output.dtype).reshape(output.shape))

        return self._simple(start, [output], finish)

    def allgather_into_tensor_coalesced(self, outputs: Tensors, inputs: Tensors, opts: Any = None) -> dist.Work:
        """One ``all_gather_into_tensor`` per pair of tensors; the work completes when they all have."""
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs, strict=True)]
        return _all_of(works, outputs)

    def gather(self, outputs: list[Tensors], inputs: Tensors, opts: Any = None) -> dist.Work:  # type: ignore[override]
        """``dist.gather``: an allgather (hfreduce has no gather) of which only the root keeps the result."""
        t = _one(inputs, "gather")
        root = self._root(opts, "gather")
        outs = _one(outputs, "gather") if root == self._me else []
        if root == self._me:
            _check_parts(outs, t, self.size(), "gather")
        gathered, start, rows = self._gather_bytes(t)

        def finish() -> None:
            with torch.no_grad():
                for r, o in enumerate(outs):
                    o.copy_(tx.as_dtype(rows(gathered)[r], o))

        return self._simple(start, outs, finish)

    def scatter(self, outputs: Tensors, inputs: list[Tensors], opts: Any = None) -> dist.Work:  # type: ignore[override]
        """``dist.scatter``: a broadcast of the root's inputs, concatenated, of which each rank keeps its part."""
        out = _one(outputs, "scatter")
        root = self._root(opts, "scatter")
        nbytes = tx.padded(out.numel() * out.element_size())
        buf = torch.zeros(nbytes * self.size(), dtype=torch.uint8)
        if root == self._me:
            parts = _one(inputs, "scatter")
            _check_parts(parts, out, self.size(), "scatter")
            for r, p in enumerate(parts):
                raw, _ = tx.host_bytes(p)
                buf[r * nbytes : r * nbytes + raw.numel()].copy_(raw)
        src = self.layout.hf_rank(root)

        def finish() -> None:
            mine = buf[self._me * nbytes : self._me * nbytes + out.numel() * out.element_size()]
            with torch.no_grad():
                out.copy_(tx.as_dtype(mine, out))

        return self._simple(lambda: self.hf.broadcast_async(tx.wire(buf), src), [out], finish)

    def alltoall(self, outputs: Tensors, inputs: Tensors, opts: Any = None) -> dist.Work:
        """``dist.all_to_all``: two hfreduce calls on the backend's thread (see ``_exchange``).

        Raises:
            ValueError: ``outputs`` or ``inputs`` does not hold one tensor per rank.
        """
        if len(outputs) != self.size() or len(inputs) != self.size():
            raise ValueError(f"hfreduce backend: all_to_all needs {self.size()} input and output tensors")
        raws = [tx.host_bytes(t)[0] for t in inputs]
        send = torch.cat(raws) if raws else torch.zeros(0, dtype=torch.uint8)
        in_sizes = [r.numel() for r in raws]
        out_sizes = [o.numel() * o.element_size() for o in outputs]

        def body() -> None:
            pieces = self._exchange(send, in_sizes, out_sizes, "all_to_all")
            with torch.no_grad():
                for o, piece in zip(outputs, pieces, strict=True):
                    o.copy_(tx.as_dtype(piece, o))

        return self._composite(body, outputs)

    def all_to_all_single(
        self, output: torch.Tensor, inp: torch.Tensor, out_splits: list[int], in_splits: list[int], opts: Any = None
    ) -> dist.Work:
        """``dist.all_to_all_single``: even splits are one allgather; uneven ones go through ``_exchange``.

        Raises:
            ValueError: the splits do not cover the tensors' rows, or (without splits) the rows do not divide evenly.
        """
        n = self.size()
        _check_tensor(output, "all_to_all_single")
        _check_tensor(inp, "all_to_all_single")
        in_rows, out_rows = _splits(in_splits, inp, n, "input"), _splits(out_splits, output, n, "output")
        in_row = inp[0].numel() * inp.element_size() if inp.dim() and inp.shape[0] else 0
        out_row = output[0].numel() * output.element_size() if output.dim() and output.shape[0] else 0
        send, _ = tx.host_bytes(inp)
        in_sizes, out_sizes = [r * in_row for r in in_rows], [r * out_row for r in out_rows]
        flat, write_back = tx.host_bytes(output)

        def place(pieces: Tensors) -> None:
            if pieces:
                flat.copy_(torch.cat(pieces))
            write_back()

        if not in_splits and not out_splits:  # even splits: every rank's input has the same size
            gathered, start, rows = self._gather_bytes(inp)
            me, size = self._me, in_sizes[0] if in_sizes else 0

            def finish() -> None:
                blocks = rows(gathered)
                place([blocks[j][me * size : (me + 1) * size] for j in range(n)])

            return self._simple(start, [output], finish)

        def body() -> None:
            place(self._exchange(send, in_sizes, out_sizes, "all_to_all_single"))

        return self._composite(body, [output])

    def _exchange(self, send: torch.Tensor, in_sizes: list[int], out_sizes: list[int], what: str) -> Tensors:
        """All-to-all of bytes, on the backend thread, in two allgathers.

        Every rank first learns every rank's split sizes, input and output, then gathers every rank's whole input
        (padded to the largest) and keeps its pieces.

        Raises:
            ValueError: on every rank alike, before any data moves, when a rank's output splits differ from what the
                others send it (named: the first such rank).
        """
        n, me = self.size(), self._me
        sizes = torch.tensor([*in_sizes, *out_sizes], dtype=torch.int64)
        table = torch.zeros(n * 2 * n, dtype=torch.int64)
        self.hf.allgather(tx.wire(table.view(torch.uint8)), tx.wire(sizes.view(torch.uint8)))
        both = table.view(n, 2, n)[[self.layout.hf_rank(j) for j in range(n)]]
        matrix, wanted = both[:, 0], both[:, 1]
        for r in range(n):  # every rank checks every rank, so all of them raise or none does
            sent = matrix[:, r].tolist()
            if sent != wanted[r].tolist():
                raise ValueError(
                    f"hfreduce backend: {what}: rank {r}'s output splits take {wanted[r].tolist()} bytes, "
                    f"the ranks send it {sent}"
                )
        got = matrix[:, me].tolist()
        width = tx.padded(int(matrix.sum(1).max()))
        mine = torch.zeros(width, dtype=torch.uint8)
        mine[: send.numel()].copy_(send)
        everyone = torch.empty(width * n, dtype=torch.uint8)
        self.hf.allgather(tx.wire(everyone), tx.wire(mine))
        offsets = torch.cumsum(matrix, 1) - matrix
        pieces = []
        for j in range(n):
            base = self.layout.hf_rank(j) * width + int(offsets[j, me])
            pieces.append(everyone[base : base + got[j]])
        return pieces

    def barrier(self, opts: Any = None) -> dist.Work:
        """``dist.barrier``: hfreduce's barrier (``opts``, e.g. device ids, is not needed)."""
        return self._simple(self.hf.barrier_async, [torch.zeros(0)])

    # ----- point to point (not hfreduce's trees: a TCP connection per pair, see p2p.py) -----

    def send(self, tensors: Tensors, dst: int, tag: int = 0) -> dist.Work:
        """``dist.send``/``isend``: on ``dst``'s send thread, after the sends queued to it before."""
        t = _one(tensors, "send")
        return self._point_to_point("send", dst, [t], lambda: self._p2p.send(t, dst, tag))

    def recv(self, tensors: Tensors, src: int, tag: int = 0) -> dist.Work:
        """``dist.recv``/``irecv``: the next message from ``src``; its tag and size must match (else ValueError)."""
        t = _one(tensors, "recv")
        return self._point_to_point("recv", src, [t], lambda: self._p2p.recv(t, src, tag))

    def _point_to_point(self, direction: str, peer: int, result: Tensors, transfer: Callable[[], None]) -> dist.Work:
        outcome = Outcome(result)

        def run() -> None:
            try:
                transfer()
            except BaseException as exc:
                outcome.settle(exc)
                return
            outcome.settle(None)

        self._p2p.submit(direction, peer, run)
        return outcome.work()

    # ----- what hfreduce does not do -----

    def recv_anysource(self, tensors: Tensors, tag: int = 0) -> dist.Work:
        """Not supported: each pair of ranks has its own connection, so a receive names its source.

        Raises:
            NotImplementedError: always.
        """
        raise NotImplementedError("hfreduce backend: recv from any source is not supported (name the source rank)")

    def monitored_barrier(self, opts: Any = None, wait_all_ranks: bool = False) -> None:
        """Not supported: ``barrier`` already names a rank that fails or hangs.

        Raises:
            NotImplementedError: always.
        """
        raise NotImplementedError("hfreduce backend: monitored_barrier is not supported (use barrier)")

    # ----- lifetime -----

    def shutdown(self) -> None:
        """Close the peer links, wait for queued collectives, then leave the hfreduce group."""
        self._p2p.close()
        self._thread.shutdown(wait=True)
        self.hf.close()

    def abort(self) -> None:
        """The same as ``shutdown``: queued collectives still run to their end or their timeout."""
        self.shutdown()

    # ----- machinery -----

    def _root(self, opts: Any, what: str) -> int:
        root = int(getattr(opts, "rootRank", 0))
        if not 0 <= root < self.size():
            raise ValueError(f"hfreduce backend: {what} root rank {root} not in [0, {self.size()})")
        return root

    def _gather_bytes(self, t: torch.Tensor) -> tuple[torch.Tensor, Start, Callable[[torch.Tensor], Tensors]]:
        """Buffers for an allgather of ``t``'s bytes: the gathered buffer, the call, and its rows by torch rank."""
        raw, _ = tx.host_bytes(t)
        nbytes, width = raw.numel(), tx.padded(raw.numel())
        mine = raw if width == nbytes else torch.cat([raw, raw.new_zeros(1)])
        gathered = torch.empty(width * self.size(), dtype=torch.uint8)

        def start() -> HFWork:
            return self.hf.allgather_async(tx.wire(gathered), tx.wire(mine))

        def rows(buf: torch.Tensor) -> Tensors:
            at = [self.layout.hf_rank(j) * width for j in range(self.size())]
            return [buf[a : a + nbytes] for a in at]

        return gathered, start, rows

    def _simple(self, start: Start, result: Tensors, finish: Callable[[], None] | None = None) -> dist.Work:
        """One hfreduce call: submitted now from this thread, or behind a pending multi-step collective."""
        outcome = Outcome(result)

        def settle(error: BaseException | None) -> None:
            if error is None and finish is not None:
                try:
                    finish()
                except BaseException as exc:
                    error = exc
            outcome.settle(error)

        with self._lock:
            direct = self._queued == 0
            if direct:
                try:
                    work = start()
                except GroupClosedError as exc:
                    raise _named(exc) from exc
        if direct:
            work.add_done_callback(settle)  # outside the lock: torch runs the future's callbacks right here
            return outcome.work()

        def run() -> None:
            try:
                start().wait()
            except BaseException as exc:
                settle(exc)
                return
            settle(None)

        return self._queue(run, outcome)

    def _composite(self, body: Callable[[], None], result: Tensors) -> dist.Work:
        outcome = Outcome(result)

        def run() -> None:
            try:
                body()
            except BaseException as exc:
                outcome.settle(exc)
                return
            outcome.settle(None)

        return self._queue(run, outcome)

    def _queue(self, run: Callable[[], None], outcome: Outcome) -> dist.Work:
        def task() -> None:
            try:
                run()
            finally:
                with self._lock:
                    self._queued -= 1

        with self._lock:
            self._queued += 1
            self._thread.submit(task)
        return outcome.work()


class Outcome:
    """The future a collective's ``Work`` hands out, failed the way torch's C++ side sees.

    ``torch.futures.Future.set_exception`` only stores the exception as the future's *value*: C++ consumers (DDP's
    reducer, ``Work.wait``) would take it for a result. A callback that raises, though, marks the future it
    returns as failed, so the work's future is ``raw.then(unwrap)`` and a failure raises in ``unwrap``.
    """

    def __init__(self, result: Tensors) -> None:
        self._result = result
        self._error: BaseException | None = None
        self._raw: Future[Tensors] = Future()
        self.future: Future[Tensors] = self._raw.then(self._unwrap)

    def _unwrap(self, _: Future[Tensors]) -> Tensors:
        if self._error is not None:
            raise self._error
        return self._result

    def settle(self, error: BaseException | None) -> None:
        """Complete the future: with the result tensors, or failed with ``error`` (once, from any thread)."""
        self._error = None if error is None else _named(error)
        self._raw.set_result([])

    def work(self) -> dist.Work:
        """A ``RaisingWork`` on this outcome's future, for torch to wait on."""
        return RaisingWork(self.future)


class RaisingWork(dist.Work):
    """A ``Work`` whose ``wait()`` raises the operation's error.

    ``_create_work_from_future``'s work only waits for its future: a failed collective or transfer returned from
    ``wait()`` (``dist.all_reduce``, ``dist.recv``) as if it had succeeded, its buffers unchanged. ``Future.wait()``
    raises.
    """

    def __init__(self, future: Future[Tensors]) -> None:
        super().__init__()
        self._future = future

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        """Block until the operation ends; raise its error, else return True (``timeout`` is not used).

        Every hfreduce step is bounded by the group's timeout, so a hung peer is named rather than waited on.
        """
        self._future.wait()
        return True

    def is_completed(self) -> bool:
        """True once the operation has ended, with or without an error."""
        return self._future.done()

    def get_future(self) -> Future[Tensors]:
        """The future DDP's comm hooks chain on: it completes with the output tensors, or fails."""
        return self._future


def _timeout_s(timeout: datetime.timedelta | None) -> float | None:
    return timeout.total_seconds() if timeout is not None and timeout.total_seconds() > 0 else None


def _op(opts: Any) -> Any:
    return getattr(opts, "reduceOp", dist.ReduceOp.SUM)


def _reduce_opts(target: Any, source: Any) -> Any:
    if source is not None:
        target.reduceOp = source.reduceOp
    return target


def _generation(store: Any, size: int) -> int:
    """Which group of this name on ``store`` this one is: 0, then 1 after a destroy and a new init, and so on.

    The store's server lives as long as the process (env:// makes rank 0's TCPStore multi-tenant, and
    ``_keep_server`` keeps one), so a group made again after ``destroy_process_group`` finds the keys of the one
    before it: without a fresh
    prefix its ranks read the old control server's address and fail to join. Every rank of a group adds one to
    a counter before it publishes anything, and all of one group's adds come before any of the next group's
    (a rank joins the next group only after the previous one was formed), so all agree on the count.
    """
    count: int = store.add("hfreduce/joins", 1)
    return (count - 1) // size


def _one(items: Sequence[Any], what: str) -> Any:
    if len(items) != 1:
        raise ValueError(f"hfreduce backend: {what} takes one tensor (list) per rank, got {len(items)}")
    if isinstance(items[0], torch.Tensor):
        _check_tensor(items[0], what)
    return items[0]


def _check_tensor(t: torch.Tensor, what: str) -> None:
    """Refuse, naming ``what``, a tensor with no data to move (``meta``) or whose elements share memory.

    An ``expand()``ed view claims ``numel`` elements over a few: staged, it would be copied to a buffer of all
    of them (gigabytes for a claimed 2**31), and the result cannot be written back into it.

    Raises:
        ValueError: either.
    """
    if t.device.type == "meta":
        raise ValueError(f"hfreduce backend: {what}: a tensor on the meta device has no data to communicate")
    if any(stride == 0 and size > 1 for size, stride in zip(t.shape, t.stride(), strict=True)):
        raise ValueError(
            f"hfreduce backend: {what}: the tensor's {t.numel()} elements share memory (stride 0, e.g. an "
            "expand()ed view); pass a tensor with its own memory for each element, e.g. .contiguous()"
        )


def _check_parts(parts: Tensors, like: torch.Tensor, world: int, what: str) -> None:
    if len(parts) != world:
        raise ValueError(f"hfreduce backend: {what} needs {world} tensors, got {len(parts)}")
    for p in parts:
        _check_tensor(p, what)
        if p.numel() != like.numel() or p.dtype != like.dtype:
            raise ValueError(
                f"hfreduce backend: {what} tensors must all be {like.dtype} with {like.numel()} elements, "
                f"got {p.dtype} with {p.numel()}"
            )


def _splits(splits: list[int], t: torch.Tensor, world: int, what: str) -> list[int]:
    rows = t.shape[0] if t.dim() else 0
    if not splits:
        if rows % world:
            raise ValueError(f"hfreduce backend: all_to_all_single {what} of {rows} rows does not split {world} ways")
        return [rows // world] * world
    if len(splits) != world or sum(splits) != rows or min(splits) < 0:
        raise ValueError(f"hfreduce backend: all_to_all_single {what} splits {splits} do not cover {rows} rows")
    return list(splits)


def _done(result: Tensors) -> dist.Work:
    outcome = Outcome(result)
    outcome.settle(None)
    return outcome.work()


def _all_of(works: list[dist.Work], result: Tensors) -> dist.Work:
    def check(done: Future[list[Future[Any]]]) -> Tensors:
        for part in done.wait():
            part.wait()  # re-raises a part's error
        return result

    return RaisingWork(torch.futures.collect_all([w.get_future() for w in works]).then(check))


def _named(error: BaseException) -> BaseException:
    """The error torch will show (as text) for a failed future: hfreduce's own message, which names the failed rank."""
    if isinstance(error, RuntimeError | ValueError | TypeError | NotImplementedError):
        return error
    return RuntimeError(f"hfreduce backend: {type(error).__name__}: {error}")


def create_process_group(store: Any, rank: int, size: int, timeout: datetime.timedelta) -> ProcessGroupHFReduce:
    """The creator torch calls for ``init_process_group("hfreduce")`` and ``new_group(backend="hfreduce")``."""
    return ProcessGroupHFReduce(store, rank, size, timeout)


def register() -> None:
    """Register ``"hfreduce"`` with torch.distributed (done once by ``import hfreduce.distributed``)."""
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND_NAME, create_process_group, devices=["cpu", "cuda"])


# One TCPStore per (host, port) that this process keeps for its life: torch's env:// rendezvous makes a new TCPStore
# at every init_process_group, and rank 0's shares the server of any still alive on its port (multi-tenant). A
# destroyed group frees its store; were it the last, rank 0's server would go with it while another rank, already
# through destroy_process_group, may be connecting its next group's store to it: that rank's rendezvous then fails
# ("Failed to recv"). Kept here, the server outlives every group, as gloo and NCCL groups made again rely on.
_KEPT_STORES: dict[tuple[str, int], Any] = {}
_KEPT_LOCK = threading.Lock()


def _keep_server(store: Any) -> None:
    """Keep the TCPStore under ``store`` (PrefixStores unwrapped), the first per (host, port), for the process."""
    base = store
    while isinstance(base, PrefixStore):
        base = base.underlying_store
    if isinstance(base, TCPStore):
        with _KEPT_LOCK:
            _KEPT_STORES.setdefault((str(base.host), int(base.port)), base)


def _node_and_local_rank(layout: Any, rank: int) -> tuple[int, int]:
    """Torch rank ``rank``'s (node, local rank) in hfreduce's layout (the peer links' error messages name them)."""
    node, local = divmod(int(layout.hf_rank(rank)), int(layout.local_world_size))
    return node, local
