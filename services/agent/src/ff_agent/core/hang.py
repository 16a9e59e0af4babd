"""Hang detection from the ranks' collective sequence numbers and from the state of the agent's rank processes.

The sequence numbers are hfreduce's control-plane status.

A rank that has not entered the newest collective while other ranks have been waiting in it for longer
than the threshold is the hung (lagging) rank. Every agent checks the whole group's status and names
only its own ranks, so the report comes from the node that holds the culprit.

A rank process that stays stopped (SIGSTOP, or a tracer) makes no progress at all, wherever it stopped: also
inside a collective it had entered, where the sequence numbers cannot tell it from the ranks waiting for it
(and a rank behind it in a pipeline of collectives would be named instead). Its own agent sees the state;
it names it after half the threshold, before the lag rule can blame a bystander.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class RankProgress:
    """One rank's place in the group's collectives, as hfreduce's control server reports it."""

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
        """Parse one entry of ``hfreduce.query_status``.

        Raises:
            KeyError: a required field is missing.
            ValueError: a field is not a number.
            TypeError: a field is not a number.
        """
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
    """A rank found hung: stopped, or behind a collective the others wait in (``waited_s`` seconds so far)."""

    rank: int
    node_rank: int
    local_rank: int
    stuck_seq: int
    waiting_seq: int
    waited_s: float
    stopped: bool = False  # its process is stopped (state T); the sequence numbers are not known

    @property
    def message(self) -> str:
        """The failure message the scheduler and the user see."""
        if self.stopped:
            return (
                f"hang: rank {self.rank} (node rank {self.node_rank}, local rank {self.local_rank}) is stopped "
                f"(SIGSTOP or a tracer) and has made no progress for {self.waited_s:.0f} s"
            )
        return (
            f"hang: rank {self.rank} (node rank {self.node_rank}, local rank {self.local_rank}) finished collective "
            f"{self.stuck_seq} but never entered {self.waiting_seq}, which the other ranks have waited in "
            f"for {self.waited_s:.0f} s"
        )


def track_stopped(since: dict[int, float], stopped_now: set[int], now: float) -> dict[int, float]:
    """Local rank -> when it was first seen stopped, for the ranks stopped now (a rank that ran again is dropped)."""
    return {rank: since.get(rank, now) for rank in stopped_now}


def stopped_hangs(
    since: dict[int, float], now: float, threshold_s: float, *, node_rank: int, ranks_per_node: int
) -> list[Hang]:
    """Ranks seen stopped for ``threshold_s`` or longer, as hangs (``stuck_seq``/``waiting_seq`` unknown: 0)."""
    return [
        Hang(
            rank=node_rank * ranks_per_node + local,
            node_rank=node_rank,
            local_rank=local,
            stuck_seq=0,
            waiting_seq=0,
            waited_s=now - first,
            stopped=True,
        )
        for local, first in sorted(since.items())
        if now - first >= threshold_s
    ]


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
