"""Flat ring collectives over all ranks: the comparison allreduce, and allgather, reduce-scatter and broadcast.

Each rank sends over TCP to the next rank in zone order.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hfreduce.chunking import Span, chunks, ring_blocks
from hfreduce.counters import Counters
from hfreduce.reduction import Array, DType, ReduceOp, combine_fn, from_f32, to_f32
from hfreduce.runners import Runner, Task
from hfreduce.transport import Link


class RingEngine:
    """Ring position ``pos`` of ``size``; sends to ``next_link``, receives from ``prev_link``."""

    def __init__(
        self,
        *,
        pos: int,
        size: int,
        next_link: Link | None,
        prev_link: Link | None,
        runner: Runner,
        chunk_elems: int,
    ) -> None:
        self.pos = pos
        self.size = size
        self.next_link = next_link
        self.prev_link = prev_link
        self.runner = runner
        self.chunk_elems = chunk_elems
        self._f32 = [np.ones(chunk_elems, dtype=np.float32) for _ in range(2)]
        self._u32 = np.ones(chunk_elems, dtype=np.uint32)
        self._raw = np.ones(chunk_elems * 4, dtype=np.uint8)

    def allreduce(self, flat: Array, dtype: DType, op: ReduceOp) -> Counters:
        """Reduce-scatter then allgather, in place; AVG divides the owned block once."""
        counters = Counters(collectives=1)
        blocks = ring_blocks(len(flat), self.size)
        self._reduce_scatter_steps(flat, blocks, dtype, op, counters)
        if op is ReduceOp.AVG:
            self._divide(flat, blocks[self.pos], dtype)
        self._allgather_steps(flat, blocks, dtype, counters)
        return counters

    def reduce_scatter(self, work: Array, dtype: DType, op: ReduceOp, order: list[int]) -> Span:
        """Reduce ``work`` (scratch, modified) so the block of ring position ``pos`` is complete.

        ``order[i]`` is the block index that ring position ``i`` ends up owning. Returns that span.
        """
        block = len(work) // self.size
        blocks = [(order[i] * block, (order[i] + 1) * block) for i in range(self.size)]
        self._reduce_scatter_steps(work, blocks, dtype, op, Counters())
        if op is ReduceOp.AVG:
            self._divide(work, blocks[self.pos], dtype)
        return blocks[self.pos]

    def allgather(self, out: Array, dtype: DType, order: list[int]) -> Counters:
        """``out`` holds this rank's block at ``order[pos]``; fill every other block."""
        block = len(out) // self.size
        blocks = [(order[i] * block, (order[i] + 1) * block) for i in range(self.size)]
        counters = Counters(collectives=1)
        self._allgather_steps(out, blocks, dtype, counters)
        return counters

    def broadcast(self, flat: Array, src_pos: int) -> Counters:
        """Pipeline ``flat`` from ring position ``src_pos`` along the ring (size-1 hops)."""
        counters = Counters(collectives=1)
        last = (src_pos - 1) % self.size
        for c0, c1 in chunks((0, len(flat)), self.chunk_elems):
            view = flat[c0:c1].data
            if self.pos != src_pos and self.prev_link is not None:
                self.prev_link.recv_into(view)
                counters.received += view.nbytes
            if self.pos != last and self.next_link is not None:
                self.next_link.send(view)
                counters.sent += view.nbytes
        return counters

    def _reduce_scatter_steps(
        self, flat: Array, blocks: list[Span], dtype: DType, op: ReduceOp, counters: Counters
    ) -> None:
        combine = combine_fn(op)
        for step in range(self.size - 1):
            send = blocks[(self.pos - step - 1) % self.size]
            recv = blocks[(self.pos - step - 2) % self.size]
            self._exchange(flat, send, recv, dtype, combine, counters)

    def _allgather_steps(self, flat: Array, blocks: list[Span], dtype: DType, counters: Counters) -> None:
        for step in range(self.size - 1):
            send = blocks[(self.pos - step) % self.size]
            recv = blocks[(self.pos - step - 1) % self.size]
            self._exchange(flat, send, recv, dtype, None, counters)

    def _exchange(
        self,
        flat: Array,
        send: Span,
        recv: Span,
        dtype: DType,
        combine: Callable[[Array, Array, Array], object] | None,
        counters: Counters,
    ) -> None:
        """Send one block to the next rank while receiving (and combining) one from the previous."""
        self.runner.run(
            [self._send_block(flat, send, dtype, counters), self._recv_block(flat, recv, dtype, combine, counters)]
        )

    def _send_block(self, flat: Array, span: Span, dtype: DType, counters: Counters) -> Task:
        assert self.next_link is not None  # size > 1 here
        for c0, c1 in chunks(span, self.chunk_elems):
            yield from self.runner.send(self.next_link, flat[c0:c1].data)
        counters.sent += (span[1] - span[0]) * dtype.itemsize

    def _recv_block(
        self,
        flat: Array,
        span: Span,
        dtype: DType,
        combine: Callable[[Array, Array, Array], object] | None,
        counters: Counters,
    ) -> Task:
        assert self.prev_link is not None  # size > 1 here
        for c0, c1 in chunks(span, self.chunk_elems):
            n = c1 - c0
            if combine is None:
                yield from self.runner.recv(self.prev_link, flat[c0:c1].data)
            else:
                got = self._raw[: n * dtype.itemsize].view(dtype.storage)
                yield from self.runner.recv(self.prev_link, got.data)
                self._combine(flat[c0:c1], got, dtype, combine)
                counters.reduce_inter += n * dtype.itemsize
            counters.received += n * dtype.itemsize

    def _combine(self, dst: Array, src: Array, dtype: DType, combine: Callable[[Array, Array, Array], object]) -> None:
        if dtype is DType.F32:
            combine(dst, src, dst)
            return
        n = len(dst)
        a, b = self._f32[0][:n], self._f32[1][:n]
        to_f32(dtype, dst, a)
        to_f32(dtype, src, b)
        combine(a, b, a)
        from_f32(dtype, a, dst, self._u32)

    def _divide(self, flat: Array, span: Span, dtype: DType) -> None:
        for c0, c1 in chunks(span, self.chunk_elems):
            n = c1 - c0
            acc = self._f32[0][:n]
            to_f32(dtype, flat[c0:c1], acc)
            np.divide(acc, np.float32(self.size), out=acc)
            from_f32(dtype, acc, flat[c0:c1], self._u32)
