"""Hang detection from the ranks' collective sequence numbers (hfreduce's control-plane status).

A rank that has not entered the newest collective while other ranks have been waiting in it for longer
than the threshold is the hung (lagging) rank. Every agent checks the whole group's status and names
only its own ranks, so the report comes from the node that holds the culprit.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class RankProgress:
    rank: int
    node_rank: int
    local_rank: int
    # Collectives entered and finished; state idle / in_collective / left / dead.
    seq: int
    done: int
    op: str
    since: float
    state: str

    @classmethod
    def from_status(cls, entry: dict[str, object]) -> RankProgress:
        return cls(
            rank=int(entry["rank"]),  # type: ignore[call-overload]
            node_rank=int(entry["node_rank"]),  # type: ignore[call-overload]
            local_rank=int(entry["local_rank"]),  # type: ignore[call-overload]
            seq=int(entry["seq"]),  # type: ignore[call-overload]
            done=int(entry["done"]),  # type: ignore[call-overload]
            op=str(entry.get("op", "")),
            since=float(entry.get("since", 0.0)),  # type: ignore[arg-type]
            state=str(entry.get("state", "")),
        )


@dataclass(frozen=True, kw_only=True)
class Hang:
    rank: int
    node_rank: int
    local_rank: int
    stuck_seq: int
    waiting_seq: int
    waited_s: float

    @property
    def message(self) -> str:
        return (
            f"hang: rank {self.rank} (node rank {self.node_rank}, local rank {self.local_rank}) finished collective "
            f"{self.stuck_seq} but never entered {self.waiting_seq}, which the other ranks have waited in "
            f"for {self.waited_s:.0f} s"
        )


def lagging_ranks(ranks: list[RankProgress], now: float, threshold_s: float) -> list[Hang]:
    """Ranks behind the newest collective while others wait in it past ``threshold_s``."""
    live = [r for r in ranks if r.state in ("idle", "in_collective")]
    if len(live) < 2:
        return []
    newest = max(r.seq for r in live)
    waiting = [r for r in live if r.seq == newest and r.state == "in_collective"]
    if not waiting:
        return []
    waited = now - min(r.since for r in waiting)
    if waited < threshold_s:
        return []
    return [
        Hang(
            rank=r.rank,
            node_rank=r.node_rank,
            local_rank=r.local_rank,
            stuck_seq=r.seq,
            waiting_seq=newest,
            waited_s=waited,
        )
        for r in live
        if r.seq < newest
    ]
