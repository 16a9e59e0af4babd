"""Which chain holds a chunk: the permutation (part of the on-disk format) and byte ranges split by chunk."""

from __future__ import annotations

import pytest

from ff_fsprotocol.layout import FileLayout, file_chains


def test_layout_permutation_is_fixed_and_complete() -> None:
    table = list(range(101, 113))
    chains = file_chains(table, chain_begin_index=10, stripe_size=5, shuffle_seed=12345)
    assert sorted(chains) == [101, 102, 103, 111, 112]  # 5 consecutive from index 10, wrapping
    assert chains == file_chains(table, 10, 5, 12345)  # deterministic
    # The permutation is part of the on-disk format: pinned here so that it never changes.
    assert chains == [102, 101, 111, 112, 103]
    seeds = {tuple(file_chains(table, 0, 6, s)) for s in range(50)}
    assert len(seeds) > 10  # seeds shuffle
    with pytest.raises(ValueError):
        file_chains(table, 0, 13, 1)
    lay = FileLayout(7, 1 << 20, tuple(chains))
    spans = lay.spans((1 << 20) - 10, 30)
    assert [(s.chunk_index, s.offset, s.length) for s in spans] == [(0, (1 << 20) - 10, 10), (1, 0, 20)]
    assert [s.chain_id for s in spans] == [chains[0], chains[1]]
