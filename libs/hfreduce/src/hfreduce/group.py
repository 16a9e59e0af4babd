"""The engine room of a group: rendezvous, links, shared memory, and the collectives on flat numpy arrays.

The arrays hold the storage dtype. ``api.Group`` wraps it with tensor handling and async handles. What a rank does
once as it joins (the table's check, the links to other nodes, the cross-memory probe) is in ``joining``; the
segments the local ranks share, and registered buffers, in ``node_memory``.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hfreduce import cma
from hfreduce.agreement import WIRE_BYTES, CallSignature, CollectiveMismatchError
from hfreduce.chunking import leader_reduces, local_slice, segments
from hfreduce.config import GroupConfig
from hfreduce.control import ControlClient, ControlServer
from hfreduce.counters import Counters
from hfreduce.errors import GroupClosedError, HFReduceError, PeerFailureError
from hfreduce.joining import TREE_DOWN, TREE_UP, check_table, open_links, probe_cross_memory, ring_links, wanted_links
from hfreduce.local import LocalComm
from hfreduce.node_memory import Registered, shared_segments
from hfreduce.pipeline import TreeEngine, TreeJob
from hfreduce.reduction import Array, DType, ReduceOp, combine_fn, from_f32, to_f32
from hfreduce.ring import RingEngine
from hfreduce.runners import EventLoop, Runner, choose
from hfreduce.shm import Segment
from hfreduce.transport import Link, LinkError, tune_tcp
from hfreduce.trees import Tree, build_trees, node_order

logger = logging.getLogger(__name__)

_ALIGN_BYTES = 64
# Marks in the node barrier's signature of the registered all-gather and reduce-scatter, so that local ranks in
# different kinds of collective on the same sizes do not pass it together: high bits, which no registered
# allreduce's signature differs by (its buffer index sits at bit 40). node_memory's barrier before shared segments
# are made has bit 61.
_ALLGATHER_BARRIER = 1 << 62
_REDUCE_SCATTER_BARRIER = 1 << 63
_GROW_BYTES = 4 << 20  # slots grow in steps of this, so a run of growing sizes does not remap each time


class Runtime:
    """One rank's share of a group. Not thread-safe: ``api.Group`` runs collectives on one thread."""

    def __init__(self, config: GroupConfig, control_listener: socket.socket | None = None) -> None:
        self.config = config
        self.rank = config.rank
        self._control_listener = control_listener
        self.num_local = config.local_world_size
        self.chunk_elems = config.chunk_size_bytes // 4
        self.counters = Counters()
        self.seq = 0
        self.broken: BaseException | None = None
        self.server: ControlServer | None = None
        self.control: ControlClient | None = None
        self.local: LocalComm | None = None
        # [tree][node rank of the neighbour]: the links partials go up on, and the links final chunks come down on
        self.up_links: list[dict[int, Link]] = [{}, {}]
        self.down_links: list[dict[int, Link]] = [{}, {}]
        self.ring_next: Link | None = None
        self.ring_prev: Link | None = None
        self.slots: list[Segment] = []
        self.registered: dict[int, Registered] = {}
        self._parity = 0
        self._closed = False
        self.runner = choose(config.pipeline, config.local_world_size, config.timeout_s, self.abort)
        # the two-node exchange of small slices runs on the calling thread's event loop (pipeline.TreeEngine)
        self.loop: Runner = self.runner if self.runner.mode == "loop" else EventLoop(config.timeout_s, self.abort)
        try:
            self._setup()
        except BaseException:
            self.close(wait_for_ranks_s=0.0)
            raise

    # ----- setup -----

    def _setup(self) -> None:
        cfg = self.config
        if self.rank == 0:
            self.server = ControlServer(
                port=cfg.master_port,
                world_size=cfg.world_size,
                timeout_s=cfg.timeout_s,
                listener=self._control_listener,
            )
            self.server.start()
        self.control = ControlClient(cfg.master_addr, cfg.master_port, cfg.timeout_s)
        with socket.create_server(("", 0), backlog=128) as listener:
            listener.settimeout(cfg.timeout_s)
            hello = {
                "rank": self.rank,
                "node_rank": cfg.node_rank,
                "local_rank": cfg.local_rank,
                "world_size": cfg.world_size,
                "num_nodes": cfg.num_nodes,
                "local_world_size": cfg.local_world_size,
                "zone": cfg.zone,
                "host": self.control.local_host,
                "port": listener.getsockname()[1],
            }
            reply = self.control.rendezvous(hello)
            self.token: str = reply["token"]
            self.table: list[dict[str, Any]] = reply["ranks"]
            check_table(self.table, cfg)
            zones = [str(self.table[n * self.num_local]["zone"]) for n in range(cfg.num_nodes)]
            self.trees: tuple[Tree, Tree] = build_trees(zones)
            self.ring_order = [n * self.num_local + lr for n in node_order(zones) for lr in range(self.num_local)]
            self._connect(listener)
        self.local = LocalComm(
            name=f"hfreduce-{self.token}-{cfg.node_rank}",
            local_rank=cfg.local_rank,
            ranks=[cfg.node_rank * self.num_local + i for i in range(self.num_local)],
            timeout_s=cfg.timeout_s,
        )
        self.cross_memory = probe_cross_memory(self.local, cfg)
        self.slot_bytes = 0  # shared slots grow on first use, up to cfg.shm_slot_bytes
        self.res_bytes = 0
        self.tree = TreeEngine(
            node_rank=cfg.node_rank,
            trees=self.trees,
            up_links=self.up_links,
            down_links=self.down_links,
            runner=self.runner,
            exchange_runner=self.loop,
            chunk_elems=self.chunk_elems,
        )
        pos = self.ring_order.index(self.rank)
        self.ring = RingEngine(
            pos=pos,
            size=cfg.world_size,
            next_link=self.ring_next,
            prev_link=self.ring_prev,
            runner=self.runner,
            chunk_elems=self.chunk_elems,
        )
        logger.info("hfreduce rank %d joined: %s", self.rank, cfg)

    def _connect(self, listener: socket.socket) -> None:
        """Make every link (``joining.open_links``) and file it by tree, direction and neighbour node, or ring side."""
        cfg = self.config
        wanted = wanted_links(self.trees, self.ring_order, cfg.node_rank, cfg.local_rank, self.num_local)
        socks = open_links(listener, self.rank, self.table, wanted, cfg.timeout_s)
        for (peer, channel), sock in socks.items():
            tune_tcp(sock, cfg.socket_buffer_bytes)
            link = Link(sock, peer, cfg.timeout_s)
            if channel in TREE_UP:
                self.up_links[TREE_UP.index(channel)][peer // self.num_local] = link
            elif channel in TREE_DOWN:
                self.down_links[TREE_DOWN.index(channel)][peer // self.num_local] = link
        if cfg.world_size > 1:
            (nxt, nxt_channel), (prv, prv_channel) = ring_links(self.ring_order, self.rank)
            self.ring_next = Link(socks[(nxt, nxt_channel)], nxt, cfg.timeout_s)
            self.ring_prev = Link(socks[(prv, prv_channel)], prv, cfg.timeout_s)

    def _ensure_slots(self, nbytes: int) -> None:
        """Grow the shared slots to hold ``nbytes``, capped at ``shm_slot_bytes``.

        A node-local collective: every local rank grows at the same call, since they reduce the same sizes.
        """
        cap = self.config.shm_slot_bytes
        want = min(cap, -(-nbytes // _GROW_BYTES) * _GROW_BYTES)
        if want <= self.slot_bytes:
            return
        for seg in self.slots:
            seg.close()
        self.slots, self.slot_bytes = [], 0
        res_bytes = _align(want // self.num_local + 8)
        assert self.local is not None
        self.slots = shared_segments(
            self.local,
            f"hfreduce-slot-{self.rank}",
            want + 2 * res_bytes,
            node_rank=self.config.node_rank,
            local_rank=self.config.local_rank,
        )
        self.slot_bytes, self.res_bytes, self._parity = want, res_bytes, 0

    def register(self, nbytes: int) -> Registered:
        """Allocate ``nbytes`` of shared memory on every local rank (call in the same order everywhere)."""
        index = len(self.registered)
        assert self.local is not None
        segs = shared_segments(
            self.local,
            f"hfreduce-buf-{self.rank}-{index}",
            nbytes,
            node_rank=self.config.node_rank,
            local_rank=self.config.local_rank,
            huge=True,
        )
        reg = Registered(index=index, nbytes=nbytes, segments=segs)
        self.registered[index] = reg
        return reg

    # ----- collectives on flat arrays -----

    def run(self, name: str, body: Callable[[], Counters], call: CallSignature | None = None) -> None:
        """Run one collective with sequence numbering, accounting and failure attribution.

        With ``call``, the ranks first check that they all make the same call (``agree``).
        """
        if self._closed:
            raise GroupClosedError("the group was destroyed")
        if self.broken is not None:
            raise GroupClosedError(f"the group is broken by an earlier failure: {self.broken}")
        assert self.control is not None
        self.seq += 1
        start = time.perf_counter()
        self.control.notify({"type": "enter", "rank": self.rank, "seq": self.seq, "op": name})
        notify_s = time.perf_counter() - start
        try:
            if call is not None:
                self.agree(call)
            counters = body()
        except (LinkError, TimeoutError, OSError, RuntimeError) as exc:
            if isinstance(exc, HFReduceError):
                self.broken = exc
                self.abort()
                raise
            raise self._attribute(exc) from exc
        except BaseException as exc:  # a bug, MemoryError, ^C: the links may be mid-chunk all the same
            self.broken = exc
            self.abort()
            raise
        counters.collectives = 1
        now = time.perf_counter()
        self.control.notify({"type": "done", "rank": self.rank, "seq": self.seq})
        counters.seconds["notify"] = notify_s + time.perf_counter() - now
        counters.lap("collective", start)
        self.counters.add(counters)

    def agree(self, call: CallSignature) -> None:
        """Check that the previous rank on the ring makes the same ``call`` as this rank (see ``agreement``).

        Raises:
            CollectiveMismatchError: it does not; the control server learns why, so that every other rank of the
                group, whose links this rank's failure closes, is told the same.
        """
        if self.ring_next is None or self.ring_prev is None:
            return
        self.ring_next.send(call.pack())
        got = bytearray(WIRE_BYTES)
        self.ring_prev.recv_into(memoryview(got))
        theirs = CallSignature.unpack(bytes(got))
        prev = self.ring_prev.peer
        differ = call.differences(theirs, same_node=prev // self.num_local == self.config.node_rank)
        if not differ:
            return
        reason = (
            f"called {theirs.describe()} as collective {self.seq}, rank {self.rank} {call.describe()} "
            f"({', '.join(differ)} {'differs' if len(differ) == 1 else 'differ'})"
        )
        assert self.control is not None
        self.abort()  # wakes the ranks that agreed with their own neighbours and wait on this one's data
        self.control.notify({"type": "mismatch", "rank": prev, "seq": self.seq, "reason": reason, "from": self.rank})
        if self.server is not None:  # as in _attribute: the others learn why before this process may exit
            self.server.wait_settled(prev, min(self.config.timeout_s, 5.0))
        raise CollectiveMismatchError(f"rank {prev} {reason}", rank=prev)

    def _attribute(self, exc: BaseException) -> PeerFailureError:
        """Tear the group down and ask the control server which rank is to blame."""
        self.abort()
        suspect = exc.peer if isinstance(exc, LinkError) else self.rank
        kind = exc.kind if isinstance(exc, LinkError) else "timeout"
        assert self.control is not None
        try:
            reply = self.control.request(
                {"type": "blame", "rank": self.rank, "seq": self.seq, "suspect": suspect, "kind": kind},
                timeout_s=self.config.timeout_s,
            )
            culprit, reason = int(reply["rank"]), str(reply["reason"])
        except (OSError, ConnectionError, ValueError):
            culprit, reason = 0, "died (its control server is gone)"
        if self.server is not None:  # the other ranks learn the culprit before this process may exit
            self.server.wait_settled(culprit, min(self.config.timeout_s, 5.0))
        entry = self.table[culprit]
        err = PeerFailureError(
            rank=culprit,
            node_rank=int(entry["node_rank"]),
            local_rank=int(entry["local_rank"]),
            reason=reason,
            detail=f"seen by rank {self.rank} in collective {self.seq}: {exc}",
        )
        self.broken = err
        return err

    def allreduce(
        self,
        flat: Array,
        dtype: DType,
        op: ReduceOp,
        *,
        keep: bool = True,
        registered: Registered | None = None,
        reduce_only: bool = False,
    ) -> Counters:
        """In-place allreduce; with ``keep=False`` this rank's buffer is left unchanged (reduce).

        ``reduce_only`` (a reduce: every rank passes it) keeps every buffer but ``dst``'s unchanged, so it
        stages through shared memory rather than working in the ranks' buffers directly.
        """
        if self.config.algorithm == "ring" and registered is None:
            work = flat if keep else flat.copy()
            return self.ring.allreduce(work, dtype, op) if self.config.world_size > 1 else Counters()
        wire = dtype
        if dtype is DType.F32 and self.config.compression is not None:
            wire = DType.BF16 if self.config.compression == "bf16" else DType.F16
        n = len(flat)
        if leader_reduces(self.num_local, n * dtype.itemsize):
            return self._allreduce_small(flat, dtype, wire, op, keep=keep, registered=registered)
        if registered is not None:
            return self._allreduce_registered(registered, n, dtype, wire, op)
        if self.num_local == 1:
            work = flat if keep else flat.copy()
            return self.tree.run(self._job(dtype, wire, op, mine=work, res=work, span=(0, n)))
        total = Counters()
        if n == 0:
            return total
        if self.cross_memory and not reduce_only:
            return self._allreduce_direct(flat, dtype, wire, op)
        self._ensure_slots(n * dtype.itemsize)
        seg_elems = self.slot_bytes // dtype.itemsize
        for s0, s1 in segments(n, seg_elems):
            total.add(self._allreduce_segment(flat[s0:s1], dtype, wire, op, keep))
        return total

    def _job(
        self,
        dtype: DType,
        wire: DType,
        op: ReduceOp,
        *,
        mine: Array,
        res: Array,
        span: tuple[int, int],
        peers: Sequence[Array] = (),
        distribute_to: Sequence[Array] = (),
        res_base: int = 0,
        remote: Sequence[cma.RemoteBuffer] = (),
    ) -> TreeJob:
        return TreeJob(
            dtype=dtype,
            wire=wire,
            op=op,
            world_size=self.config.world_size,
            mine=mine,
            res=res,
            span=span,
            peers=peers,
            distribute_to=distribute_to,
            res_base=res_base,
            remote=remote,
        )

    def _allreduce_small(
        self, flat: Array, dtype: DType, wire: DType, op: ReduceOp, *, keep: bool, registered: Registered | None
    ) -> Counters:
        """A small message at several ranks per node (``chunking.leader_reduces``): local rank 0 does it all.

        The other local ranks send their buffers to it over the node's local links and wait for the result. It
        reduces them in fp32 in local-rank order (its own first), rounded once to the data type, runs the
        inter-node part on that node partial as a rank alone on its node would (the other ranks' links stay
        idle), and sends the result back. Registered buffers stay zero-copy: the other ranks send only their
        signature, local rank 0 reads their buffers and writes the result into them in shared memory. With
        ``keep=False`` this rank's buffer stays unchanged (reduce; registered buffers all receive the result).
        """
        assert self.local is not None
        n, size = len(flat), dtype.itemsize
        sig = _signature(self.seq, n, dtype, op) ^ (1 << 42)
        inline = registered is None  # the buffers travel over the local links
        if self.config.local_rank != 0:
            into = flat if keep else np.empty_like(flat)
            payload, result = (flat, into) if inline else (flat[:0], flat[:0])
            self.local.send_to_leader(sig, payload.view(np.uint8).data, result.view(np.uint8).data)
            return Counters()
        if registered is None:
            others = [np.empty_like(flat) for _ in range(self.num_local - 1)]
        else:
            others = [seg.array(dtype.storage, n) for seg in registered.segments[1:]]
        self.local.gather(sig, [(other if inline else other[:0]).view(np.uint8).data for other in others])
        acc, wide = np.empty(n, dtype=np.float32), np.empty(n, dtype=np.float32)
        to_f32(dtype, flat, acc)
        combine = combine_fn(op)
        for other in others:
            to_f32(dtype, other, wide)
            combine(acc, wide, acc)
        partial = acc if dtype is DType.F32 else np.empty_like(flat)
        if partial is not acc:
            from_f32(dtype, acc, partial, wide.view(np.uint32))
        counters = self.tree.run(self._job(dtype, wire, op, mine=partial, res=partial, span=(0, n)))
        if not inline:
            for other in others:
                np.copyto(other, partial)
        self.local.answer((partial if inline else partial[:0]).view(np.uint8).data)
        if keep or not inline:
            np.copyto(flat, partial)
        counters.copied_in += n * (self.num_local - 1) * size if inline else 0
        counters.reduce_read += n * self.num_local * size
        counters.reduce_written += n * size
        counters.distributed += n * (self.num_local - 1) * size
        return counters

    def _allreduce_segment(self, part: Array, dtype: DType, wire: DType, op: ReduceOp, keep: bool) -> Counters:
        assert self.local is not None
        me, m, num_local = self.config.local_rank, len(part), self.num_local
        counters = Counters()
        spans = [local_slice(m, num_local, o) for o in range(num_local)]
        inputs = [seg.array(dtype.storage, m) for seg in self.slots]
        offset = self.slot_bytes + self._parity * self.res_bytes
        results = [seg.array(dtype.storage, b - a, offset) for seg, (a, b) in zip(self.slots, spans, strict=True)]
        self._parity ^= 1  # results alternate: a slow rank may still copy out of the other half
        now = time.perf_counter()
        for o, (a, b) in enumerate(spans):
            if o != me:
                np.copyto(inputs[me][a:b], part[a:b])
                counters.copied_in += (b - a) * dtype.itemsize
        now = counters.lap("copy_in", now)
        self.local.barrier(_signature(self.seq, m, dtype, op))
        now = counters.lap("barrier_in", now)
        peers = [inputs[o] for o in range(num_local) if o != me]
        counters.add(
            self.tree.run(
                self._job(
                    dtype, wire, op, mine=part, res=results[me], peers=peers, span=spans[me], res_base=spans[me][0]
                )
            )
        )
        now = counters.lap("tree", now)
        self.local.barrier(_signature(self.seq, m, dtype, op) + 1)
        now = counters.lap("barrier_out", now)
        if keep:
            for (a, b), res in zip(spans, results, strict=True):
                np.copyto(part[a:b], res)
                counters.copied_out += (b - a) * dtype.itemsize
            counters.lap("copy_out", now)
        return counters

    def _allreduce_direct(self, flat: Array, dtype: DType, wire: DType, op: ReduceOp) -> Counters:
        """Allreduce ordinary buffers without staging, through cross-memory attach.

        This rank reduces its slice in place in its own buffer, reading the other local ranks' copies of the slice
        straight from their memory, and writes each final chunk straight into their buffers; the two node
        barriers bracket the accesses.
        """
        assert self.local is not None
        me, n = self.config.local_rank, len(flat)
        sig = _signature(self.seq, n, dtype, op)
        start = time.perf_counter()
        rows = self.local.barrier(sig ^ (1 << 43), cma.PID_ADDR.pack(os.getpid(), cma.address(flat)))
        counters = Counters()
        now = counters.lap("barrier_in", start)
        remote = []
        for lr, row in enumerate(rows):
            if lr != me:
                pid, base = cma.PID_ADDR.unpack(row)
                rank = self.config.node_rank * self.num_local + lr
                remote.append(cma.RemoteBuffer(pid=pid, base=base, itemsize=dtype.itemsize, rank=rank))
        span = local_slice(n, self.num_local, me)
        counters.add(self.tree.run(self._job(dtype, wire, op, mine=flat, res=flat, span=span, remote=remote)))
        now = counters.lap("tree", now)
        self.local.barrier(sig + 1)  # every rank's final slices are in every buffer
        counters.lap("barrier_out", now)
        return counters

    def _allreduce_registered(self, reg: Registered, n: int, dtype: DType, wire: DType, op: ReduceOp) -> Counters:
        assert self.local is not None
        me = self.config.local_rank
        bufs = [seg.array(dtype.storage, n) for seg in reg.segments]
        others = [bufs[o] for o in range(self.num_local) if o != me]
        start = time.perf_counter()
        self.local.barrier(_signature(self.seq, n, dtype, op) ^ ((reg.index + 1) << 40))
        barrier_s = time.perf_counter() - start
        counters = self.tree.run(
            self._job(
                dtype,
                wire,
                op,
                mine=bufs[me],
                res=bufs[me],
                peers=others,
                distribute_to=others,
                span=local_slice(n, self.num_local, me),
            )
        )
        now = counters.lap("tree", start + barrier_s)
        counters.seconds["barrier_in"] = barrier_s
        self.local.barrier(_signature(self.seq, n, dtype, op) + 1)
        counters.lap("barrier_out", now)
        return counters

    def allgather_registered(self, reg: Registered, n: int, dtype: DType, out: Array | None) -> Counters:
        """All-gather inside a registered buffer of ``n`` elements (``world_size`` blocks), into ``out`` or in place.

        On entry block ``rank`` holds this rank's input; on return every rank's block is in ``out`` (``n``
        elements), or, when ``out`` is None, in this rank's registered buffer.

        At one or two nodes nothing is reduced and no zeros are sent: at two nodes each rank swaps its block with
        the same local rank of the other node (into its registered buffer, at the sender's block), then, between two
        node barriers, copies every block from the local rank's registered buffer that holds it (block ``q`` is in
        local rank ``q % local_world_size``'s). At more nodes it is a SUM allreduce of the buffer with zeros
        outside this rank's block (x + 0 is exact; sent uncompressed), copied to ``out``. Either way every block
        holds its rank's input bit for bit.
        """
        assert self.local is not None
        world, num_local, me = self.config.world_size, self.num_local, self.config.local_rank
        block = n // world
        bufs = [seg.array(dtype.storage, n) for seg in reg.segments]
        mine = bufs[me]
        if self.config.num_nodes > 2:
            mine[: self.rank * block] = 0
            mine[(self.rank + 1) * block :] = 0
            if leader_reduces(num_local, n * dtype.itemsize):
                counters = self._allreduce_small(mine, dtype, dtype, ReduceOp.SUM, keep=True, registered=reg)
            else:
                counters = self._allreduce_registered(reg, n, dtype, dtype, ReduceOp.SUM)
            if out is not None:
                np.copyto(out, mine)
                counters.copied_out += n * dtype.itemsize
            return counters
        counters = Counters()
        now = time.perf_counter()
        if self.config.num_nodes == 2:
            peer = (1 - self.config.node_rank) * num_local + me
            own, theirs = mine[self.rank * block : (self.rank + 1) * block], mine[peer * block : (peer + 1) * block]
            self.tree.swap(own.data.cast("B"), theirs.data.cast("B"))
            counters.sent += block * dtype.itemsize
            counters.received += block * dtype.itemsize
            now = counters.lap("exchange", now)
        sig = _signature(self.seq, n, dtype, ReduceOp.SUM) ^ ((reg.index + 1) << 40) ^ _ALLGATHER_BARRIER
        self.local.barrier(sig)
        now = counters.lap("barrier_in", now)
        for q in range(world):
            src = bufs[q % num_local]
            if out is None and src is mine:
                continue
            np.copyto((mine if out is None else out)[q * block : (q + 1) * block], src[q * block : (q + 1) * block])
            counters.copied_out += block * dtype.itemsize
        now = counters.lap("copy_out", now)
        self.local.barrier(sig + 1)  # no local rank writes its buffer again before the others have read it
        counters.lap("barrier_out", now)
        return counters

    def reduce_scatter_registered(
        self, reg: Registered, n: int, dtype: DType, op: ReduceOp, out: Array | None
    ) -> Counters:
        """Reduce-scatter of a registered buffer of ``n`` elements (``world_size`` blocks), into ``out`` or in place.

        Every rank's whole buffer is its input; on return ``out`` (``n / world_size`` elements), or when ``out`` is
        None this rank's block of its registered buffer, holds the reduction of block ``rank`` over the ranks.

        fp32 at one or two nodes, without compression: nothing but the blocks a rank needs is reduced, and only a
        block crosses between nodes. Between two node barriers each rank reduces, in its own registered buffer,
        the node's partial of its block and (at two nodes) of the block of the same local rank of the other node,
        swaps the latter with that rank for its partial of this rank's block, and combines the two partials (a
        sum of two is the same either way round; AVG divides once, at the end). Otherwise it is an allreduce of
        the buffer of which this rank keeps its block.
        """
        assert self.local is not None
        world, num_local, me = self.config.world_size, self.num_local, self.config.local_rank
        block = n // world
        bufs = [seg.array(dtype.storage, n) for seg in reg.segments]
        mine = bufs[me]
        own = slice(self.rank * block, (self.rank + 1) * block)
        if self.config.num_nodes > 2 or dtype is not DType.F32 or self.config.compression is not None:
            counters = self.allreduce(mine, dtype, op, registered=reg)
            if out is not None:
                np.copyto(out, mine[own])
                counters.copied_out += block * dtype.itemsize
            return counters
        combine, counters = combine_fn(op), Counters()
        sig = _signature(self.seq, n, dtype, op) ^ ((reg.index + 1) << 40) ^ _REDUCE_SCATTER_BARRIER
        now = time.perf_counter()
        self.local.barrier(sig)
        now = counters.lap("barrier_in", now)
        peer = (1 - self.config.node_rank) * num_local + me
        wanted = [own] if self.config.num_nodes == 1 else [slice(peer * block, (peer + 1) * block), own]
        for part in wanted:  # the node's partials, each into this rank's own buffer (no other rank reads there)
            for o in range(num_local):
                if o != me:
                    combine(mine[part], bufs[o][part], mine[part])
        counters.reduce_read += len(wanted) * num_local * block * dtype.itemsize
        counters.reduce_written += len(wanted) * block * dtype.itemsize
        now = counters.lap("up_intra_reduce", now)
        result = mine[own] if out is None else out
        if self.config.num_nodes == 2:
            got = result if out is not None else np.empty(block, dtype=np.float32)
            self.tree.swap(mine[wanted[0]].data.cast("B"), got.data.cast("B"))
            combine(mine[own], got, result)
            counters.sent += block * dtype.itemsize
            counters.received += block * dtype.itemsize
            counters.reduce_inter += block * dtype.itemsize
            now = counters.lap("exchange", now)
        elif out is not None:
            np.copyto(out, mine[own])
        if op is ReduceOp.AVG:
            np.divide(result, np.float32(world), out=result)
        self.local.barrier(sig + 1)  # no local rank writes its buffer again before the others have read it
        counters.lap("barrier_out", now)
        return counters

    def broadcast(self, flat: Array, src: int) -> Counters:
        """Copy global rank ``src``'s ``flat`` into every rank's, along the ring."""
        if self.config.world_size == 1:
            return Counters()
        return self.ring.broadcast(flat, self.ring_order.index(src))

    def allgather(self, out: Array, inp: Array, dtype: DType) -> Counters:
        """Fill ``out`` with every rank's ``inp``, by global rank, along the ring."""
        n = len(inp)
        np.copyto(out[self.rank * n : (self.rank + 1) * n], inp)
        if self.config.world_size == 1:
            return Counters()
        return self.ring.allgather(out, dtype, self.ring_order)

    def reduce_scatter(self, out: Array, inp: Array, dtype: DType, op: ReduceOp) -> Counters:
        """Reduce every rank's ``inp`` along the ring; ``out`` receives this rank's block (``inp`` is not changed).

        It returns empty counters: a reduce-scatter's traffic is not counted.
        """
        work = inp.copy()
        if self.config.world_size > 1:
            a, b = self.ring.reduce_scatter(work, dtype, op, self.ring_order)
        else:
            a, b = 0, len(work)  # a world of one: sum, average, max and min are the value itself
        np.copyto(out, work[a:b])
        return Counters()

    # ----- teardown -----

    def _links(self) -> list[Link]:
        """Every link of this rank to other nodes' ranks: the trees', then the ring's."""
        links = [link for by_node in (*self.up_links, *self.down_links) for link in by_node.values()]
        return links + [link for link in (self.ring_next, self.ring_prev) if link is not None]

    def abort(self) -> None:
        """Fail every blocked send/recv of this rank now (used once a collective has failed)."""
        for link in self._links():
            link.abort()
        if self.local is not None:
            self.local.abort()

    def close(self, wait_for_ranks_s: float | None = None) -> None:
        """Say goodbye and release links, shared memory and, on rank 0, the control server (idempotent).

        Rank 0's server waits up to ``wait_for_ranks_s`` (default: ``timeout_s``, at most 5 s; none once the
        group is broken) for the other ranks to leave, so that a rank still closing is not taken for dead.
        """
        if self._closed:
            return
        self._closed = True
        if self.control is not None:
            self.control.notify({"type": "bye", "rank": self.rank})
        if self.server is not None:
            wait = min(self.config.timeout_s, 5.0) if wait_for_ranks_s is None else wait_for_ranks_s
            self.server.stop(wait_for_ranks_s=wait if self.broken is None else 0.0)
        self.runner.close()
        if self.loop is not self.runner:
            self.loop.close()
        for link in self._links():
            link.close()
        if self.local is not None:
            self.local.close()
        if self.control is not None:
            self.control.close()
        for seg in self.slots:
            seg.close()
        for reg in self.registered.values():
            for seg in reg.segments:
                seg.close()


def _signature(seq: int, n: int, dtype: DType, op: ReduceOp) -> int:
    """What local ranks must agree on for one collective (checked at the node barrier)."""
    return (seq << 44) ^ (n << 4) ^ (list(DType).index(dtype) << 2) ^ list(ReduceOp).index(op)


def _align(nbytes: int) -> int:
    return (nbytes + _ALIGN_BYTES - 1) // _ALIGN_BYTES * _ALIGN_BYTES
