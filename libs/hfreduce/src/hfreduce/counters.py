"""Byte accounting per phase, and the memory-traffic model it is checked against (paper section IV-D3)."""

from __future__ import annotations

import dataclasses
import time

from hfreduce.chunking import exchanged, leader_reduces, local_slice, segments, tree_half
from hfreduce.trees import Tree


@dataclasses.dataclass
class Counters:
    """Bytes one rank moved, by phase (all cumulative since the group was made).

    Attributes:
        copied_in: written into this rank's shared-memory slot from its private buffer (D2H analogue).
        reduce_read: read by the intra-node reduce (every local rank's copy of this rank's slice).
        reduce_written: written by the intra-node reduce (the node partial of this rank's slice).
        sent: sent on inter-node links (wire bytes).
        received: received on inter-node links (wire bytes).
        reduce_inter: received bytes combined into a partial on the way up a tree.
        copied_out: copied from shared memory into this rank's private buffer (H2D analogue).
        distributed: final results written into the other local ranks' registered buffers.
        collectives: number of collectives run.
        seconds: wall time by phase (``lap``); pipeline phases are summed over the four tasks (two
            trees, up and down), which interleave, so they can add up to more than the collective took. Not compared.
    """

    copied_in: int = 0
    reduce_read: int = 0
    reduce_written: int = 0
    sent: int = 0
    received: int = 0
    reduce_inter: int = 0
    copied_out: int = 0
    distributed: int = 0
    collectives: int = 0
    seconds: dict[str, float] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def add(self, other: Counters) -> None:
        """Add every count and phase time of ``other`` to this one's."""
        # spelled out: this runs several times per collective, and dataclasses.fields() with getattr/setattr
        # is some 50 Python calls each time (tests/unit/test_counters.py checks that every field is added)
        self.copied_in += other.copied_in
        self.reduce_read += other.reduce_read
        self.reduce_written += other.reduce_written
        self.sent += other.sent
        self.received += other.received
        self.reduce_inter += other.reduce_inter
        self.copied_out += other.copied_out
        self.distributed += other.distributed
        self.collectives += other.collectives
        for phase, sec in other.seconds.items():
            self.seconds[phase] = self.seconds.get(phase, 0.0) + sec

    def lap(self, phase: str, since: float) -> float:
        """Add the time from ``since`` (a ``time.perf_counter()``) to now to ``phase``; return now."""
        now = time.perf_counter()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - since
        return now

    def memory_ops(self) -> int:
        """Bytes of host-memory traffic in the paper's accounting (each phase's reads or writes)."""
        return (
            self.copied_in
            + self.reduce_read
            + self.reduce_written
            + self.sent
            + self.received
            + self.reduce_inter
            + self.copied_out
            + self.distributed
        )

    def copy(self) -> Counters:
        """An independent copy (its own ``seconds`` dict), safe to hand to another thread."""
        return dataclasses.replace(self, seconds=dict(self.seconds))


def expected_allreduce_counters(
    *,
    num_elems: int,
    itemsize: int,
    wire_itemsize: int,
    num_local: int,
    local_rank: int,
    node_rank: int,
    trees: tuple[Tree, Tree],
    segment_elems: int,
    chunk_elems: int,
    registered: bool,
    direct: bool = False,
) -> Counters:
    """What one tree allreduce must add to a rank's counters (the model the tests hold the code to).

    ``direct``: an ordinary buffer reduced with cross-memory attach (no staging): ``copied_in`` counts
    the other local ranks' copies of this rank's slice read from their memory, ``distributed`` the final
    slice written into their buffers. ``chunk_elems`` is the group's pipeline chunk: at two nodes a slice of up to
    a chunk is exchanged whole (``chunking.exchanged``), so the rank combines all of the received slice, not half.
    A small message at several ranks per node (``chunking.leader_reduces``) is local rank 0's alone: it receives
    the other ranks' buffers (or reads them in shared memory, registered), reduces them, runs the inter-node part on
    the whole buffer and sends the result back (or writes it into their registered buffers).
    """
    out = Counters(collectives=1)
    if leader_reduces(num_local, num_elems * itemsize):
        if local_rank != 0:
            return out
        out = expected_allreduce_counters(
            num_elems=num_elems,
            itemsize=itemsize,
            wire_itemsize=wire_itemsize,
            num_local=1,
            local_rank=0,
            node_rank=node_rank,
            trees=trees,
            segment_elems=segment_elems,
            chunk_elems=chunk_elems,
            registered=False,
        )
        out.distributed = num_elems * (num_local - 1) * itemsize
        out.copied_in = 0 if registered else out.distributed
        out.reduce_read = num_elems * num_local * itemsize
        out.reduce_written = num_elems * itemsize
        return out
    whole = registered or direct
    seg_list = [(0, num_elems)] if whole else list(segments(num_elems, segment_elems))
    for seg_start, seg_end in seg_list:
        m = seg_end - seg_start
        start, end = local_slice(m, num_local, local_rank)
        mine = end - start
        if num_local > 1:
            out.reduce_read += mine * num_local * itemsize
            out.reduce_written += mine * itemsize
            if registered:
                out.distributed += mine * (num_local - 1) * itemsize
            elif direct:
                out.copied_in += mine * (num_local - 1) * itemsize
                out.distributed += mine * (num_local - 1) * itemsize
            else:
                out.copied_in += (m - mine) * itemsize
                out.copied_out += m * itemsize
        if exchanged(len(trees[0].nodes), mine, chunk_elems):
            out.sent += mine * wire_itemsize
            out.received += mine * wire_itemsize
            out.reduce_inter += mine * wire_itemsize
            continue
        for t, tree in enumerate(trees):
            h0, h1 = tree_half((start, end), t)
            half = (h1 - h0) * wire_itemsize
            node = tree[node_rank]
            up = 0 if node.parent < 0 else 1
            out.sent += half * (up + len(node.children))
            out.received += half * (len(node.children) + up)
            out.reduce_inter += half * len(node.children)
    return out


def paper_memory_ops_per_byte(num_local: int, *, gdrcopy: bool = True) -> int:
    """The paper's per-node memory operations, in units of one GPU's buffer (24 for 8 GPUs, GDRCopy)."""
    d2h, intra, inter = num_local, num_local + 1, 5
    h2d = 2 if gdrcopy else num_local
    return d2h + intra + inter + h2d
