"""Routing as a storage client sees it: chains, their targets and the nodes that serve them, from mgmtd."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from ff_cluster import MgmtdClient
from fireflyer.mgmtd.v1 import mgmtd_pb2 as mpb

SERVING = mpb.PUBLIC_TARGET_STATE_SERVING
SYNCING = mpb.PUBLIC_TARGET_STATE_SYNCING


@dataclass(frozen=True)
class NodeAddress:
    """Where a node is reached: its gRPC and data-path addresses, and whether it is alive and enabled."""

    node_id: int
    grpc: str
    data: str
    alive: bool


class RoutingView:
    """An immutable snapshot of mgmtd's routing info with the lookups the data path needs."""

    def __init__(self, info: mpb.RoutingInfo) -> None:
        self.info = info
        self.version = info.version
        self.chains = {c.chain_id: c for c in info.chains}
        self.nodes: dict[int, NodeAddress] = {}
        for n in info.nodes:
            eps = {e.name: e.address for e in n.endpoints}
            self.nodes[n.node_id] = NodeAddress(
                n.node_id, eps.get("grpc", ""), eps.get("data", ""), n.status == mpb.NODE_STATUS_ALIVE and n.enabled
            )
        self.tables = {t.table_id: t for t in info.chain_tables}

    def chain(self, chain_id: int) -> mpb.Chain | None:
        """The chain ``chain_id``; None when the routing info has none such."""
        return self.chains.get(chain_id)

    def head(self, chain_id: int) -> mpb.Target | None:
        """Where writes go: the first target, if it serves."""
        chain = self.chains.get(chain_id)
        if chain is None or not chain.targets or chain.targets[0].public_state != SERVING:
            return None
        return chain.targets[0]

    def serving(self, chain_id: int) -> list[mpb.Target]:
        """The chain's targets that serve reads (public state SERVING), head to tail; none for an unknown chain."""
        chain = self.chains.get(chain_id)
        return [t for t in chain.targets if t.public_state == SERVING] if chain else []

    def node(self, node_id: int) -> NodeAddress | None:
        """The addresses of node ``node_id``; None when it is not registered."""
        return self.nodes.get(node_id)


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
            resp = await self._mgmtd.mgmtd(lambda s: s.GetRoutingInfo, mpb.GetRoutingInfoRequest(known_version=known))
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
