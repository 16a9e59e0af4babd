"""Segment, slice, half and chunk arithmetic of the pipeline."""

from __future__ import annotations

import itertools

import pytest

from hfreduce.chunking import chunks, local_slice, pipeline_chunk, ring_blocks, segments, tree_half


@pytest.mark.parametrize("n", [0, 1, 2, 3, 7, 8, 1023, 1024, 1025, 40_000])
@pytest.mark.parametrize("num_local", [1, 2, 3, 4, 8])
def test_local_slices_tile_the_buffer_evenly(n: int, num_local: int) -> None:
    spans = [local_slice(n, num_local, lr) for lr in range(num_local)]
    assert spans[0][0] == 0 and spans[-1][1] == n
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
    sizes = [b - a for a, b in spans]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("span", [(0, 0), (5, 6), (3, 10), (0, 1 << 20)])
def test_tree_halves_split_a_slice_in_two(span: tuple[int, int]) -> None:
    first, second = tree_half(span, 0), tree_half(span, 1)
    assert first[0] == span[0] and first[1] == second[0] and second[1] == span[1]
    assert 0 <= (second[1] - second[0]) - (first[1] - first[0]) <= 1


@pytest.mark.parametrize(
    ("span", "chunk", "expect"),
    [
        ((0, 0), 4, []),
        ((0, 1), 4, [(0, 1)]),
        ((2, 10), 4, [(2, 6), (6, 10)]),
        ((2, 11), 4, [(2, 6), (6, 10), (10, 11)]),
    ],
)
def test_chunks_cover_the_span_with_a_short_last_chunk(
    span: tuple[int, int], chunk: int, expect: list[tuple[int, int]]
) -> None:
    assert chunks(span, chunk) == expect


def test_segments_cap_each_pass_at_the_shared_memory_capacity() -> None:
    assert list(segments(40_000, 16_384)) == [(0, 16_384), (16_384, 32_768), (32_768, 40_000)]
    assert list(segments(0, 16)) == []


def test_ring_blocks_cover_the_buffer() -> None:
    blocks = ring_blocks(10, 4)
    assert blocks == [(0, 2), (2, 5), (5, 7), (7, 10)]


def test_pipeline_chunks_shrink_for_mid_sizes_but_not_below_1_mib() -> None:
    mib = 1 << 18  # elements of fp32
    assert pipeline_chunk(64 * mib, 4 * mib) == 4 * mib  # 32 MiB halves: 8 chunks of the configured size
    assert pipeline_chunk(16 * mib, 4 * mib) == 2 * mib  # 8 MiB halves: 4 chunks
    assert pipeline_chunk(4 * mib, 4 * mib) == mib  # never below 1 MiB
    assert pipeline_chunk(10, 4 * mib) == mib
    assert pipeline_chunk(1 << 30, 1024) == 1024  # a configured size below 1 MiB is kept as it is
    assert pipeline_chunk(100, 1024) == 1024
