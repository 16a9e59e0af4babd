"""Calls to every chain of a file's stripe at once, of as few nodes as serve them; a file's end from its last chunks."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TypeVar

T = TypeVar("T")

# One chain's last chunk of the file: (chunk index, its length), or None when the chain holds no chunk of it.
LastChunk = tuple[int, int] | None


async def on_every_chain(chains: Iterable[int], call: Callable[[int], Awaitable[T]]) -> list[T]:
    """``call`` for each chain of the stripe (each once), all at once: one storage round trip, not one per chain."""
    return list(await asyncio.gather(*(call(c) for c in dict.fromkeys(chains))))


def file_end(answers: Iterable[LastChunk], chunk_size: int) -> int | None:
    """The end of the file's last chunk from its chains' answers; None: no chain holds a chunk of it."""
    ends = [index * chunk_size + length for index, length in (a for a in answers if a is not None)]
    return max(ends) if ends else None


def nodes_to_ask(serving: Mapping[int, Sequence[int]]) -> dict[int, list[int]]:
    """Which node to ask about which chains, few nodes in all: node -> its chains.

    ``serving``: each chain's nodes that may answer for it, in the order to prefer them (head first). A node answers
    a QueryLastChunk for every chain it serves in one call, and each call costs both sides far more than its work
    (a gRPC round trip: ~1 ms of Python each), so a file's stripe is asked of few nodes, not once per chain (greedily:
    the node serving the most chains not yet covered, again and again (ties: the one nearer the chains' heads, then the
    lower node id). A chain no node serves is left out (the caller asks it alone, with fresh routing).
    """
    left = {chain: list(nodes) for chain, nodes in serving.items() if nodes}
    out: dict[int, list[int]] = {}
    while left:
        rank: dict[int, tuple[int, int]] = {}  # node -> (chains it covers, sum of its places in their lists)
        for nodes in left.values():
            for place, node in enumerate(dict.fromkeys(nodes)):
                covered, places = rank.get(node, (0, 0))
                rank[node] = (covered + 1, places + place)
        best = min(rank, key=lambda n: (-rank[n][0], rank[n][1], n))
        out[best] = [chain for chain, nodes in left.items() if best in nodes]
        left = {chain: nodes for chain, nodes in left.items() if best not in nodes}
    return out
