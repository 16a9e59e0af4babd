"""Calls to every chain of a file's stripe, at once; a file's exact length from storage: the end of its last chunk."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

T = TypeVar("T")

# One chain's last chunk of the file: (chunk index, its length), or None when the chain holds no chunk of it.
LastChunk = tuple[int, int] | None


async def on_every_chain(chains: Iterable[int], call: Callable[[int], Awaitable[T]]) -> list[T]:
    """``call`` for each chain of the stripe (each once), all at once: one storage round trip, not one per chain."""
    return list(await asyncio.gather(*(call(c) for c in dict.fromkeys(chains))))


async def file_end(
    chains: Iterable[int], chunk_size: int, last_chunk: Callable[[int], Awaitable[LastChunk]]
) -> int | None:
    """The end of the file's last chunk, every chain of the stripe asked at once.

    None: no chain holds a chunk of it. Asking every chain of the stripe at once: a Close then waits for one storage
    round trip, not one per chain (16 with the default stripe).
    """
    answers = await on_every_chain(chains, last_chunk)
    ends = [index * chunk_size + length for index, length in (a for a in answers if a is not None)]
    return max(ends) if ends else None
