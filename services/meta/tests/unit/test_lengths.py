"""A file's exact length from its chains' last chunks (what Close and session collection ask storage)."""

from __future__ import annotations

import asyncio

from ff_meta.core.lengths import LastChunk, file_end

MIB = 1 << 20


def test_the_end_is_the_furthest_last_chunk_over_the_chains() -> None:
    last = {11: (4, 100), 12: (7, 5), 13: None}

    async def ask(chain_id: int) -> LastChunk:
        return last[chain_id]

    assert asyncio.run(file_end([11, 12, 13, 11], 4 * MIB, ask)) == 7 * 4 * MIB + 5
    assert asyncio.run(file_end([13], 4 * MIB, ask)) is None
    assert asyncio.run(file_end([], 4 * MIB, ask)) is None


def test_every_chain_is_asked_at_once_and_each_once() -> None:
    """Each answer waits until every chain has been asked: asked one after another, the first never returns
    (the guard below turns that hang into a failure). A chain listed twice in the stripe is asked once."""
    chains = [21, 22, 23, 24, 21]
    asked: list[int] = []
    all_asked = asyncio.Event()

    async def ask(chain_id: int) -> LastChunk:
        asked.append(chain_id)
        if len(asked) == len(set(chains)):
            all_asked.set()
        await all_asked.wait()
        return (chain_id - 20, 10)

    async def run() -> int | None:
        return await asyncio.wait_for(file_end(chains, MIB, ask), timeout=10)

    assert asyncio.run(run()) == 4 * MIB + 10
    assert sorted(asked) == [21, 22, 23, 24]
