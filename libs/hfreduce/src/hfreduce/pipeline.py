"""The HFReduce pipeline of one rank: intra-node reduce, up a tree, down it, and back to the other local ranks.

Each chunk of the rank's slice goes through those phases. Two trees each carry half of the slice with their own
pair of tasks (up and down), run by the rank's runner (a thread each, or one event loop), so chunks of different
phases overlap.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import numpy.typing as npt

from hfreduce import _kernels
from hfreduce.chunking import Span, chunks, exchanged, pipeline_chunk, single_chunk, tree_half
from hfreduce.cma import RemoteBuffer
from hfreduce.counters import Counters
from hfreduce.reduction import Array, DType, ReduceOp, combine_fn, from_f32, to_f32
from hfreduce.runners import Handoff, Runner, Task
from hfreduce.transport import Link
from hfreduce.trees import Tree

# Elements per block of the root's fused reduce (256 KiB of fp32: the block's operands stay in the core's
# cache between the intra-node reduce, the children's adds and the copies to the other local ranks).
FUSED_BLOCK_ELEMS = 64 * 1024
# Elements a leaf reduces and then sends at a time (512 KiB of fp32): the send copies the piece into the socket
# while it is still in the core's L2, instead of reading a whole 4 MiB chunk back from memory. Registered 2x2
# 64 MiB alone, 6 A/B runs: 3 % less wall and machine time (bench/results/hfreduce_allreduce.md); 256 KiB pieces
# gained less.
LEAF_SEND_ELEMS = 128 * 1024


@dataclasses.dataclass(frozen=True, kw_only=True)
class TreeJob:
    """One allreduce of one segment, seen from one rank.

    Attributes:
        dtype: storage dtype of ``mine``, ``res`` and ``peers``.
        wire: dtype on the wire (``dtype``, or BF16/F16 when compressing F32).
        op: the reduction.
        world_size: number of ranks (AVG divides by it).
        mine: this rank's input for the segment.
        res: where this rank's slice of the result lands (its shared slot, or ``mine`` itself).
        peers: the other local ranks' inputs for the segment, in local-rank order.
        distribute_to: buffers that also receive the final slice (registered buffers of the other ranks).
        span: this rank's slice ``[start, end)`` of the segment.
        res_base: index in the segment of ``res[0]`` (``res`` may hold only this rank's slice).
        remote: the other local ranks' private buffers (cross-memory attach): their inputs for this
            rank's slice are read from there chunk by chunk, and the final slice is written back there.
    """

    dtype: DType
    wire: DType
    op: ReduceOp
    world_size: int
    mine: Array
    res: Array
    peers: Sequence[Array]
    distribute_to: Sequence[Array]
    span: Span
    res_base: int = 0
    remote: Sequence[RemoteBuffer] = ()

    def final(self, c0: int, c1: int) -> Array:
        """Where the result of segment elements ``[c0, c1)`` lands: a view of ``res``."""
        return self.res[c0 - self.res_base : c1 - self.res_base]


class _Scratch:
    """Per-task chunk buffers, each allocated on first use, pre-touched and kept.

    Pre-touched because fresh pages copy 4x slower; allocated on first use because a task of an fp32 allreduce
    needs one or two of them, not all five.
    """

    def __init__(self, chunk_elems: int) -> None:
        self.chunk_elems = chunk_elems

    @functools.cached_property
    def f32(self) -> npt.NDArray[np.float32]:
        return np.ones(self.chunk_elems, dtype=np.float32)

    @functools.cached_property
    def f32b(self) -> npt.NDArray[np.float32]:
        return np.ones(self.chunk_elems, dtype=np.float32)

    @functools.cached_property
    def u32(self) -> npt.NDArray[np.uint32]:
        return np.ones(self.chunk_elems, dtype=np.uint32)

    @functools.cached_property
    def raw(self) -> npt.NDArray[np.uint8]:
        return np.ones(self.chunk_elems * 4, dtype=np.uint8)

    @functools.cached_property
    def peer_raw(self) -> npt.NDArray[np.uint8]:
        return np.ones(self.chunk_elems * 4, dtype=np.uint8)

    def wire(self, dtype: DType, n: int) -> Array:
        return self.raw[: n * dtype.itemsize].view(dtype.storage)


class TreeEngine:
    """Runs TreeJobs for one rank over its links to the same local rank on its tree neighbours.

    Per tree, one link per neighbour that partial chunks go up on (``up_links[t][node]``) and one that final
    chunks come down on (``down_links[t][node]``), so each socket carries data one way.

    ``exchange_runner`` runs the two-node exchange (``_exchange``): an event loop on the calling thread (the rank's
    own runner when that is one), so that a small message's send and receive overlap without a thread hand-off.
    """

    def __init__(
        self,
        *,
        node_rank: int,
        trees: tuple[Tree, Tree],
        up_links: Sequence[dict[int, Link]],
        down_links: Sequence[dict[int, Link]],
        runner: Runner,
        exchange_runner: Runner,
        chunk_elems: int,
    ) -> None:
        self.node_rank = node_rank
        self.trees = trees
        self.up_links = up_links
        self.down_links = down_links
        self.chunk_elems = chunk_elems
        self.runner = runner
        self.exchange_runner = exchange_runner
        self._scratch = [[_Scratch(chunk_elems) for _ in range(2)] for _ in range(2)]

    def run(self, job: TreeJob) -> Counters:
        """Run both trees' up and down tasks to completion; the first failure stops all of them.

        At two nodes a slice of up to a chunk is exchanged whole (``_exchange``: one trip across instead of
        three, and no hand-offs). A slice of one pipeline chunk at more nodes runs each tree's four tasks one
        after the other (no thread hand-offs): every up task depends only on up tasks below it and every down task
        on the one above, and a single chunk fits in the socket buffers, so this order cannot deadlock.
        """
        span = job.span[1] - job.span[0]
        if exchanged(len(self.trees[0].nodes), span, self.chunk_elems):
            return self._exchange(job)
        handoffs = [Handoff(), Handoff()]
        if single_chunk(span, self.chunk_elems):
            ups = [self._up(job, t, handoffs[t]) for t in (0, 1)]
            results = self.runner.run([*ups, *(self._down(job, t, handoffs[t]) for t in (0, 1))], in_order=True)
        else:
            tasks = [phase(job, t, handoffs[t]) for t in (0, 1) for phase in (self._up, self._down)]
            results = self.runner.run(tasks)
        total = Counters()
        for counters in results:
            total.add(counters)
        return total

    def _exchange(self, job: TreeJob) -> Counters:
        """At two nodes, a slice of up to a chunk: each node sends the other its whole partial and combines both.

        The partials cross through ``swap``. Both nodes combine the two partials in node order (node 0's first)
        from the same bytes, so they get bit-identical results; with a 16-bit wire or data, both partials are the
        rounded ones that crossed the wire, the final value is rounded once to the data type.
        """
        c0, c1 = job.span
        n = c1 - c0
        counters = Counters()
        if n == 0:
            return counters
        scratch, theirs = self._scratch[0][0], self._scratch[1][0]
        combine = combine_fn(job.op)
        now = time.perf_counter()
        fast = self._fast(job)
        acc = job.final(c0, c1) if fast else scratch.f32[:n]
        self._intra(job, c0, c1, acc, scratch, combine, counters)
        if fast:
            out = acc
        else:
            out = scratch.wire(job.wire, n)
            from_f32(job.wire, acc, out, scratch.u32)
        got = theirs.wire(job.wire, n)
        now = counters.lap("up_intra_reduce", now)
        self.swap(out.data.cast("B"), got.data)
        now = counters.lap("exchange", now)
        if not fast:
            to_f32(job.wire, out, acc)  # this node's partial as the other node received it
            got = theirs.f32[:n]
            to_f32(job.wire, theirs.wire(job.wire, n), got)
        first, second = (acc, got) if self.node_rank == 0 else (got, acc)
        combine(first, second, acc)
        if job.op is ReduceOp.AVG:
            np.divide(acc, np.float32(job.world_size), out=acc)
        final = job.final(c0, c1)
        if not fast:
            from_f32(job.dtype, acc, final, scratch.u32)
        for other in job.distribute_to:
            np.copyto(other[c0:c1], final)
        for remote in job.remote:
            remote.write(c0, final)
        wire_bytes = n * job.wire.itemsize
        counters.sent += wire_bytes
        counters.received += wire_bytes
        counters.reduce_inter += wire_bytes
        counters.distributed += n * (len(job.distribute_to) + len(job.remote)) * job.dtype.itemsize
        counters.lap("exchange_finalize", now)
        return counters

    def swap(self, data: memoryview, into: memoryview) -> None:
        """At two nodes: send ``data`` to the same local rank of the other node and fill ``into`` with what it sends.

        ``data`` goes out on the link that carries data from this node to the other (its up link in the tree the
        other node roots), the other's comes in on this node's root's up link, so every socket carries data one
        way. When the socket takes all of ``data`` at once (small messages), the receive blocks on the link itself,
        with no event loop.
        """
        root = 0 if self.trees[0][self.node_rank].parent < 0 else 1  # the tree this node roots
        peer = self.trees[root][self.node_rank].children[0]
        out_link, in_link = self.up_links[1 - root][peer], self.up_links[root][peer]
        sent = out_link.send_nowait(data)
        if sent == len(data):  # all out: nothing the other node needs waits here, so just receive
            in_link.recv_into(into)
        else:  # the rest goes out as the other node's data comes in
            loop = self.exchange_runner
            loop.run([loop.send(out_link, data[sent:]), loop.recv(in_link, into)])

    def _chunk(self, span: Span) -> int:
        return pipeline_chunk(span[1] - span[0], self.chunk_elems)

    def _fast(self, job: TreeJob) -> bool:
        return job.dtype is DType.F32 and job.wire is DType.F32

    def _fused_root(self, job: TreeJob, t: int) -> bool:
        """Whether this rank, root of tree ``t``, reduces each chunk in one blocked pass (``_root_chunk``).

        It takes fp32 on the wire, at most two children, and other local ranks to read from (one rank per node
        has nothing to keep in cache between the steps).
        """
        node = self.trees[t][self.node_rank]
        others = job.peers or job.remote or job.distribute_to
        return self._fast(job) and node.parent < 0 and 0 < len(node.children) <= 2 and bool(others)

    def _up(self, job: TreeJob, t: int, handoff: Handoff) -> Task:
        node = self.trees[t][self.node_rank]
        parent = self.up_links[t][node.parent] if node.parent >= 0 else None
        children = [self.up_links[t][c] for c in node.children]
        scratch = self._scratch[t][0]
        combine = combine_fn(job.op)
        counters = Counters()
        wire_bytes = job.wire.itemsize
        fused = self._fused_root(job, t)
        for c0, c1 in chunks(tree_half(job.span, t), self._chunk(job.span)):
            n = c1 - c0
            now = time.perf_counter()
            if fused:
                partials = [buf[:n] for buf in (scratch.f32, scratch.f32b)[: len(children)]]
                for link, into in zip(children, partials, strict=True):
                    yield from self.runner.recv(link, into.data)
                    counters.received += n * wire_bytes
                now = counters.lap("up_recv", now)
                self._root_chunk(job, c0, c1, partials, scratch.peer_raw.view(np.float32), combine, counters)
                handoff.put((c0, c1))
                counters.lap("up_intra_reduce", now)
                continue
            acc = job.final(c0, c1) if self._fast(job) else scratch.f32[:n]
            if parent is not None and not children and self._fast(job) and (job.peers or job.remote):
                for s0, s1 in chunks((c0, c1), LEAF_SEND_ELEMS):  # each piece sent while it is in cache
                    piece = acc[s0 - c0 : s1 - c0]
                    self._intra(job, s0, s1, piece, scratch, combine, counters)
                    yield from self.runner.send(parent, piece.data)
                counters.lap("up_reduce_send", now)
                counters.sent += n * wire_bytes
                continue
            self._intra(job, c0, c1, acc, scratch, combine, counters)
            now = counters.lap("up_intra_reduce", now)
            for link in children:
                got = scratch.wire(job.wire, n)
                yield from self.runner.recv(link, got.data)
                now = counters.lap("up_recv", now)
                self._accumulate(job.wire, acc, got, scratch, combine)
                now = counters.lap("up_inter_reduce", now)
                counters.received += n * wire_bytes
                counters.reduce_inter += n * wire_bytes
            if parent is None:
                self._finalize(job, c0, c1, acc, scratch)
                handoff.put((c0, c1))
                counters.lap("up_finalize", now)
                continue
            if self._fast(job):
                yield from self.runner.send(parent, acc.data)
            else:
                out = scratch.wire(job.wire, n)
                from_f32(job.wire, acc, out, scratch.u32)
                yield from self.runner.send(parent, out.data)
            counters.lap("up_send", now)
            counters.sent += n * wire_bytes
        return counters

    @staticmethod
    def _root_chunk(
        job: TreeJob,
        c0: int,
        c1: int,
        children: Sequence[npt.NDArray[np.float32]],
        fetched: npt.NDArray[np.float32],
        combine: Callable[[Array, Array, Array], object],
        counters: Counters,
    ) -> None:
        """The root's whole reduce of chunk ``[c0, c1)`` in one pass of cache-sized blocks.

        The local ranks' data, then the children's partials, the AVG division, and the final block written to the
        other local ranks (which the down task then skips). Same arithmetic, in the same order, as the unfused
        phases: bit-identical results, the same bytes counted.

        A sum whose buffers are all in this process's memory (registered buffers, shared slots) and 4-byte
        aligned is one call of the compiled kernel, which blocks the chunk itself; the rest (MAX/MIN, private
        buffers of other local ranks fetched block by block into ``fetched``, or a caller's array off a 4-byte
        boundary, which numpy copes with) go block by block through numpy (``_root_blocks``).
        """
        final = job.final(c0, c1)
        mine, shared = job.mine[c0:c1], [peer[c0:c1] for peer in job.peers]
        others = [other[c0:c1] for other in job.distribute_to]
        operands = [mine, *shared, *children]
        in_process = job.op in (ReduceOp.SUM, ReduceOp.AVG) and not job.remote
        if in_process and all(a.flags.aligned for a in (final, *operands, *others)):
            divisor = float(job.world_size) if job.op is ReduceOp.AVG else 0.0
            _kernels.sum_into(final, operands, others, divisor)
        else:
            TreeEngine._root_blocks(job, c0, c1, final, [mine, *shared], children, others, fetched, combine)
        n, size, num_peers = c1 - c0, job.dtype.itemsize, len(shared) + len(job.remote)
        if num_peers:
            counters.reduce_read += n * (1 + num_peers) * size
            counters.reduce_written += n * size
        counters.copied_in += n * len(job.remote) * size
        counters.reduce_inter += n * len(children) * size
        counters.distributed += n * (len(others) + len(job.remote)) * size

    @staticmethod
    def _root_blocks(
        job: TreeJob,
        c0: int,
        c1: int,
        final: npt.NDArray[np.float32],
        local: Sequence[npt.NDArray[np.float32]],
        children: Sequence[npt.NDArray[np.float32]],
        others: Sequence[npt.NDArray[np.float32]],
        fetched: npt.NDArray[np.float32],
        combine: Callable[[Array, Array, Array], object],
    ) -> None:
        """``_root_chunk`` in numpy, block by block.

        ``local`` is this rank's chunk and the other local ranks' in shared memory; the private ones
        (``job.remote``) are read into ``fetched`` just before they are added, and the final block is written
        back to them.
        """
        world = np.float32(job.world_size)
        for b0 in range(0, c1 - c0, FUSED_BLOCK_ELEMS):
            b1 = min(b0 + FUSED_BLOCK_ELEMS, c1 - c0)
            acc = final[b0:b1]
            for i in range(1, len(local) + len(job.remote)):
                if i < len(local):
                    peer = local[i][b0:b1]
                else:
                    peer = fetched[: b1 - b0]
                    job.remote[i - len(local)].read(c0 + b0, peer)
                combine(local[0][b0:b1] if i == 1 else acc, peer, acc)
            for child in children:
                combine(acc, child[b0:b1], acc)
            if job.op is ReduceOp.AVG:
                np.divide(acc, world, out=acc)
            for other in others:
                np.copyto(other[b0:b1], acc)
            for remote in job.remote:
                remote.write(c0 + b0, acc)

    def _intra(
        self,
        job: TreeJob,
        c0: int,
        c1: int,
        acc: npt.NDArray[np.float32],
        scratch: _Scratch,
        combine: Callable[[Array, Array, Array], object],
        counters: Counters,
    ) -> None:
        """Reduce the local ranks' chunk, ``acc = mine[c] (op) peers[0][c] (op) ...``, in fp32.

        For fp32 ``acc`` is the result slot itself, so the reduce writes there with no copy.
        """
        n = c1 - c0
        num_peers = len(job.peers) + len(job.remote)
        if not num_peers:  # one rank per node: the fp32 result slot already is the input
            if not self._fast(job):
                to_f32(job.dtype, job.mine[c0:c1], acc)
            return
        rest = self._peer_chunks(job, c0, c1, scratch, counters)
        if self._fast(job):
            combine(job.mine[c0:c1], next(rest), acc)
        else:
            to_f32(job.dtype, job.mine[c0:c1], acc)
        for peer in rest:
            self._accumulate(job.dtype, acc, peer, scratch, combine)
        counters.reduce_read += n * (1 + num_peers) * job.dtype.itemsize
        counters.reduce_written += n * job.dtype.itemsize

    @staticmethod
    def _peer_chunks(job: TreeJob, c0: int, c1: int, scratch: _Scratch, counters: Counters) -> Iterator[Array]:
        """The other local ranks' chunk ``[c0, c1)``, each consumed before the next.

        Shared memory is read in place; private memory is fetched into a scratch chunk, still in cache when the
        reduce reads it.
        """
        for peer in job.peers:
            yield peer[c0:c1]
        n = c1 - c0
        for remote in job.remote:
            got = scratch.peer_raw[: n * job.dtype.itemsize].view(job.dtype.storage)
            remote.read(c0, got)
            counters.copied_in += n * job.dtype.itemsize
            yield got

    @staticmethod
    def _accumulate(
        dtype: DType,
        acc: npt.NDArray[np.float32],
        x: Array,
        scratch: _Scratch,
        combine: Callable[[Array, Array, Array], object],
    ) -> None:
        if dtype is DType.BF16:  # numpy cannot widen bf16 bits itself
            wide = scratch.f32b[: len(x)]
            to_f32(dtype, x, wide)
            combine(acc, wide, acc)
        else:
            combine(acc, x, acc)

    def _finalize(self, job: TreeJob, c0: int, c1: int, acc: npt.NDArray[np.float32], scratch: _Scratch) -> None:
        """At the root: divide for AVG, round once to the wire and data dtypes, store the final chunk."""
        if job.op is ReduceOp.AVG:
            np.divide(acc, np.float32(job.world_size), out=acc)
        if self._fast(job):
            return
        n = c1 - c0
        if job.wire is not job.dtype:  # the root keeps exactly what the other nodes will receive
            rounded = scratch.wire(job.wire, n)
            from_f32(job.wire, acc, rounded, scratch.u32)
            to_f32(job.wire, rounded, acc)
        from_f32(job.dtype, acc, job.final(c0, c1), scratch.u32)

    def _down(self, job: TreeJob, t: int, handoff: Handoff) -> Task:
        node = self.trees[t][self.node_rank]
        parent = self.down_links[t][node.parent] if node.parent >= 0 else None
        children = [self.down_links[t][c] for c in node.children]
        scratch = self._scratch[t][1]
        counters = Counters()
        direct = job.wire is job.dtype
        for c0, c1 in chunks(tree_half(job.span, t), self._chunk(job.span)):
            n = c1 - c0
            final = job.final(c0, c1)
            now = time.perf_counter()
            if parent is None:
                yield from self._handed_off(handoff, (c0, c1))
                payload = final if direct else scratch.wire(job.wire, n)
                if not direct:
                    from_f32(job.wire, final, payload, scratch.u32)  # exact: already rounded at the root
                now = counters.lap("down_wait_reduce", now)
            elif direct:
                yield from self.runner.recv(parent, final.data)
                payload = final
                now = counters.lap("down_recv", now)
            else:
                payload = scratch.wire(job.wire, n)
                yield from self.runner.recv(parent, payload.data)
                to_f32(job.wire, payload, final)
                now = counters.lap("down_recv", now)
            if parent is not None:
                counters.received += n * job.wire.itemsize
            for link in children:
                yield from self.runner.send(link, payload.data)
                counters.sent += n * job.wire.itemsize
            if children:
                now = counters.lap("down_send", now)
            if parent is None and self._fused_root(job, t):
                continue  # the up task copied the final chunk to the other local ranks
            for other in job.distribute_to:
                np.copyto(other[c0:c1], final)
                counters.distributed += n * job.dtype.itemsize
            for remote in job.remote:
                remote.write(c0, final)
                counters.distributed += n * job.dtype.itemsize
            if job.distribute_to or job.remote:
                counters.lap("down_distribute", now)
        return counters

    def _handed_off(self, handoff: Handoff, expect: Span) -> Task:
        """Wait until the root's up task hands chunk ``expect`` over (its reduce is done)."""
        got = yield from self.runner.take(handoff, f"reduce of chunk {expect}")
        if got != expect:
            raise RuntimeError(f"pipeline out of order: got chunk {got}, expected {expect}")
