"""The byte-accounting model against the paper's memory-traffic figures."""

from __future__ import annotations

import dataclasses

import pytest

from hfreduce.counters import Counters, expected_allreduce_counters, paper_memory_ops_per_byte
from hfreduce.trees import build_trees


def node_totals(
    num_nodes: int, num_local: int, nbytes: int, registered: bool, direct: bool = False, chunk_elems: int = 1 << 20
) -> list[Counters]:
    trees = build_trees([""] * num_nodes)
    totals = []
    for node in range(num_nodes):
        total = Counters()
        for lr in range(num_local):
            total.add(
                expected_allreduce_counters(
                    num_elems=nbytes // 4,
                    itemsize=4,
                    wire_itemsize=4,
                    num_local=num_local,
                    local_rank=lr,
                    node_rank=node,
                    trees=trees,
                    segment_elems=1 << 40,
                    chunk_elems=chunk_elems,
                    registered=registered,
                    direct=direct,
                )
            )
        totals.append(total)
    return totals


def test_paper_figures() -> None:
    assert paper_memory_ops_per_byte(8) == 24
    assert paper_memory_ops_per_byte(8, gdrcopy=False) == 30


@pytest.mark.parametrize("num_nodes", [2, 3, 4, 8, 16])
def test_double_tree_moves_two_buffers_per_node_on_average(num_nodes: int) -> None:
    size = 1 << 20
    totals = node_totals(num_nodes, 8, size, registered=False)
    sent = sum(t.sent for t in totals)
    # every tree edge carries its half up and down: 2 (n - 1) buffers in all, i.e. busbw's 2(n-1)/n per node
    assert sent == 2 * (num_nodes - 1) * size
    assert sum(t.received for t in totals) == sent
    assert max(t.sent for t in totals) <= 2 * size  # no node sends more than the paper's "2 reads"


@pytest.mark.parametrize("num_local", [1, 2])
def test_two_nodes_exchange_a_slice_of_up_to_a_chunk_whole(num_local: int) -> None:
    """At two nodes a slice of up to a chunk is exchanged: each node sends, receives and combines all of it. A
    longer slice goes through the trees: the same bytes sent and received, half of them combined."""
    chunk_elems = 1 << 18
    for elems, combined in ((chunk_elems, 1.0), (chunk_elems + 2, 0.5)):
        size = elems * num_local * 4
        for total in node_totals(2, num_local, size, registered=False, chunk_elems=chunk_elems):
            assert total.sent == total.received == size
            assert total.reduce_inter == combined * size


def test_interior_node_matches_the_paper_per_phase() -> None:
    size = 1 << 20
    totals = node_totals(16, 8, size, registered=False)
    interior = max(totals, key=lambda t: t.sent)
    assert interior.sent == 2 * size and interior.received == 2 * size
    assert interior.reduce_inter == size  # "reduce-add 1 read"
    assert interior.reduce_read == 8 * size and interior.reduce_written == size  # "8 reads + 1 write"
    assert interior.copied_in == 7 * size  # the paper's 8 D2H writes, less the own slice read in place
    assert interior.copied_out == 8 * size  # MemcpyAsync-style H2D: 8 reads
    assert interior.memory_ops() == 29 * size  # paper without GDRCopy: 30


def test_registered_buffers_drop_the_copies() -> None:
    size = 1 << 20
    interior = max(node_totals(16, 8, size, registered=True), key=lambda t: t.sent)
    assert interior.copied_in == 0 and interior.copied_out == 0
    assert interior.distributed == 7 * size
    assert interior.memory_ops() == 21 * size


@pytest.mark.parametrize(("num_local", "staged", "direct"), [(2, 3, 2), (8, 15, 14)])
def test_cross_memory_copies_fewer_bytes_than_staging(num_local: int, staged: int, direct: int) -> None:
    """Ordinary buffers: reading the peers' copies of the own slice and writing the final slice into their
    buffers moves (L-1) + (L-1) buffers per node, against (L-1) in and L out when staging through shm."""
    size = 1 << 20
    staged_total = max(node_totals(16, num_local, size, registered=False), key=lambda t: t.sent)
    direct_total = max(node_totals(16, num_local, size, registered=False, direct=True), key=lambda t: t.sent)
    assert staged_total.copied_in + staged_total.copied_out == staged * size
    assert direct_total.copied_in + direct_total.distributed == direct * size
    assert direct_total.copied_out == 0
    assert direct_total.memory_ops() == staged_total.memory_ops() - size


def test_one_node_sends_nothing() -> None:
    (total,) = node_totals(1, 4, 4096, registered=False)
    assert total.sent == total.received == 0
    assert total.reduce_read == 4 * 4096


def test_add_sums_every_field() -> None:
    names = [f.name for f in dataclasses.fields(Counters) if f.name != "seconds"]
    total = Counters(**{name: i + 1 for i, name in enumerate(names)}, seconds={"up_recv": 1.0})
    total.add(Counters(**{name: 100 * (i + 1) for i, name in enumerate(names)}, seconds={"up_recv": 2.0, "x": 3.0}))
    assert [getattr(total, name) for name in names] == [101 * (i + 1) for i in range(len(names))]
    assert total.seconds == {"up_recv": 3.0, "x": 3.0}
