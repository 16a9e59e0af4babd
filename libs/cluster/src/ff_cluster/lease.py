"""Lease arithmetic shared by mgmtd and its clients (pure: no I/O, no clock of its own)."""

from __future__ import annotations

from dataclasses import dataclass


def lease_expired(last_renewal: float, now: float, duration_s: float) -> bool:
    """A lease renewed at ``last_renewal`` is over once more than ``duration_s`` has passed (not before)."""
    return now - last_renewal > duration_s


@dataclass
class LeaseWatch:
    """The client side of a lease: a node that has not reached mgmtd for T/2 must stop serving.

    mgmtd declares the node dead after T; stopping at T/2 leaves the other half for clocks and delays,
    so a partitioned node is never serving while mgmtd has already routed around it. Feed it every
    successful heartbeat; ``check`` says when contact is lost (once), ``acked`` when it is regained.
    """

    duration_s: float
    last_ack: float
    lost: bool = False

    @property
    def tolerance_s(self) -> float:
        """How long without a successful heartbeat before the node must stop serving: T/2, in seconds."""
        return self.duration_s / 2

    def acked(self, now: float) -> bool:
        """Record a successful heartbeat; True when this ends a lost period."""
        self.last_ack = now
        regained, self.lost = self.lost, False
        return regained

    def check(self, now: float) -> bool:
        """True exactly once, when contact has just been lost for more than T/2."""
        if not self.lost and lease_expired(self.last_ack, now, self.tolerance_s):
            self.lost = True
            return True
        return False
