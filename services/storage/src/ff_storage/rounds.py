"""How the head and the replicas cut a batch of chain updates into rounds (``writes.ChainWriter``).

A round touches each chunk once and holds a bounded amount of chunk contents; at the head, a run of writes to one
chunk may go as one update (a carrier whose ``members`` they are) of the span they cover.
"""

from __future__ import annotations

from collections.abc import Callable

from ff_storage.core.chunks import ChunkKey, UpdateKey
from ff_storage.core.requests import Payload, UpdateKind
from ff_storage.node_state import Target, Update

# A run of writes to one chunk goes down the chain as one write of the span it covers where that weighs at most this
# per chain round trip it saves (a durable chain-of-3 round trip is ~5-7 ms here; loopback moves ~1 MiB per hop in
# ~1 ms)
MERGED_BYTES_PER_ROUND = 1 << 20


def plan_rounds(
    updates: list[Update], size_of: Callable[[Update], int] = lambda _: 0, budget: int | None = None
) -> list[list[Update]]:
    """Split into rounds that each touch a chunk at most once and hold at most ``budget`` bytes of chunk contents.

    A chunk's update goes in a round after those of its earlier updates (updates to one chunk apply in order). The
    contents (``size_of``; one update over the budget goes alone) are what a round builds in memory: each chunk
    written is built whole (copy on write), at the head and at every replica, so a batch of one-byte writes at the
    ends of many large chunks would otherwise build them all at once.
    """
    rounds: list[list[Update]] = []
    used: list[int] = []
    last: dict[ChunkKey, int] = {}  # chunk -> the round of its latest update so far
    for u in updates:
        need = size_of(u)
        k = last.get(u.key, -1) + 1
        while k < len(rounds) and budget is not None and used[k] and used[k] + need > budget:
            k += 1
        if k == len(rounds):
            rounds.append([])
            used.append(0)
        rounds[k].append(u)
        used[k] += need
        last[u.key] = k
    return rounds


def merged_writes(updates: list[Update]) -> list[Update]:
    """``updates`` with each run of two or more writes to one chunk as one carrier update whose ``members`` they are.

    A run has no other update of the chunk in between; its carrier stands where its first write was, so the
    updates of a chunk keep their order. A run goes as one only where the span it sends down the chain (from the
    first byte any member writes to the last) weighs no more than ``MERGED_BYTES_PER_ROUND`` per chain round trip it
    saves: two pages at the two ends of a 4 MiB chunk go as two writes, a database's pages in a small file as one.
    """
    out = _runs_of_writes(updates)
    kept: list[Update] = []
    for u in out:
        if u.members is None:
            kept.append(u)
            continue
        span = max(m.offset + m.length for m in u.members) - min(m.offset for m in u.members)
        if span <= MERGED_BYTES_PER_ROUND * (len(u.members) - 1):
            kept.append(u)
        else:  # each write its own round, in order
            kept.extend(u.members)
    return kept


def _runs_of_writes(updates: list[Update]) -> list[Update]:
    out: list[Update] = []
    runs: dict[ChunkKey, int] = {}  # chunk -> where its run of writes so far is in ``out``
    for u in updates:
        at = runs.get(u.key)
        if u.kind is not UpdateKind.WRITE or at is None or out[at].chunk_size != u.chunk_size:
            if u.kind is UpdateKind.WRITE:
                runs[u.key] = len(out)
            else:
                runs.pop(u.key, None)
            out.append(u)
            continue
        carrier = out[at]
        if carrier.members is None:  # the run's second write: its first becomes a member too
            carrier = Update(key=u.key, kind=UpdateKind.WRITE, chunk_size=u.chunk_size, members=[out[at]])
            out[at] = carrier
        carrier.members.append(u)  # type: ignore[union-attr]  # set just above
    return out


def first_copies(members: list[Update]) -> list[tuple[int, Payload]]:
    """The ``(offset, data)`` of each member, a write whose id came earlier in the run left out (applied once).

    One write sent twice in one batch (same id) is a retry of itself: applied again after a later write over it, the
    later write's bytes would be lost. Without ids (``update-ids`` off) every member applies, as each write did alone.
    """
    seen: set[UpdateKey] = set()
    writes: list[tuple[int, Payload]] = []
    for m in members:
        if m.update_id is None or m.update_id not in seen:
            writes.append((m.offset, m.data))
        if m.update_id is not None:
            seen.add(m.update_id)
    return writes


def _committed_length(target: Target, key: ChunkKey) -> int:
    meta = target.engine.get(key)
    return meta.length if meta is not None else 0


def content_bytes(target: Target, u: Update) -> int:
    """The bytes of the chunk ``u`` builds in memory here (its new content, the committed copy it starts from)."""
    if u.kind is UpdateKind.REMOVE:
        return 0
    if u.full:
        return len(u.data)
    end = u.length if u.kind is UpdateKind.TRUNCATE else u.offset + u.length
    if u.members is not None:
        end = max(m.offset + m.length for m in u.members)
    return max(end, _committed_length(target, u.key))
