"""The cluster's usable space for StatFs.

Asked of the storage nodes (ListTargets with the cluster token) and kept for a few seconds, so a burst of ``df`` calls
costs one round of calls, not one per statfs.
"""

from __future__ import annotations

import asyncio
import logging
import time

from ff_fsprotocol.routing import RoutingCache, RoutingView
from ff_meta.core.space import TargetSpace, UsableSpace, replicas_per_chain, usable_space
from ff_rpc import RpcError
from ff_rpc.client import ClientPool
from fireflyer.storage.v1 import storage_pb2 as spb
from fireflyer.storage.v1.storage_client import StorageServiceClient

logger = logging.getLogger(__name__)

# How long one answer serves StatFs calls (free space drifts with writes; df need not be exact).
SPACE_CACHE_S = 5.0
# A storage node that does not answer within this is left out of the sum (StatFs must not hang on it).
LIST_TARGETS_TIMEOUT_S = 2.0


class StorageSpace:
    """Sum of what the live storage nodes of the routing info report; None when none reports capacity."""

    def __init__(
        self,
        routing: RoutingCache,
        storage: ClientPool[StorageServiceClient],
        ttl_s: float = SPACE_CACHE_S,
    ) -> None:
        self._routing = routing
        self._storage = storage
        self._ttl_s = ttl_s
        self._lock = asyncio.Lock()
        self._value: UsableSpace | None = None
        self._at = -float("inf")

    async def get(self) -> UsableSpace | None:
        """The usable space, at most ``ttl_s`` old (None: no target reported)."""
        async with self._lock:  # callers arriving during a refresh share its answer
            if time.monotonic() - self._at >= self._ttl_s:
                self._value = await self._collect()
                self._at = time.monotonic()
            return self._value

    async def _collect(self) -> UsableSpace | None:
        try:
            view = await self._routing.get()
        except RpcError as err:
            logger.warning("no routing info for statfs: %s", err)
            return None
        addresses = _storage_addresses(view)
        answers = await asyncio.gather(*(self._list_targets(a) for a in addresses))
        reports = [t for targets in answers for t in targets]
        return usable_space(reports, replicas_per_chain(len(c.targets) for c in view.chains.values()))

    async def _list_targets(self, address: str) -> list[TargetSpace]:
        try:
            resp = await self._storage.get(address).list_targets(
                spb.ListTargetsRequest(), timeout_s=LIST_TARGETS_TIMEOUT_S
            )
        except RpcError as err:
            logger.warning("storage node %s left out of statfs: %s", address, err)
            return []
        return [TargetSpace(t.filesystem_id, t.capacity_bytes, t.free_bytes) for t in resp.targets]


def _storage_addresses(view: RoutingView) -> list[str]:
    """The gRPC addresses of the live nodes that hold a target of some chain."""
    node_ids = {t.node_id for c in view.chains.values() for t in c.targets}
    nodes = (view.node(n) for n in sorted(node_ids))
    return [n.grpc for n in nodes if n is not None and n.alive and n.grpc]
