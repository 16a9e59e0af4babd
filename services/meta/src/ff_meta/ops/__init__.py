"""Meta's operators, between the servicer and the store.

Each call's flow (checks, transactions, storage calls around them) over domain types. ``MetaOps`` puts them together.
"""

from __future__ import annotations

from dataclasses import dataclass

from ff_cluster import MgmtdClient
from ff_fsprotocol.capability import capability_key
from ff_fsprotocol.routing import RoutingCache
from ff_meta.ops.admin import QuotaOps, TrashOps
from ff_meta.ops.background import Background
from ff_meta.ops.files import FileOps
from ff_meta.ops.namespace import NamespaceOps
from ff_meta.ops.shared import IdAllocator, MetaOptions, Shared
from ff_meta.store.chunks import StorageChunks
from ff_meta.store.metastore import MetaStore
from ff_meta.store.storage_space import StorageSpace
from ff_rpc import RpcClient
from ff_rpc.client import NO_RETRY, ClientPool
from fireflyer.storage.v1.storage_client import StorageServiceClient

__all__ = ["MetaOps", "MetaOptions"]


@dataclass
class MetaOps:
    """Every operator of one meta instance, sharing one store, routing cache and storage stubs."""

    namespace: NamespaceOps
    files: FileOps
    quotas: QuotaOps
    trash: TrashOps
    background: Background
    shared: Shared
    _storage: ClientPool[StorageServiceClient]

    @classmethod
    def build(cls, store: MetaStore, mgmtd: MgmtdClient, options: MetaOptions) -> MetaOps:
        """The operators over ``store``, with storage reached through the routing ``mgmtd`` publishes."""
        routing = RoutingCache(mgmtd)
        rpc = RpcClient(token=options.cluster_token, timeout_s=options.storage_timeout_s, retry=NO_RETRY)
        storage = ClientPool(StorageServiceClient, rpc)
        shared = Shared(
            store=store,
            chunks=StorageChunks(routing, storage),
            space=StorageSpace(routing, storage),
            routing=routing,
            ids=IdAllocator(store),
            options=options,
            capability_key=capability_key(options.cluster_token),
        )
        trash, files = TrashOps(shared), FileOps(shared)
        return cls(
            namespace=NamespaceOps(shared),
            files=files,
            quotas=QuotaOps(shared),
            trash=trash,
            background=Background(shared, trash, files),
            shared=shared,
            _storage=storage,
        )

    async def close(self) -> None:
        """Close the storage channels (the store is its opener's to close)."""
        await self._storage.close()
