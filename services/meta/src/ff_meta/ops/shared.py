"""What every operator uses.

The store, storage's chunks and space, the routing (chain tables), inode ids, the options, capabilities.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from ff_fsprotocol.capability import CapLayout, make_capability
from ff_fsprotocol.routing import RoutingCache
from ff_meta.core.errors import FsCode, fs_error
from ff_meta.core.model import NO_LIMIT, Defaults, Inode, LayoutSpec
from ff_meta.core.perms import Caller
from ff_meta.ops.types import Capability
from ff_meta.store.chunks import StorageChunks
from ff_meta.store.fsops import namespace
from ff_meta.store.listing import ListingCache
from ff_meta.store.metastore import MetaStore
from ff_meta.store.read_cache import ReadCache
from ff_meta.store.storage_space import StorageSpace
from ff_rpc import RpcError

ID_BLOCK = 256
# Meta's own calls (background work, id blocks): root, as the cluster token is.
SYSTEM = Caller(0, (0,), "meta", is_root=True)


@dataclass(frozen=True, kw_only=True)
class MetaOptions:
    """The service settings the operators use."""

    cluster_token: str
    default_chain_table_id: int = 1
    default_chunk_size: int = 4 * 1024 * 1024
    default_stripe_size: int = 16
    lease_s: float = 30.0
    capability_ttl_s: float = 24 * 3600.0  # a read-only IoCapability
    writable_capability_ttl_s: float = 300.0  # a writable one; GC waits twice that (``Background.run_gc``)
    trash_retention_s: float = 3 * 24 * 3600.0
    capacity_bytes: int = 1 << 40  # StatFs's figure only while no storage target reports its disk
    background_interval_s: float = 1.0
    storage_timeout_s: float = 10.0


class IdAllocator:
    """Inode ids in blocks from the counter row (a block per instance, so creates do not contend on it)."""

    def __init__(self, store: MetaStore) -> None:
        self._store = store
        self._lock = asyncio.Lock()
        self._next = 0
        self._end = 0

    def _take_now(self, count: int) -> list[int] | None:
        if self._end - self._next < count:
            return None
        first = self._next
        self._next += count
        return list(range(first, first + count))

    async def take(self, count: int = 1) -> list[int]:
        """``count`` consecutive new inode ids (a new block from the store when this one is used up)."""
        ready = self._take_now(count)
        if ready is not None:
            return ready
        async with self._lock:
            if self._end - self._next < count:
                n = max(ID_BLOCK, count)
                self._next = await self._store.write(SYSTEM, lambda t: namespace.allocate_ids(t, n))
                self._end = self._next + n
            ids = self._take_now(count)
            assert ids is not None  # the block was just refilled; the lock kept other refills out
            return ids


@dataclass
class Shared:
    """The collaborators and settings every operator is given."""

    store: MetaStore
    chunks: StorageChunks
    space: StorageSpace
    routing: RoutingCache
    ids: IdAllocator
    options: MetaOptions
    capability_key: bytes
    listings: ListingCache = field(default_factory=ListingCache)  # names-only listing pages, by directory version
    reads: ReadCache = field(default_factory=ReadCache)  # Stat and List answers while the database has no new commit
    _defaults: tuple[object, Defaults] | None = field(default=None, init=False, repr=False)  # of which routing view

    async def defaults(self) -> Defaults:
        """The layout new files get by default and the chain tables that exist now (ENOSPC without mgmtd).

        Made once per routing view (every Create asks).
        """
        try:
            view = await self.routing.get()
        except RpcError as err:
            raise fs_error(FsCode.NO_SPACE, f"cannot reach mgmtd for the chain tables: {err}") from None
        if self.options.default_chain_table_id not in view.tables:
            view = await self.routing.refresh()
        known = self._defaults
        if known is not None and known[0] is view:
            return known[1]
        tables = {t.table_id: (t.version, len(t.chain_ids)) for t in view.tables.values() if t.chain_ids}
        layout = LayoutSpec(
            self.options.default_chain_table_id, self.options.default_chunk_size, self.options.default_stripe_size
        )
        made = Defaults(layout, tables, self.options.lease_s)
        self._defaults = (view, made)
        return made

    async def check_table(self, layout: LayoutSpec | None) -> None:
        """A layout naming a chain table that does not exist is a bad argument (not ENOSPC at the next create)."""
        if layout is None or not layout.chain_table_id:
            return
        tables = (await self.defaults()).tables
        if layout.chain_table_id not in tables:
            raise fs_error(
                FsCode.INVALID_ARGUMENT,
                f"chain table {layout.chain_table_id} does not exist; chain tables: {sorted(tables)}",
            )

    def capability(self, inode: Inode, writable: bool, write_limit: int = NO_LIMIT) -> Capability:
        """A fresh IoCapability for the file, bound to its layout (storage refuses its chunks anywhere else).

        A writable one lets the client write the file's bytes below ``write_limit`` (its session's, the quota
        reserved; ReserveSpace hands out a new one with the new limit).

        A writable one lives ``writable_capability_ttl_s`` (clients open the file again for a new one before it
        expires, naming their write session): the chunks of a removed file are removed once none can be left.
        """
        ttl_s = self.options.writable_capability_ttl_s if writable else self.options.capability_ttl_s
        expires = time.time_ns() + int(ttl_s * 1e9)
        layout = CapLayout(
            inode.chain_table_id, inode.chunk_size, inode.stripe_size, inode.chain_begin, inode.shuffle_seed
        )
        token = make_capability(self.capability_key, inode.inode_id, writable, expires, layout, write_limit)
        return Capability(token, inode.inode_id, writable, expires)

    def lease_expiry(self) -> float:
        """When a write session opened or renewed now lapses (seconds since the epoch)."""
        return time.time() + self.options.lease_s
