"""Lease arithmetic of mgmtd: node heartbeats and the election of one primary by a lease row in the database.

A node is declared dead after T without a heartbeat. The client side (T/2) is ff_cluster.lease.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


def lease_expired(last_renewal: float, now: float, duration_s: float) -> bool:
    """A lease renewed at ``last_renewal`` is over once more than ``duration_s`` has passed (not before).

    The same rule as ``ff_cluster.lease.lease_expired`` (the client's T/2), written here because importing
    ``ff_cluster`` runs its ``__init__``, which loads grpc: ``core/`` stays free of it.
    """
    return now - last_renewal > duration_s


@dataclass
class HeartbeatTracker:
    """The primary's view of node leases, on its own monotonic clock.

    A new primary does not know when nodes last heartbeated to its predecessor, so every known alive node
    starts with a full lease at takeover: nobody is declared dead for the change of primary.
    """

    duration_s: float
    _last_seen: dict[int, float] = field(default_factory=dict)

    def reset(self, alive_node_ids: Iterable[int], now: float) -> None:
        """Track exactly these nodes, each with a full lease from ``now`` (a takeover, or none when stepping down)."""
        self._last_seen = dict.fromkeys(alive_node_ids, now)

    def renew(self, node_id: int, now: float) -> None:
        """Note a heartbeat (or a registration) of ``node_id`` at ``now``; starts tracking an unknown node."""
        self._last_seen[node_id] = now

    def forget(self, node_id: int) -> None:
        """Stop tracking ``node_id`` (declared dead); a no-op for an unknown node."""
        self._last_seen.pop(node_id, None)

    def last_seen(self, node_id: int) -> float | None:
        """When ``node_id`` last renewed, on the tracker's monotonic clock; None when it is not tracked."""
        return self._last_seen.get(node_id)

    def expired(self, now: float) -> list[int]:
        """Nodes whose lease is over, oldest first. They stay tracked until ``forget``."""
        over = [(t, n) for n, t in self._last_seen.items() if lease_expired(t, now, self.duration_s)]
        return [n for _, n in sorted(over)]


@dataclass(frozen=True)
class LeaseRow:
    """The election row as stored: who holds primacy, until when (database clock), which epoch."""

    holder_id: str
    holder_address: str
    expires_at: float
    epoch: int


@dataclass(frozen=True)
class Campaign:
    """What an instance does at an election tick."""

    row: LeaseRow
    is_primary: bool
    changed: bool


def campaign(current: LeaseRow | None, me: str, my_address: str, now: float, lease_s: float) -> Campaign:
    """Renew the lease if we hold it, take it if it is free or expired, else stay standby.

    The epoch increases whenever the holder changes, so a deposed primary can be fenced off.
    """
    if current is not None and current.holder_id == me and current.expires_at > now:
        row = LeaseRow(me, my_address, now + lease_s, current.epoch)
        return Campaign(row, is_primary=True, changed=True)
    if current is None or current.expires_at <= now or not current.holder_id:
        epoch = (current.epoch if current else 0) + 1
        return Campaign(LeaseRow(me, my_address, now + lease_s, epoch), is_primary=True, changed=True)
    return Campaign(current, is_primary=False, changed=False)


def primary_address(row: LeaseRow | None, now: float) -> str:
    """Where the primary is, or "" while nobody holds an unexpired lease."""
    if row is None or row.expires_at <= now:
        return ""
    return row.holder_address
