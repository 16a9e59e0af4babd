"""Pure arithmetic of the pipeline: segments, per-local-rank slices, tree halves and chunks."""

from __future__ import annotations

from collections.abc import Iterator

Span = tuple[int, int]


def segments(num_elems: int, segment_elems: int) -> Iterator[Span]:
    """Consecutive ``[start, end)`` spans of at most ``segment_elems`` covering ``num_elems``."""
    for start in range(0, num_elems, segment_elems):
        yield start, min(start + segment_elems, num_elems)


def local_slice(num_elems: int, num_local: int, local_rank: int) -> Span:
    """The part of a buffer that ``local_rank`` reduces for its node (contiguous, sizes differ by <= 1)."""
    return num_elems * local_rank // num_local, num_elems * (local_rank + 1) // num_local


def tree_half(span: Span, tree: int) -> Span:
    """Tree 0 carries the first half of a slice, tree 1 the second (the odd element goes to tree 1)."""
    start, end = span
    mid = start + (end - start) // 2
    return (start, mid) if tree == 0 else (mid, end)


def chunks(span: Span, chunk_elems: int) -> list[Span]:
    """Pipeline chunks of ``span``; the last one may be short, an empty span has none."""
    start, end = span
    return [(c, min(c + chunk_elems, end)) for c in range(start, end, chunk_elems)]


MIN_CHUNK_ELEMS = 1 << 18  # 1 MiB of fp32
MIN_CHUNKS_PER_HALF = 4


def pipeline_chunk(slice_elems: int, chunk_elems: int) -> int:
    """Chunk size for a slice: ``chunk_elems``, or smaller so that each tree half pipelines enough chunks.

    Smaller, not below ``MIN_CHUNK_ELEMS``, so that each half has at least ``MIN_CHUNKS_PER_HALF`` chunks. It
    depends only on the slice length, which the same local rank of every node shares, so tree neighbours cut the
    same chunks.
    """
    floor = min(chunk_elems, MIN_CHUNK_ELEMS)
    return max(floor, min(chunk_elems, slice_elems // 2 // MIN_CHUNKS_PER_HALF))


def single_chunk(slice_elems: int, chunk_elems: int) -> bool:
    """Whether a slice is one pipeline chunk (``pipeline_chunk``): nothing to pipeline, latency is all that counts."""
    return slice_elems <= pipeline_chunk(slice_elems, chunk_elems)


def exchanged(num_nodes: int, slice_elems: int, chunk_elems: int) -> bool:
    """Whether a slice is exchanged whole between two nodes (``TreeEngine``) instead of pipelined through the trees.

    Up to ``chunk_elems`` (what a rank's scratch chunk holds): the same bytes cross as through the trees, on one
    thread with no hand-offs and no chunk-by-chunk dependencies, for a combine of the whole slice instead of half
    of it (2x1, 4 MiB: 15 % less CPU per allreduce than the threads' pipeline, bench/results/hfreduce_allreduce.md).
    """
    return num_nodes == 2 and slice_elems <= chunk_elems


# Up to this many bytes, a node's local ranks hand their whole buffers to local rank 0 (``leader_reduces``).
LEADER_MAX_BYTES = 64 << 10


def leader_reduces(num_local: int, nbytes: int) -> bool:
    """Whether local rank 0 reduces a collective of ``nbytes`` for its whole node (``Runtime._allreduce_small``).

    At several ranks per node a small message is latency-bound: the sliced paths bracket the inter-node part with
    two node barriers (five trips in a row for a rank other than local rank 0), the leader's path takes three
    (the buffers in, the inter-node part, the result back).
    """
    return num_local > 1 and 0 < nbytes <= LEADER_MAX_BYTES


def ring_blocks(num_elems: int, world_size: int) -> list[Span]:
    """The ``world_size`` contiguous blocks a ring reduce-scatter splits a buffer into."""
    return [local_slice(num_elems, world_size, i) for i in range(world_size)]
