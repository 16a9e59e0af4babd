"""A storage target's side of the 3FS state machine (pure): the local state it reports and what it may serve.

Both follow from its public state as mgmtd last published it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Public(enum.IntEnum):
    """Mirror of fireflyer.mgmtd.v1.PublicTargetState (0 = not in any chain yet)."""

    NONE = 0
    SERVING = 1
    SYNCING = 2
    WAITING = 3
    LASTSRV = 4
    OFFLINE = 5


class Local(enum.IntEnum):
    """Mirror of fireflyer.mgmtd.v1.LocalTargetState."""

    UPTODATE = 1
    ONLINE = 2
    OFFLINE = 3


@dataclass(kw_only=True)
class TargetRole:
    """The mutable state machine of one target on its node.

    ``restarting``: the target existed before this process started. As in 3FS a restarted target must go
    through recovery, so it reports offline until mgmtd has stopped routing to it (public state no longer
    serving or syncing); 3FS's service sends no heartbeat at all until then, reporting offline is the
    same signal with the lease kept.
    """

    restarting: bool = False
    admin_offline: bool = False
    sync_done_version: int = 0  # chain version at which the predecessor said sync-done
    public: Public = Public.NONE
    chain_version: int = 0

    def observe(self, public: Public, chain_version: int) -> None:
        """Note the public state from new routing info."""
        self.public, self.chain_version = public, chain_version
        if self.restarting and public not in (Public.SERVING, Public.SYNCING):
            self.restarting = False
        if public is not Public.SYNCING:
            self.sync_done_version = 0

    def report(self) -> Local:
        """The local state to report to mgmtd in the next heartbeat."""
        if self.admin_offline or self.restarting:
            return Local.OFFLINE
        if self.public in (Public.SERVING, Public.NONE):
            return Local.UPTODATE
        if self.public is Public.SYNCING and self.sync_done_version:
            return Local.UPTODATE
        return Local.ONLINE

    def needs_recovery(self) -> None:
        """Its data may be behind the chain: report offline until unrouted, then come back through syncing.

        A local write failed after the successor took the update, or the lease lapsed. Offline lasts until mgmtd
        stops routing to it; then it comes back through syncing, as after a restart. A target mgmtd routes nothing
        to already (lastsrv, waiting, offline) has nothing to wait for: no new routing would come to end the wait,
        and a lastsrv reporting offline for good holds its whole chain down (a lease lapsing twice in a row after
        mgmtd restarted left every chain of the node so).
        """
        if self.public in (Public.SERVING, Public.SYNCING):
            self.restarting = True

    def sync_done(self, chain_version: int) -> None:
        """Note that the predecessor finished syncing this target at ``chain_version``: report up to date."""
        self.sync_done_version = chain_version

    @property
    def down(self) -> bool:
        """Not serving anything: offline by admin, restarting, or publicly lastsrv/offline (possible partition)."""
        return self.admin_offline or self.restarting or self.public in (Public.LASTSRV, Public.OFFLINE)

    def may_read(self, lease_ok: bool) -> bool:
        """Serves reads: holds its mgmtd lease, is not down, and is publicly serving."""
        return lease_ok and not self.down and self.public is Public.SERVING

    def may_update(self, lease_ok: bool) -> bool:
        """Accepts chain updates: serving, or syncing (as full-chunk-replace)."""
        return lease_ok and not self.down and self.public in (Public.SERVING, Public.SYNCING)
