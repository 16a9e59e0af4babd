"""The one exception hierarchy of hfreduce."""

from __future__ import annotations


class HFReduceError(RuntimeError):
    """Base class of every error hfreduce raises."""


class RendezvousError(HFReduceError):
    """The group could not be formed (a rank did not arrive in time, or the layout is inconsistent).

    Attributes:
        missing_ranks: global ranks that did not arrive, if known.
    """

    def __init__(self, message: str, *, missing_ranks: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.missing_ranks = missing_ranks


class PeerFailureError(HFReduceError):
    """A collective failed because another rank died, hung or misbehaved.

    Attributes:
        rank: global rank held responsible (the dead rank, or the one that never entered the collective).
        node_rank: that rank's node.
        local_rank: that rank's local rank.
        reason: short cause, e.g. ``"died"``, ``"did not enter collective 7"``.
    """

    def __init__(self, *, rank: int, node_rank: int, local_rank: int, reason: str, detail: str = "") -> None:
        message = f"rank {rank} (node {node_rank}, local rank {local_rank}) {reason}"
        if detail:
            message += f" [{detail}]"
        super().__init__(message)
        self.rank = rank
        self.node_rank = node_rank
        self.local_rank = local_rank
        self.reason = reason


class GroupClosedError(HFReduceError):
    """The group was destroyed or broken by an earlier failure; make a new group."""
