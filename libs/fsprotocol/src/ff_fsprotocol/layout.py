"""A file's chains: which chain of the chain table holds chunk i (the one definition; never change it).

The file uses ``stripe_size`` consecutive chains of its chain table from ``chain_begin_index``
(wrapping around), permuted by a Fisher-Yates shuffle driven by splitmix64 seeded with
``shuffle_seed``; chunk i lives on chain ``chains[i % stripe_size]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

_MASK = (1 << 64) - 1


def _splitmix64(state: int) -> tuple[int, int]:
    state = (state + 0x9E3779B97F4A7C15) & _MASK
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return state, z ^ (z >> 31)


def file_chains(table: Sequence[int], chain_begin_index: int, stripe_size: int, shuffle_seed: int) -> list[int]:
    """The file's chain ids in stripe order.

    Raises:
        ValueError: an empty table, or a stripe of 0 or longer than the table.
    """
    if not table:
        raise ValueError("the chain table is empty")
    if not 1 <= stripe_size <= len(table):
        raise ValueError(f"stripe size {stripe_size} must be 1..{len(table)} (the chain table's length)")
    picked = [table[(chain_begin_index + i) % len(table)] for i in range(stripe_size)]
    state = shuffle_seed & _MASK
    for i in range(stripe_size - 1, 0, -1):
        state, r = _splitmix64(state)
        j = r % (i + 1)
        picked[i], picked[j] = picked[j], picked[i]
    return picked


@dataclass(frozen=True)
class ChunkSpan:
    """Part of a byte range that falls in one chunk."""

    chunk_index: int
    chain_id: int
    offset: int  # within the chunk
    length: int
    file_offset: int


@dataclass(frozen=True)
class FileLayout:
    """Where a file's chunks live: chunk i on ``chains[i % len(chains)]``, each chunk ``chunk_size`` bytes."""

    inode_id: int
    chunk_size: int
    chains: tuple[int, ...]

    def chain_of(self, chunk_index: int) -> int:
        """The chain id that holds chunk ``chunk_index``."""
        return self.chains[chunk_index % len(self.chains)]

    def spans(self, offset: int, length: int) -> list[ChunkSpan]:
        """Split ``[offset, offset + length)`` at chunk boundaries."""
        out = []
        end = offset + length
        pos = offset
        while pos < end:
            index, within = divmod(pos, self.chunk_size)
            n = min(self.chunk_size - within, end - pos)
            out.append(ChunkSpan(index, self.chain_of(index), within, n, pos))
            pos += n
        return out
