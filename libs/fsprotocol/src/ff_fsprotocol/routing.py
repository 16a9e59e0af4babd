"""Routing as storage, meta and the client see it: chains, their targets and the nodes that serve them, from mgmtd.

mgmtd's ``RoutingInfo`` becomes domain types here (``Chain``, ``Target``, ``ChainTable``, ``NodeAddress``), once
per routing version; nothing past ``RoutingView`` sees protobuf.
"""

from __future__ import annotations

import asyncio
import enum
import time
from dataclasses import dataclass

from ff_cluster import MgmtdClient
from fireflyer.mgmtd.v1 import mgmtd_pb2 as mpb


class TargetState(enum.IntEnum):
    """A target's public state as mgmtd publishes it (the values of ``mgmtd.v1.PublicTargetState``)."""

    UNSPECIFIED = 0
    SERVING = 1
    SYNCING = 2
    WAITING = 3
    LASTSRV = 4
    OFFLINE = 5


SERVING = TargetState.SERVING
SYNCING = TargetState.SYNCING


@dataclass(frozen=True)
class NodeAddress:
    """Where a node is reached: its gRPC and data-path addresses, and whether it is alive and enabled."""

    node_id: int
    grpc: str
    data: str
    alive: bool


@dataclass(frozen=True)
class Target:
    """One replica of a chain: the target, the node that holds it and its public state."""

    target_id: int
    node_id: int
    public_state: TargetState


@dataclass(frozen=True)
class Chain:
    """A replication chain: its targets head first, tail last; ``version`` grows with every change."""

    chain_id: int
    version: int
    targets: tuple[Target, ...]


@dataclass(frozen=True)
class ChainTable:
    """An ordered list of chains; a file takes a range of it at create."""

    table_id: int
    version: int
    chain_ids: tuple[int, ...]


def _state(value: int) -> TargetState:
    try:
        return TargetState(value)
    except ValueError:  # a state this release does not know: it serves nothing
        return TargetState.UNSPECIFIED


class RoutingView:
    """An immutable snapshot of mgmtd's routing info with the lookups the data path needs."""

    def __init__(self, info: mpb.RoutingInfo) -> None:
        self.version = int(info.version)
        self.chains: dict[int, Chain] = {
            c.chain_id: Chain(
                c.chain_id, c.version, tuple(Target(t.target_id, t.node_id, _state(t.public_state)) for t in c.targets)
            )
            for c in info.chains
        }
        self.nodes: dict[int, NodeAddress] = {}
        for n in info.nodes:
            eps = {e.name: e.address for e in n.endpoints}
            self.nodes[n.node_id] = NodeAddress(
                n.node_id, eps.get("grpc", ""), eps.get("data", ""), n.status == mpb.NODE_STATUS_ALIVE and n.enabled
            )
        self.tables: dict[int, ChainTable] = {
            t.table_id: ChainTable(t.table_id, t.version, tuple(t.chain_ids)) for t in info.chain_tables
        }

    def chain(self, chain_id: int) -> Chain | None:
        """The chain ``chain_id``; None when the routing info has none such."""
        return self.chains.get(chain_id)

    def head(self, chain_id: int) -> Target | None:
        """Where writes go: the first target, if it serves."""
        chain = self.chains.get(chain_id)
        if chain is None or not chain.targets or chain.targets[0].public_state != SERVING:
            return None
        return chain.targets[0]

    def serving(self, chain_id: int) -> list[Target]:
        """The chain's targets that serve reads (public state SERVING), head to tail; none for an unknown chain."""
        chain = self.chains.get(chain_id)
        return [t for t in chain.targets if t.public_state == SERVING] if chain else []

    def node(self, node_id: int) -> NodeAddress | None:
        """The addresses of node ``node_id``; None when it is not registered."""
        return self.nodes.get(node_id)

    def table(self, table_id: int) -> ChainTable | None:
        """The chain table ``table_id``; None when the routing info has none such."""
        return self.tables.get(table_id)


class RoutingCache:
    """The latest routing info, refreshed on demand (cheap when unchanged) and at most every ``min_interval_s``."""

    def __init__(self, mgmtd: MgmtdClient, min_interval_s: float = 0.05) -> None:
        self._mgmtd = mgmtd
        self._view: RoutingView | None = None
        self._lock = asyncio.Lock()
        self._last_refresh = 0.0
        self._min_interval_s = min_interval_s

    @property
    def view(self) -> RoutingView | None:
        """The routing last fetched, without asking mgmtd; None before the first ``get``."""
        return self._view

    async def get(self) -> RoutingView:
        """The routing held, fetched first if none is yet."""
        if self._view is None:
            return await self.refresh(force=True)
        return self._view

    async def refresh(self, *, force: bool = False) -> RoutingView:
        """The latest routing from mgmtd, unless fetched less than ``min_interval_s`` ago (``force``: always ask).

        Cheap when nothing changed: mgmtd answers ``unchanged`` for the version held. Raises RpcError.
        """
        async with self._lock:
            now = time.monotonic()
            if self._view is not None and not force and now - self._last_refresh < self._min_interval_s:
                return self._view
            known = self._view.version if self._view is not None else 0
            resp = await self._mgmtd.mgmtd.get_routing_info(mpb.GetRoutingInfoRequest(known_version=known))
            self._last_refresh = time.monotonic()
            if not resp.unchanged:
                self._view = RoutingView(resp.routing_info)
            assert self._view is not None
            return self._view

    def update(self, info: mpb.RoutingInfo) -> RoutingView:
        """Adopt routing info pushed by a watch (only if newer)."""
        if self._view is None or info.version > self._view.version:
            self._view = RoutingView(info)
        return self._view
