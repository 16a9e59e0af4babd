"""The async driver of mgmtd: election, node liveness, the primary's caches, routing change notices.

Decisions live in ``core`` (lease arithmetic) and ``store`` (state changes, each one serializable
transaction fenced by the primary's lease); this class does the I/O and the timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TypeVar

from sqlalchemy.orm import Session

from ff_mgmtd.core.errors import NotFoundError, NotPrimary
from ff_mgmtd.core.lease import HeartbeatTracker
from ff_mgmtd.core.model import (
    Chain,
    LocalTargetState,
    MgmtdInstance,
    Node,
    NodeRegistration,
    NodeRemoval,
    NodeStatus,
    NodeType,
    RoutingInfo,
)
from ff_mgmtd.core.target_states import scan_chains
from ff_mgmtd.store import cluster_state, routing
from ff_mgmtd.store.cluster_state import Fence
from ff_store import Store

logger = logging.getLogger(__name__)

# A standby campaigns this long after the primary's lease should have expired (database clock).
ELECTION_MARGIN_S = 0.02

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class Timing:
    """mgmtd's periods in seconds: node lease (T), heartbeat, election lease and chain scan."""

    lease_duration_s: float
    heartbeat_interval_s: float
    election_lease_s: float
    chain_scan_interval_s: float = 0.5

    @property
    def election_tick_s(self) -> float:
        """How often an instance campaigns: four times per election lease, so the primary renews in time."""
        return self.election_lease_s / 4

    @property
    def liveness_tick_s(self) -> float:
        """How often the primary looks for expired node leases: T/20, at most every 0.5 s."""
        return min(self.lease_duration_s / 20, 0.5)


@dataclass(frozen=True)
class HeartbeatAnswer:
    """What a heartbeat learns: the current routing and config versions, and whether the node is enabled."""

    routing_version: int
    config_version: int
    enabled: bool


async def wait_notified(cond: asyncio.Condition, timeout_s: float) -> None:
    """``cond.wait()`` for at most ``timeout_s`` (the caller holds ``cond``'s lock; it holds it again on return).

    Not ``asyncio.wait_for(cond.wait(), ...)``: that runs the wait as a task of its own, and a cancel of the caller
    that lands while that task takes the lock back after its timeout leaves the lock to the orphaned task, which
    never releases it (every later ``async with cond`` then blocks: a primary whose watch stream was cancelled at
    that moment stopped publishing routing changes and answering heartbeats). The timeout here cancels the caller's
    own task, whose ``Condition.wait`` takes the lock back before any cancel goes on.
    """
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await cond.wait()


class Mgmtd:
    """One mgmtd instance: a standby, or the primary."""

    def __init__(
        self,
        store: Store,
        timing: Timing,
        *,
        instance_id: str,
        address: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.timing = timing
        self.instance_id = instance_id
        self.address = address
        self.cluster_id = ""
        self._clock = clock
        self._fence: Fence | None = None
        self._lease_deadline = 0.0
        self._primary_address = ""
        self._tracker = HeartbeatTracker(timing.lease_duration_s)
        self._nodes: dict[int, Node] = {}
        self._config_versions: dict[NodeType, int] = {}
        self._routing_version = 0
        self._snapshot: RoutingInfo | None = None
        self._changed = asyncio.Condition()
        # Local target states as the nodes last reported them (3FS keeps them in the manager's memory).
        self._local_states: dict[int, LocalTargetState] = {}
        # Which node holds each target (as of the last chain scan, which read the chains of routing version
        # _owners_version): a node reports only its own. A report of a target the last scan did not see waits in
        # _unverified for the next scan, which knows its holder: taken if the reporter holds it, else ignored.
        self._target_owner: dict[int, int] = {}
        self._owners_version = -1
        self._unverified: dict[int, tuple[int, LocalTargetState]] = {}
        self._scan_wanted = asyncio.Event()
        # What a chain scan reads besides the database: bumped whenever a reported local state changes or the
        # term changes. A scan whose inputs (this and the routing version) equal those of the last scan that
        # changed nothing would change nothing either, and reads nothing.
        self._scan_inputs = 0
        self._quiet_scan: tuple[int, int] | None = None
        # Serializes changes of node status (register, revive, declare dead) against lease renewals.
        self._node_lock = asyncio.Lock()
        # One database read refreshes the routing snapshot for every caller waiting on it.
        self._snapshot_lock = asyncio.Lock()

    # ---- primacy ----

    @property
    def is_primary(self) -> bool:
        """Whether this instance holds an unexpired election lease, on its own (conservative) clock."""
        return self._fence is not None and self._clock() < self._lease_deadline

    @property
    def primary_address(self) -> str:
        """Where the primary is as last seen: this instance's address while primary; "" when none is known."""
        return self.address if self.is_primary else self._primary_address

    @property
    def epoch(self) -> int:
        """The epoch of the lease this instance holds; 0 while it is not primary."""
        return self._fence.epoch if self._fence else 0

    def require_primary(self) -> Fence:
        """The fence of this instance's term, for a change or a read only the primary may make.

        Raises:
            NotPrimary: this instance is a standby (the error names the primary when it is known).
        """
        if self._fence is None or not self.is_primary:
            raise NotPrimary(self._primary_address if self._fence is None else "")
        return self._fence

    async def start(self) -> None:
        """Create the cluster's identity on first start (else read it), then campaign once."""
        self.cluster_id = await self.store.arun(lambda s: cluster_state.ensure_cluster(s, time.time()))
        await self._election_tick()

    async def run(self, stop: asyncio.Event) -> None:
        """The background loops, until ``stop``; then resign primacy so a standby takes over at once."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._election_loop(stop))
            tg.create_task(self._every(self.timing.liveness_tick_s, self._liveness_tick, stop))
            tg.create_task(self._scan_loop(stop))
        await self._resign()

    async def _every(self, period_s: float, tick: Callable[[], object], stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await tick()  # type: ignore[misc]
            except Exception:
                logger.exception("background tick failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=period_s)

    async def _election_loop(self, stop: asyncio.Event) -> None:
        """Campaign every tick; a standby also wakes just after the primary's lease would expire.

        So a dead primary is replaced within one lease of its last renewal.
        """
        while not stop.is_set():
            delay_s = self.timing.election_tick_s
            try:
                delay_s = min(delay_s, await self._election_tick())
            except Exception:
                logger.exception("election tick failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay_s)

    async def _election_tick(self) -> float:
        """One campaign. Returns how long until the current holder's lease expires (standbys)."""
        started = self._clock()
        try:
            result, db_now = await self.store.arun(
                lambda s: cluster_state.run_campaign(s, self.instance_id, self.address, self.timing.election_lease_s)
            )
        except Exception:
            if self._fence is not None and self._clock() >= self._lease_deadline:
                self._step_down("cannot renew the lease")
            raise
        if not result.is_primary:
            self._primary_address = result.row.holder_address
            if self._fence is not None:
                self._step_down(f"lease held by {result.row.holder_id}")
            return max(0.0, result.row.expires_at - db_now) + ELECTION_MARGIN_S
        # The lease runs from before the transaction began, on our own clock: conservative.
        self._lease_deadline = started + self.timing.election_lease_s
        self._primary_address = self.address
        if self._fence is None or self._fence.epoch != result.row.epoch:
            await self._take_over(Fence(self.instance_id, result.row.epoch))
        return self.timing.election_tick_s

    async def _take_over(self, fence: Fence) -> None:
        def load(s: Session) -> tuple[list[Node], dict[NodeType, int], int]:
            return routing.list_nodes(s), routing.config_versions(s), cluster_state.routing_version(s)

        # Serve nothing from the old term's caches while the new term's state loads.
        self._fence = None
        nodes, config_versions, version = await self.store.arun(load, read_only=True)
        now = self._clock()
        self._nodes = {n.node_id: n for n in nodes}
        self._tracker.reset([n.node_id for n in nodes if n.status is NodeStatus.ALIVE], now)
        self._config_versions = config_versions
        self._snapshot = None
        self._local_states = {}
        self._scan_inputs += 1
        self._fence = fence
        await self._publish(version)
        logger.info("became primary", extra={"epoch": fence.epoch, "num_nodes": len(nodes)})

    def _step_down(self, why: str) -> None:
        logger.warning("no longer primary: %s", why)
        self._fence = None
        self._lease_deadline = 0.0
        self._snapshot = None
        self._tracker.reset([], self._clock())

    async def _resign(self) -> None:
        if self._fence is None:
            return
        fence, self._fence = self._fence, None
        try:
            await self.store.arun(lambda s: cluster_state.resign(s, fence))
        except Exception:
            logger.exception("could not resign the lease; it will expire")

    async def read(self, fn: Callable[[Session], T]) -> T:
        """Read state as the primary (read-only transaction: on SQLite it takes no write lock)."""
        self.require_primary()
        return await self.store.arun(fn, read_only=True)

    async def write(self, fn: Callable[[Session, Fence], T]) -> T:
        """Run a state change as the primary, fenced by our lease epoch in the same transaction."""
        fence = self.require_primary()
        try:
            return await self.store.arun(lambda s: fn(s, fence))
        except NotPrimary:
            self._step_down("fenced off by a newer primary")
            raise

    # ---- liveness ----

    async def _liveness_tick(self) -> None:
        if not self.is_primary or not self._tracker.expired(self._clock()):
            return
        async with self._node_lock:
            await self._declare_dead()

    async def _declare_dead(self) -> None:
        expired = self._tracker.expired(self._clock())
        if not expired:
            return
        await self._mark_dead(expired)
        logger.warning(
            "nodes declared dead (no heartbeat for %.1fs)", self.timing.lease_duration_s, extra={"node_ids": expired}
        )

    async def _mark_dead(self, node_ids: list[int]) -> None:
        """Store and publish ``node_ids`` dead (their targets offline at the next scan, which runs at once).

        Call with ``_node_lock`` held.
        """
        version = await self.write(lambda s, f: routing.mark_dead(s, f, node_ids))
        for node_id in node_ids:
            self._tracker.forget(node_id)
            if node_id in self._nodes:
                self._nodes[node_id] = _with_status(self._nodes[node_id], NodeStatus.DEAD)
        if version is not None:
            await self._publish(version)
        self._scan_wanted.set()

    async def register_node(self, reg: NodeRegistration) -> Node:
        """Register (or register again) a node as alive with a full lease, and publish the new routing version.

        Raises:
            NotPrimary: this instance is a standby.
            Conflict: the node id is registered with another node type, or its node was removed.
            NoFreeId: ``reg.node_id`` is 0 and every id is taken.
        """
        async with self._node_lock:
            node, version = await self.write(lambda s, f: routing.register_node(s, f, reg, time.time()))
            self._nodes[node.node_id] = node
            self._tracker.renew(node.node_id, self._clock())
        await self._publish(version)
        logger.info("node registered", extra={"node_id": node.node_id, "node_type": node.node_type.name})
        return node

    async def remove_node(self, node_id: int) -> NodeRemoval:
        """Admin: forget a dead, disabled node that holds no chain target (``store.routing.remove_node``).

        It leaves the store, the primary's caches (node, lease, its targets' reported states) and, by the new
        routing version, every watcher's view. Serialized with registrations and heartbeats, so a node cannot
        come back to life between the check and the removal.

        Raises:
            NotPrimary: this instance is a standby.
            NotFoundError: the node never registered.
            Conflict: the node may not be removed yet (the message says why); nothing changed.
        """
        async with self._node_lock:
            removal = await self.write(
                lambda s, f: routing.remove_node(s, f, node_id, time.time(), self.timing.lease_duration_s)
            )
            if removal.already_removed:
                return removal
            self._nodes.pop(node_id, None)
            self._tracker.forget(node_id)
            for target_id in [t for t, owner in self._target_owner.items() if owner == node_id]:
                del self._target_owner[target_id]
                self._local_states.pop(target_id, None)
        await self._publish(removal.routing_version)
        logger.info("node removed", extra={"node_id": node_id})
        return removal

    async def heartbeat(
        self, node_id: int, target_states: dict[int, LocalTargetState] | None = None, *, leaving: bool = False
    ) -> HeartbeatAnswer:
        """Renew a lease and note the node's local target states (the chain scan acts on changes).

        The steady state touches no database: the primary keeps leases and local states in memory. ``leaving``:
        the node is stopping cleanly; it is declared dead at once, as when its lease runs out (its reports are
        not taken).
        """
        self.require_primary()
        async with self._node_lock:
            known = self._nodes.get(node_id)
            if known is None:
                raise NotFoundError(f"node {node_id} is not registered")
            node = known
            if leaving:
                if node.status is not NodeStatus.DEAD:
                    await self._mark_dead([node_id])
                    logger.info("node stopped: declared dead at once", extra={"node_id": node_id})
                config_version = self._config_versions.get(node.node_type, 0)
                return HeartbeatAnswer(self._routing_version, config_version, node.enabled)
            if node.status is NodeStatus.DEAD:
                node, version = await self.write(lambda s, f: routing.revive(s, f, node_id))
                self._nodes[node_id] = node
                await self._publish(version)
                logger.info("dead node is back", extra={"node_id": node_id})
            self._tracker.renew(node_id, self._clock())
        for target_id, state in (target_states or {}).items():
            owner = self._target_owner.get(target_id)
            if owner is None:
                # In no chain as of the current routing: nothing to act on. Otherwise the chains changed since the
                # last scan (or none ran yet on this primary): the next scan, which knows the holder, decides.
                if self._owners_version != self._routing_version and self._unverified.get(target_id) != (
                    node_id,
                    state,
                ):
                    self._unverified[target_id] = (node_id, state)
                    self._scan_inputs += 1
                    self._scan_wanted.set()
                continue
            if owner != node_id:
                logger.warning("node %d reported target %d of node %d; ignored", node_id, target_id, owner)
                continue
            if self._local_states.get(target_id) is not state:
                self._local_states[target_id] = state
                self._scan_inputs += 1
                self._scan_wanted.set()
        return HeartbeatAnswer(self._routing_version, self._config_versions.get(node.node_type, 0), node.enabled)

    # ---- chain scan (3FS target states) ----

    async def _scan_loop(self, stop: asyncio.Event) -> None:
        """Scan chains every ``chain_scan_interval_s``, and at once when a state was reported or a node died."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._scan_wanted.wait(), timeout=self.timing.chain_scan_interval_s)
            self._scan_wanted.clear()
            try:
                await self.chain_scan()
            except Exception:
                logger.exception("chain scan failed")
                await asyncio.sleep(self.timing.chain_scan_interval_s)

    def _effective_local_states(self, chains: list[Chain]) -> dict[int, LocalTargetState]:
        """Reported states, except that every target of a dead (or unknown) node is offline."""
        states: dict[int, LocalTargetState] = {}
        for chain in chains:
            for t in chain.targets:
                node = self._nodes.get(t.node_id)
                if node is None or node.status is NodeStatus.DEAD:
                    states[t.target_id] = LocalTargetState.OFFLINE
                elif t.target_id in self._local_states:
                    states[t.target_id] = self._local_states[t.target_id]
        return states

    async def chain_scan(self) -> int | None:
        """Apply the public-state transition table to every chain; store and publish what changed."""
        if not self.is_primary:
            return None
        inputs = (self._routing_version, self._scan_inputs)  # (taken before reading: a change meanwhile rescans)
        if inputs == self._quiet_scan:
            return None
        unverified, self._unverified = self._unverified, {}
        chains = await self.store.arun(routing.list_chains, read_only=True)
        self._target_owner = {t.target_id: t.node_id for c in chains for t in c.targets}
        self._owners_version = inputs[0]
        for target_id, (node_id, state) in unverified.items():
            owner = self._target_owner.get(target_id)
            if owner == node_id:
                self._local_states[target_id] = state
            elif owner is not None:
                logger.warning("node %d reported target %d of node %d; ignored", node_id, target_id, owner)
        by_id = {c.chain_id: c for c in chains}
        changed = scan_chains(chains, self._effective_local_states(chains))
        if not changed:
            self._quiet_scan = inputs
            return None
        changes = [(by_id[c.chain_id].version, c) for c in changed]
        version = await self.write(lambda s, f: routing.apply_chain_scan(s, f, changes))
        if version is not None:
            for c in changed:
                states = ", ".join(
                    f"{t.target_id}:{t.public_state.name.lower()}/{t.local_state.name.lower()}" for t in c.targets
                )
                logger.info("chain %d v%d: %s", c.chain_id, c.version, states)
            await self._publish(version)
        return version

    async def offline_target(self, target_id: int) -> tuple[Chain, int]:
        """Admin: the target is locally offline until its node reports it again; scanned at once."""
        self.require_primary()
        await self.store.arun(lambda s: routing.find_target_chain(s, target_id))
        self._local_states[target_id] = LocalTargetState.OFFLINE
        await self.chain_scan()
        chain = await self.store.arun(lambda s: routing.find_target_chain(s, target_id))
        return chain, self._routing_version

    def last_heartbeat_wall(self, node_id: int) -> float:
        """When ``node_id`` last heartbeated to this primary, in epoch seconds; 0 when it is not tracked."""
        seen = self._tracker.last_seen(node_id)
        return 0.0 if seen is None else time.time() - (self._clock() - seen)

    def config_version(self, node_type: NodeType) -> int:
        """The current config version of ``node_type`` as the primary caches it; 0: none stored."""
        return self._config_versions.get(node_type, 0)

    def note_config_version(self, node_type: NodeType, version: int) -> None:
        """Cache a config version just stored, so heartbeats announce it."""
        self._config_versions[node_type] = version

    async def note_node(self, node: Node, version: int) -> None:
        """Cache a node just changed in the store (enabled, tags) and publish the routing version it made."""
        self._nodes[node.node_id] = node
        await self._publish(version)

    # ---- routing ----

    @property
    def routing_version(self) -> int:
        """The newest routing version this instance has published."""
        return self._routing_version

    async def routing_info(self) -> RoutingInfo:
        """The current routing info, from a snapshot shared by every caller until the version changes.

        Raises:
            NotPrimary: this instance is a standby.
        """
        self.require_primary()
        snapshot = self._snapshot
        if snapshot is not None and snapshot.version == self._routing_version:
            return snapshot
        async with self._snapshot_lock:
            snapshot = self._snapshot
            if snapshot is not None and snapshot.version == self._routing_version:
                return snapshot  # another caller refreshed it while we waited
            snapshot = await self.store.arun(lambda s: routing.routing_info(s, time.time()), read_only=True)
            if self.is_primary:
                # A write may have committed and not yet published its version: the database is ahead.
                await self._publish(snapshot.version)
                self._snapshot = snapshot
        return snapshot

    async def publish(self, version: int) -> None:
        """Announce routing version ``version`` (after a write committed it): wakes every ``watch``."""
        await self._publish(version)

    async def _publish(self, version: int) -> None:
        async with self._changed:
            self._routing_version = max(self._routing_version, version)
            self._changed.notify_all()

    async def watch(self, known_version: int, stopping: asyncio.Event) -> AsyncIterator[RoutingInfo]:
        """Routing info now if newer than ``known_version``, then at every change, while primary.

        Ends with NotPrimary (UNAVAILABLE) when this instance stops or steps down, so the watcher
        reconnects to the primary instead of taking the end for "no more changes".
        """
        while not stopping.is_set():
            info = await self.routing_info()
            if info.version != known_version:
                known_version = info.version
                yield info
            async with self._changed:
                if self._routing_version == known_version:
                    await wait_notified(self._changed, self.timing.election_tick_s)
        raise NotPrimary("")

    async def instances(self) -> list[MgmtdInstance]:
        """Every mgmtd instance the election table knows, primary or standby (any instance may answer)."""
        return await self.store.arun(cluster_state.list_instances, read_only=True)

    async def lookup_primary(self) -> tuple[str, str]:
        """The primary's instance id and address; both "" while no instance holds an unexpired lease."""
        if self.is_primary:
            return self.instance_id, self.address
        row, address = await self.store.arun(cluster_state.current_primary, read_only=True)
        self._primary_address = address
        return (row.holder_id if row is not None and address else ""), address


def _with_status(node: Node, status: NodeStatus) -> Node:
    from dataclasses import replace

    return replace(node, status=status)
