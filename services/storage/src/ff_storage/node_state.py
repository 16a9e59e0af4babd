"""The storage node's state: its targets, the routing it follows, per-chunk locks, background tasks.

The collaborators that act on it live beside it, each given this state: ``peers`` (calls to the other storage
nodes, the forward wire), ``writes`` (the CRAQ update pipeline, head and replicas), ``reads`` (chunk reads onto
the data path), ``recovery`` (sync of a returning target, repair of a damaged chunk); ``node.StorageNode`` puts
them together.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ff_fsprotocol.routing import Chain, RoutingView
from ff_fsprotocol.routing import Target as RoutingTarget
from ff_storage.core.chunks import ChunkKey, ChunkMeta, UpdateKey, UpdateRecord
from ff_storage.core.errors import InvalidRequest, TargetExists, TargetNotFound, TooCostly
from ff_storage.core.requests import Payload, UpdateKind
from ff_storage.core.results import IoStatus, UpdateResult
from ff_storage.core.target_role import Public, TargetRole
from ff_storage.dataserver import TransferBoxes
from ff_storage.io_stats import TargetIoStats
from ff_storage.store.chunk_engine import ChunkEngine, Pending
from ff_storage.store.targets import TargetRecord, load_targets, save_targets

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class NodeConfig:
    """What the node's paths need of the settings (from ``StorageSettings``); sizes in bytes, times in seconds."""

    node_id: int
    disks: list[Path]
    targets_file: Path
    cluster_token: str
    max_io_bytes: int
    max_batch_bytes: int
    forward_timeout_s: float
    data_wait_s: float
    fsync: bool
    update_ids: bool = True  # off only for the test that shows what goes wrong without them
    update_id_ttl_s: float = 120.0
    max_update_ids_per_chunk: int = 1024
    max_batch_ios: int = 4096
    max_read_batch_bytes: int = 256 * 1024 * 1024
    max_inline_read_bytes: int = 32 * 1024 * 1024  # the answer must fit gRPC's 64 MiB message cap


@dataclass
class Target:
    """One target on this node: its stored record, its chunk engine, and its role in the 3FS state machine."""

    record: TargetRecord
    engine: ChunkEngine
    role: TargetRole

    @property
    def target_id(self) -> int:
        """The target's id (mgmtd's)."""
        return self.record.target_id


@dataclass
class Update:
    """One chain update being applied at one target."""

    key: ChunkKey
    kind: UpdateKind
    chunk_size: int
    offset: int = 0
    data: Payload = b""
    data_checksum: int | None = None  # CRC of ``data``, verified on arrival (a 4 MiB CRC costs ~0.4 ms)
    length: int = 0
    full: bool = False
    version: int = 0
    chain_version: int = 0
    content: Payload | None = None
    content_checksum: int | None = None  # CRC of ``content`` (None: a remove)
    pending: Pending | None = None
    forwarded: bool = False  # the successor acknowledged it
    update_id: UpdateKey | None = None
    records: list[UpdateRecord] | None = None  # a full replace or a merged run's span: the chunk's records after it
    corrupt: bool = False  # the base copy here does not match its checksum (the update was not prepared)
    no_forward: bool = False  # stored here only, not passed on (a repair's copy for this one replica)
    at_head: bool = False  # versioned here as the chain's head: forwarded only while this target still is
    # at the head, a run of writes to this chunk in one batch that this update applies as one version (a full-chunk
    # replace): the writes still to apply (a retried one answered already), each given this update's result
    members: list[Update] | None = None
    result: UpdateResult = field(default_factory=UpdateResult)


class ChunkLocks:
    """Per-chunk locks (3FS's lock manager): writes to a chunk are serialized at every replica."""

    def __init__(self) -> None:
        self._locks: dict[tuple[int, ChunkKey], asyncio.Lock] = {}
        self._users: dict[tuple[int, ChunkKey], int] = defaultdict(int)

    async def acquire(self, target_id: int, keys: list[ChunkKey]) -> Callable[[], None]:
        """Take the chunks' locks in key order (so two callers never wait on each other); returns their release.

        A caller cancelled while waiting holds nothing.
        """
        ids = [(target_id, k) for k in sorted(set(keys))]
        for i in ids:
            self._users[i] += 1
        acquired: list[asyncio.Lock] = []

        def release() -> None:
            for lock in acquired:
                lock.release()
            for i in ids:
                self._users[i] -= 1
                if not self._users[i]:
                    del self._users[i]
                    self._locks.pop(i, None)

        try:
            for i in ids:
                lock = self._locks.setdefault(i, asyncio.Lock())
                await lock.acquire()
                acquired.append(lock)
        except BaseException:
            release()
            raise
        return release

    def keys_in_use(self, target_id: int, inode_id: int, begin: int, end: int) -> list[ChunkKey]:
        """The chunks of ``inode_id`` in [begin, end) (end 0: unbounded) whose locks are held or waited for now."""
        return [
            key
            for t, key in self._users
            if t == target_id and key[0] == inode_id and key[1] >= begin and (not end or key[1] < end)
        ]

    @contextlib.asynccontextmanager
    async def hold(self, target_id: int, keys: list[ChunkKey]) -> AsyncIterator[None]:
        """``acquire`` as a context manager: the chunks' locks are held inside it."""
        release = await self.acquire(target_id, keys)
        try:
            yield
        finally:
            release()


class NodeState:
    """State and routing shared by the write, read and recovery paths (see the module doc)."""

    def __init__(self, config: NodeConfig, boxes: TransferBoxes) -> None:
        self.config = config
        self.node_id = config.node_id
        self.boxes = boxes
        self.targets: dict[int, Target] = {}
        self.view: RoutingView | None = None
        self.lease_ok = True
        self.locks = ChunkLocks()
        self._background: set[asyncio.Task[None]] = set()
        self._updates: set[asyncio.Task[None]] = set()  # chain updates (``update_to_the_end``)
        self.routing_changed = asyncio.Event()
        self.io_stats = TargetIoStats()  # bytes and latencies per target, for telemetry

    def check_count(self, what: str, count: int) -> None:
        """A call's number of IOs (updates, queries, chunk ids) against ``max_batch_ios``, before any work."""
        if count > self.config.max_batch_ios:
            raise TooCostly(f"{count} {what} in one call: the limit is {self.config.max_batch_ios}")

    # ---- targets ----

    def open_targets(self) -> None:
        """Open the targets the targets file lists; each reports offline until it comes back through recovery."""
        for record in load_targets(self.config.targets_file):
            engine = self._engine(Path(record.path))
            engine.open()
            self.targets[record.target_id] = Target(record, engine, TargetRole(restarting=True))
        logger.info("opened %d target(s)", len(self.targets))

    def _engine(self, path: Path) -> ChunkEngine:
        c = self.config
        return ChunkEngine(
            path, fsync=c.fsync, update_id_ttl_s=c.update_id_ttl_s, max_update_ids_per_chunk=c.max_update_ids_per_chunk
        )

    def close(self) -> None:
        """Close every target's chunk engine (after ``finish_updates``)."""
        for t in self.targets.values():
            t.engine.close()

    def create_target(self, target_id: int, chain_id: int, disk_index: int) -> Target:
        """Create a target of ``chain_id`` on disk ``disk_index`` and record it (idempotent for the same request).

        Raises:
            InvalidRequest: an id is not positive or the disk does not exist.
            TargetExists: the target exists with another chain or disk, or this node holds the chain already.
        """
        if target_id <= 0 or chain_id <= 0:
            raise InvalidRequest("target_id and chain_id must be positive")
        if not 0 <= disk_index < len(self.config.disks):
            raise InvalidRequest(f"disk_index {disk_index}: this node has {len(self.config.disks)} disk(s)")
        existing = self.targets.get(target_id)
        if existing is not None:
            r = existing.record
            if (r.chain_id, r.disk_index) != (chain_id, disk_index):
                raise TargetExists(f"target {target_id} exists for chain {r.chain_id} on disk {r.disk_index}")
            return existing
        if any(t.record.chain_id == chain_id for t in self.targets.values()):
            raise TargetExists(f"this node already holds a target of chain {chain_id}")
        path = self.config.disks[disk_index] / f"target-{target_id}"
        record = TargetRecord(target_id=target_id, chain_id=chain_id, disk_index=disk_index, path=str(path))
        engine = self._engine(path)
        engine.open()
        save_targets(self.config.targets_file, [*(t.record for t in self.targets.values()), record])
        target = Target(record, engine, TargetRole())
        self.targets[target_id] = target
        self._observe_one(target)
        logger.info("created target %d of chain %d at %s", target_id, chain_id, path)
        return target

    def get_target(self, target_id: int) -> Target:
        """The target ``target_id``; TargetNotFound when this node does not hold it."""
        target = self.targets.get(target_id)
        if target is None:
            raise TargetNotFound(f"target {target_id} is not on this node")
        return target

    def offline_target(self, target_id: int) -> Target:
        """Admin: report the target offline from now on (until the service restarts); TargetNotFound if absent."""
        target = self.get_target(target_id)
        target.role.admin_offline = True
        return target

    def target_reports(self) -> list[tuple[int, int]]:
        """``(target_id, local state)`` of every target, for the next heartbeat."""
        return [(t.target_id, int(t.role.report())) for t in self.targets.values()]

    def lease_lost(self) -> None:
        """T/2 without mgmtd: stop serving; every target comes back only through recovery."""
        self.lease_ok = False
        for t in self.targets.values():
            t.role.needs_recovery()

    def lease_regained(self) -> None:
        """The lease is back (mgmtd answers again): the node may serve, each target as its role allows."""
        self.lease_ok = True

    # ---- routing ----

    def on_routing(self, view: RoutingView) -> None:
        """Take newer routing (older or equal versions are ignored) and update every target's public state."""
        if self.view is not None and view.version <= self.view.version:
            return
        self.view = view
        for t in self.targets.values():
            self._observe_one(t)
        self.routing_changed.set()

    def _observe_one(self, target: Target) -> None:
        chain = self.view.chain(target.record.chain_id) if self.view else None
        me = next((x for x in chain.targets if x.target_id == target.target_id), None) if chain else None
        before = target.role.public
        target.role.observe(Public(me.public_state) if me else Public.NONE, chain.version if chain else 0)
        if target.role.public is not before:
            logger.info("target %d is publicly %s", target.target_id, target.role.public.name.lower())

    def position(self, target: Target) -> tuple[Chain, int] | None:
        """The target's chain and its index in it (0: the head); None when routing has it in no chain."""
        chain = self.view.chain(target.record.chain_id) if self.view else None
        if chain is None:
            return None
        for i, t in enumerate(chain.targets):
            if t.target_id == target.target_id:
                return chain, i
        return None

    def heads(self, target: Target) -> bool:
        """Whether ``target`` is its chain's serving head now.

        First in the routing it follows, holding its lease, not down, publicly serving: a head whose routing is stale
        learns it from its lapsed lease.
        """
        pos = self.position(target)
        return pos is not None and pos[1] == 0 and target.role.may_read(self.lease_ok)

    def successor(self, target: Target) -> tuple[Chain, RoutingTarget | None] | None:
        """The target's chain and the next serving or syncing target after it (None: this is the tail).

        None when routing has the target in no chain.
        """
        pos = self.position(target)
        if pos is None:
            return None
        chain, i = pos
        nxt = next(
            (t for t in chain.targets[i + 1 :] if Public(t.public_state) in (Public.SERVING, Public.SYNCING)), None
        )
        return chain, nxt

    def target_of_chain(self, chain_id: int) -> Target | None:
        """This node's target of ``chain_id``, if it holds one (a node holds at most one per chain)."""
        return next((t for t in self.targets.values() if t.record.chain_id == chain_id), None)

    def spawn(self, coro: Any, tasks: set[asyncio.Task[None]] | None = None) -> asyncio.Task[None]:
        """Run ``coro`` as a task kept in ``tasks`` (default: the node's background tasks) until it ends."""
        tasks = self._background if tasks is None else tasks
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return task

    async def update_to_the_end(
        self, target_id: int, keys: list[ChunkKey], step: Callable[[], Coroutine[Any, Any, None]]
    ) -> None:
        """Wait for the chunks' locks, then run ``step`` to its end with them held, even if the caller is cancelled.

        ``step`` is a chain update of those chunks. The caller may be cancelled meanwhile (a client that timed
        out, a predecessor that died mid-call): 3FS's storage service finishes every update it started too. A
        caller that gives up while still waiting for the locks leaves nothing behind.

        Dropping an update halfway would leave this replica behind its successor when the successor already
        committed the version: a retried write then brings that version again, the successor answers
        "duplicate" and keeps its copy, and the replicas hold different bytes under one version. The update
        is bounded anyway: the forward gives up after ``forward_timeout_s``.
        """
        release = await self.locks.acquire(target_id, keys)

        async def run() -> None:
            try:
                await step()
            finally:
                release()

        task = self.spawn(run(), self._updates)
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():
                task.add_done_callback(_log_orphan_failure)
            raise

    async def settle_updates(self) -> bool:
        """Wait for the chain updates running now (not those started meanwhile) to end, ``forward_timeout_s`` at most.

        Whether they all ended. A recovery's plan waits for them: one that found no successor (the returning target
        was not in the chain yet) commits here without passing its chunk on, maybe after the plan looked.
        """
        running = set(self._updates)
        if not running:
            return True
        _, pending = await asyncio.wait(running, timeout=self.config.forward_timeout_s)
        return not pending

    async def finish_updates(self) -> None:
        """Wait (at most ``forward_timeout_s``) for chain updates whose callers left.

        At shutdown, before the chunk engines close under them.
        """
        if self._updates:
            await asyncio.wait(set(self._updates), timeout=self.config.forward_timeout_s)


def _log_orphan_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        logger.warning("a chain update whose caller had left failed: %r", exc)


def result_of(status: IoStatus, message: str = "", version: int = 0, meta: ChunkMeta | None = None) -> UpdateResult:
    """An update's result; with the chunk's metadata after it (``meta``), its length and checksum too."""
    if meta is None:
        return UpdateResult(status, message, version)
    return UpdateResult(status, message, version, meta.length, meta.checksum)
