"""The storage node: its targets, the CRAQ update pipeline (head and replicas), reads, recovery, repair.

Decisions come from ``core`` (IO checks, version rules, sync diff, the target's state machine); disk
work runs in threads on the chunk engine; this module does the ordering, locking and the calls to the
other replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ff_rpc import RpcClient, RpcError
from ff_rpc.client import NO_RETRY, StubPool
from ff_storage.core.chunks import (
    ChunkKey,
    ForwardDecision,
    apply_truncate,
    apply_write,
    check_chunk_id,
    check_range,
    check_read_range,
    decide_forward,
    sync_diff,
)
from ff_storage.core.errors import ChunkCorrupt, InvalidRequest, TargetExists, TargetNotFound
from ff_storage.core.target_role import Public, TargetRole
from ff_storage.dataserver import TransferBoxes
from ff_storage.store.chunk_engine import ChunkEngine, Pending, PendingItem
from ff_storage.store.targets import TargetRecord, load_targets, save_targets
from fireflyer.mgmtd.v1 import mgmtd_pb2 as mpb
from fireflyer.storage.v1 import storage_pb2 as spb
from fireflyer.storage.v1 import storage_pb2_grpc
from hf3fs.checksum import crc32c_of
from hf3fs.datapath import DataConnectionPool
from hf3fs.routing import RoutingView

logger = logging.getLogger(__name__)

ST = spb.ChunkIoStatus
INLINE_FORWARD_MAX_BYTES = 64 * 1024
# Chunk bytes: bulk payloads are views into the received buffer (4 MiB copies cost milliseconds).
Payload = bytes | memoryview
SYNC_BATCH = 16


@dataclass(frozen=True, kw_only=True)
class NodeConfig:
    node_id: int
    disks: list[Path]
    targets_file: Path
    cluster_token: str
    max_io_bytes: int
    max_batch_bytes: int
    forward_timeout_s: float
    data_wait_s: float
    fsync: bool


@dataclass
class Target:
    record: TargetRecord
    engine: ChunkEngine
    role: TargetRole

    @property
    def target_id(self) -> int:
        return self.record.target_id


@dataclass
class Update:
    """One chain update being applied at one target."""

    key: ChunkKey
    kind: int  # spb.UpdateType
    chunk_size: int
    offset: int = 0
    data: Payload = b""
    data_checksum: int | None = None  # CRC of ``data``, verified on arrival (a 4 MiB CRC costs ~0.4 ms)
    length: int = 0
    full: bool = False
    version: int = 0
    chain_version: int = 0
    content: Payload | None = None
    pending: Pending | None = None
    result: spb.UpdateResult = field(default_factory=spb.UpdateResult)


class ChunkLocks:
    """Per-chunk locks (3FS's lock manager): writes to a chunk are serialized at every replica."""

    def __init__(self) -> None:
        self._locks: dict[tuple[int, ChunkKey], asyncio.Lock] = {}
        self._users: dict[tuple[int, ChunkKey], int] = defaultdict(int)

    @contextlib.asynccontextmanager
    async def hold(self, target_id: int, keys: list[ChunkKey]) -> AsyncIterator[None]:
        ids = [(target_id, k) for k in sorted(set(keys))]
        for i in ids:
            self._users[i] += 1
        acquired: list[asyncio.Lock] = []
        try:
            for i in ids:
                lock = self._locks.setdefault(i, asyncio.Lock())
                await lock.acquire()
                acquired.append(lock)
            yield
        finally:
            for lock in acquired:
                lock.release()
            for i in ids:
                self._users[i] -= 1
                if not self._users[i]:
                    del self._users[i]
                    self._locks.pop(i, None)


class StorageNode:
    def __init__(self, config: NodeConfig, boxes: TransferBoxes) -> None:
        self.config = config
        self.node_id = config.node_id
        self.boxes = boxes
        self.targets: dict[int, Target] = {}
        self.view: RoutingView | None = None
        self.lease_ok = True
        self.locks = ChunkLocks()
        self._rpc = RpcClient(token=config.cluster_token, timeout_s=config.forward_timeout_s, retry=NO_RETRY)
        self._stubs = StubPool(storage_pb2_grpc.StorageServiceStub)  # one per address: stubs are not free
        self._data = DataConnectionPool(config.cluster_token)
        self._syncing: set[tuple[int, int, int]] = set()
        self._background: set[asyncio.Task[None]] = set()
        self.routing_changed = asyncio.Event()

    # ---- targets ----

    def open_targets(self) -> None:
        for record in load_targets(self.config.targets_file):
            engine = ChunkEngine(Path(record.path), fsync=self.config.fsync)
            engine.open()
            self.targets[record.target_id] = Target(record, engine, TargetRole(restarting=True))
        logger.info("opened %d target(s)", len(self.targets))

    async def close_channels(self) -> None:
        await self._stubs.close()

    def close(self) -> None:
        self._data.close()
        for t in self.targets.values():
            t.engine.close()

    def create_target(self, target_id: int, chain_id: int, disk_index: int) -> Target:
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
        engine = ChunkEngine(path, fsync=self.config.fsync)
        engine.open()
        save_targets(self.config.targets_file, [*(t.record for t in self.targets.values()), record])
        target = Target(record, engine, TargetRole())
        self.targets[target_id] = target
        self._observe_one(target)
        logger.info("created target %d of chain %d at %s", target_id, chain_id, path)
        return target

    def get_target(self, target_id: int) -> Target:
        target = self.targets.get(target_id)
        if target is None:
            raise TargetNotFound(f"target {target_id} is not on this node")
        return target

    def offline_target(self, target_id: int) -> Target:
        target = self.get_target(target_id)
        target.role.admin_offline = True
        return target

    def target_reports(self) -> list[tuple[int, int]]:
        return [(t.target_id, int(t.role.report())) for t in self.targets.values()]

    def lease_lost(self) -> None:
        """T/2 without mgmtd: stop serving; every target comes back only through recovery."""
        self.lease_ok = False
        for t in self.targets.values():
            t.role.restarting = True

    def lease_regained(self) -> None:
        self.lease_ok = True

    # ---- routing ----

    def on_routing(self, info: mpb.RoutingInfo) -> None:
        if self.view is not None and info.version <= self.view.version:
            return
        self.view = RoutingView(info)
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

    def _position(self, target: Target) -> tuple[mpb.Chain, int] | None:
        chain = self.view.chain(target.record.chain_id) if self.view else None
        if chain is None:
            return None
        for i, t in enumerate(chain.targets):
            if t.target_id == target.target_id:
                return chain, i
        return None

    def _successor(self, target: Target) -> tuple[mpb.Chain, mpb.Target | None] | None:
        pos = self._position(target)
        if pos is None:
            return None
        chain, i = pos
        nxt = next(
            (t for t in chain.targets[i + 1 :] if Public(t.public_state) in (Public.SERVING, Public.SYNCING)), None
        )
        return chain, nxt

    def _target_of_chain(self, chain_id: int) -> Target | None:
        return next((t for t in self.targets.values() if t.record.chain_id == chain_id), None)

    def _stub(self, node_id: int) -> storage_pb2_grpc.StorageServiceStub:
        node = self.view.node(node_id) if self.view else None
        if node is None or not node.grpc:
            raise ConnectionError(f"node {node_id} has no address in routing")
        return self._stubs.get(node.grpc)

    # ---- write (head) ----

    async def batch_write(self, ios: list[spb.WriteIO], owner: str) -> list[spb.UpdateResult]:
        total = 0
        for n, io in enumerate(ios):
            check_chunk_id(io.chunk_id.inode_id, io.chunk_id.chunk_index)
            check_range(f"ios[{n}]", io.chunk_size_bytes, io.offset_bytes, io.length_bytes, self.config.max_io_bytes)
            which = io.WhichOneof("data")
            if which is None:
                raise InvalidRequest(f"ios[{n}]: no data (inline_data or transfer)")
            if which == "inline_data" and len(io.inline_data) != io.length_bytes:
                raise InvalidRequest(f"ios[{n}]: inline data has {len(io.inline_data)} bytes, length says "
                                     f"{io.length_bytes}")  # fmt: skip
            if self.view is not None and self.view.chain(io.chain_id) is None:
                raise InvalidRequest(f"ios[{n}]: unknown chain {io.chain_id}")
            total += io.length_bytes
        if total > self.config.max_batch_bytes:
            raise InvalidRequest(f"batch of {total} bytes is over the limit of {self.config.max_batch_bytes}")
        results = [spb.UpdateResult() for _ in ios]
        payloads = await self._gather_payloads(ios, owner, results)
        groups: dict[int, list[Update]] = defaultdict(list)
        slots: dict[int, list[int]] = defaultdict(list)
        for n, io in enumerate(ios):
            if results[n].status:
                continue
            data = payloads[n]
            if io.checksum.value != crc32c_of(data):
                results[n] = _res(spb.CHUNK_IO_STATUS_CHECKSUM_MISMATCH, "payload does not match its checksum")
                continue
            target = self._target_of_chain(io.chain_id)
            status = self._head_check(target, io.chain_id, io.chain_version)
            if status:
                results[n] = _res(status[0], status[1])
                continue
            assert target is not None
            groups[target.target_id].append(Update(
                key=(io.chunk_id.inode_id, io.chunk_id.chunk_index), kind=spb.UPDATE_TYPE_WRITE,
                chunk_size=io.chunk_size_bytes, offset=io.offset_bytes, data=data, data_checksum=io.checksum.value,
                length=io.length_bytes,
            ))  # fmt: skip
            slots[target.target_id].append(n)
        await asyncio.gather(*(self._head_updates(self.targets[t], ups) for t, ups in groups.items()))
        for t, ups in groups.items():
            for n, up in zip(slots[t], ups, strict=True):
                results[n] = up.result
        return results

    async def _gather_payloads(
        self, ios: list[spb.WriteIO], owner: str, results: list[spb.UpdateResult]
    ) -> list[Payload]:
        blobs: dict[str, bytearray | None] = {}
        for io in ios:
            if io.WhichOneof("data") == "transfer" and io.transfer.transfer_id not in blobs:
                blobs[io.transfer.transfer_id] = None
        for tid in blobs:
            blobs[tid] = await self.boxes.take(tid, owner, self.config.data_wait_s)
        out: list[Payload] = []
        for n, io in enumerate(ios):
            if io.WhichOneof("data") == "inline_data":
                out.append(io.inline_data)
                continue
            blob = blobs[io.transfer.transfer_id]
            start = io.transfer.offset_bytes
            if blob is None or start + io.length_bytes > len(blob):
                results[n] = _res(spb.CHUNK_IO_STATUS_DATA_TIMEOUT, "bulk data did not arrive (or is short)")
                out.append(b"")
                continue
            out.append(memoryview(blob)[start : start + io.length_bytes])
        return out

    def _head_check(self, target: Target | None, chain_id: int, chain_version: int) -> tuple[int, str] | None:
        if target is None:
            return spb.CHUNK_IO_STATUS_TARGET_NOT_SERVING, f"no target of chain {chain_id} on this node"
        pos = self._position(target)
        if pos is None or not target.role.may_update(self.lease_ok) or target.role.public is not Public.SERVING:
            return spb.CHUNK_IO_STATUS_TARGET_NOT_SERVING, f"target {target.target_id} is not serving"
        chain, i = pos
        if chain.version != chain_version:
            return spb.CHUNK_IO_STATUS_STALE_CHAIN_VERSION, f"chain {chain_id} is at version {chain.version}"
        if i != 0:
            return spb.CHUNK_IO_STATUS_TARGET_NOT_SERVING, f"target {target.target_id} is not the head"
        return None

    async def truncate(self, ios: list[spb.TruncateIO]) -> list[spb.UpdateResult]:
        for n, io in enumerate(ios):
            check_chunk_id(io.chunk_id.inode_id, io.chunk_id.chunk_index)
            if io.length_bytes > io.chunk_size_bytes or io.chunk_size_bytes <= 0:
                raise InvalidRequest(f"ios[{n}]: length {io.length_bytes} is past chunk size {io.chunk_size_bytes}")
        return await self._head_simple(
            [(io.chain_id, io.chain_version, Update(key=(io.chunk_id.inode_id, io.chunk_id.chunk_index),
                                                    kind=spb.UPDATE_TYPE_TRUNCATE, chunk_size=io.chunk_size_bytes,
                                                    length=io.length_bytes)) for io in ios]
        )  # fmt: skip

    async def remove(self, request: spb.RemoveChunksRequest, max_default: int = 256) -> tuple[int, bool]:
        check_chunk_id(request.inode_id, request.begin_chunk_index)
        target = self._target_of_chain(request.chain_id)
        status = self._head_check(target, request.chain_id, request.chain_version)
        if status:
            raise InvalidRequest(status[1]) if target is None else _NotServing(status[1])
        assert target is not None
        keys = target.engine.keys_of_inode(request.inode_id, request.begin_chunk_index, request.end_chunk_index)
        limit = request.max_chunks or max_default
        todo = keys[:limit]
        results = await self._head_simple(
            [(request.chain_id, request.chain_version, Update(key=k, kind=spb.UPDATE_TYPE_REMOVE, chunk_size=0))
             for k in todo]
        )  # fmt: skip
        if any(r.status != spb.CHUNK_IO_STATUS_OK for r in results):
            raise _NotServing("some removals did not complete; retry")
        return len(todo), len(keys) > limit

    async def _head_simple(self, items: list[tuple[int, int, Update]]) -> list[spb.UpdateResult]:
        groups: dict[int, list[Update]] = defaultdict(list)
        results: list[spb.UpdateResult | Update] = []
        for chain_id, chain_version, up in items:
            target = self._target_of_chain(chain_id)
            status = self._head_check(target, chain_id, chain_version)
            if status:
                results.append(_res(status[0], status[1]))
                continue
            assert target is not None
            groups[target.target_id].append(up)
            results.append(up)
        await asyncio.gather(*(self._head_updates(self.targets[t], ups) for t, ups in groups.items()))
        return [r.result if isinstance(r, Update) else r for r in results]

    async def _head_updates(self, target: Target, updates: list[Update]) -> None:
        """Lock, pending = committed + 1, forward, commit on ack (3FS CRAQ at the head)."""
        for round_ in _rounds(updates):
            async with self.locks.hold(target.target_id, [u.key for u in round_]):
                chain_version = self._position(target)[0].version if self._position(target) else 0  # type: ignore[index]
                for u in round_:
                    u.chain_version = chain_version
                await asyncio.to_thread(self._prepare, target, round_, True)
                await self._forward_and_commit(target, [u for u in round_ if u.pending is not None])

    def _prepare(self, target: Target, updates: list[Update], at_head: bool) -> None:
        """Compute new contents and store them as pending versions (thread)."""
        items: list[PendingItem] = []
        ready: list[Update] = []
        for u in updates:
            meta = target.engine.get(u.key)
            committed = meta.committed_version if meta else 0
            if at_head:
                u.version = committed + 1
            else:
                decision = decide_forward(committed, u.version, u.full)
                if decision is ForwardDecision.DUPLICATE:
                    u.result = _res(spb.CHUNK_IO_STATUS_OK, "duplicate", committed, meta)
                    continue
                if decision is ForwardDecision.MISSING:
                    u.result = _res(spb.CHUNK_IO_STATUS_MISSING_UPDATE, f"have version {committed}, got {u.version}")
                    continue
            try:
                u.content = self._new_content(target, u)
            except ChunkCorrupt as exc:
                u.result = _res(spb.CHUNK_IO_STATUS_CHECKSUM_MISMATCH, str(exc))
                self.spawn(self.request_repair(target, [u.key]))
                continue
            if u.kind == spb.UPDATE_TYPE_REMOVE and meta is None and not at_head:
                u.result = _res(spb.CHUNK_IO_STATUS_OK, "already removed")
                continue
            known = u.data_checksum if u.content is u.data else None
            items.append((u.key, u.version, u.chain_version, u.content, known))
            ready.append(u)
        for u, p in zip(ready, target.engine.write_pending(items), strict=True):
            u.pending = p

    def _new_content(self, target: Target, u: Update) -> Payload | None:
        if u.kind == spb.UPDATE_TYPE_REMOVE:
            return None
        if u.full:
            return u.data
        if u.kind == spb.UPDATE_TYPE_WRITE and u.offset == 0 and u.length == u.chunk_size:
            return u.data  # whole chunk: no need to read the old one
        current = target.engine.read_committed(u.key)
        old = current[1] if current else None
        if u.kind == spb.UPDATE_TYPE_TRUNCATE:
            return apply_truncate(old, u.length)
        return apply_write(old, u.offset, u.data)

    async def _forward_and_commit(self, target: Target, updates: list[Update]) -> None:
        if not updates:
            return
        failed = await self._forward(target, updates)
        done = [u for u in updates if u not in failed]
        metas = await asyncio.to_thread(target.engine.commit, [u.pending for u in done if u.pending])
        for u, meta in zip(done, metas, strict=True):
            u.result = _res(spb.CHUNK_IO_STATUS_OK, "", u.version, meta)
        if failed:
            target.engine.abort([u.pending for u in failed if u.pending])

    async def _forward(self, target: Target, updates: list[Update]) -> list[Update]:  # noqa: PLR0912
        """Send updates to the successor until it acks them (re-forwarding as the chain changes).

        Returns the updates that could not be forwarded before the deadline (their results say why).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.forward_timeout_s
        todo = list(updates)
        full_keys: set[ChunkKey] = set()
        while todo:
            if not target.role.may_update(self.lease_ok):
                for u in todo:
                    u.result = _res(spb.CHUNK_IO_STATUS_TARGET_NOT_SERVING, "this target stopped serving")
                return todo
            succ = self._successor(target)
            if succ is None:
                break
            chain, nxt = succ
            if nxt is None:
                return []  # this target is the tail: commit
            try:
                answers = await self._send_updates(chain, nxt, todo, full_keys, target.target_id)
            except (RpcError, OSError, ConnectionError) as exc:
                answers = [_res(spb.CHUNK_IO_STATUS_FORWARD_FAILED, f"successor {nxt.target_id}: {exc}")] * len(todo)
            retry = []
            for u, r in zip(todo, answers, strict=True):
                if r.status == spb.CHUNK_IO_STATUS_OK:
                    continue
                if r.status == spb.CHUNK_IO_STATUS_MISSING_UPDATE:
                    full_keys.add(u.key)
                u.result = r
                retry.append(u)
            todo = retry
            if not todo:
                return []
            if loop.time() > deadline:
                break
            await self._wait_routing(0.05)
        for u in todo:
            if not u.result.status or u.result.status == spb.CHUNK_IO_STATUS_OK:
                u.result = _res(spb.CHUNK_IO_STATUS_FORWARD_FAILED, "successor did not acknowledge in time")
        return todo

    async def _wait_routing(self, timeout_s: float) -> None:
        self.routing_changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.routing_changed.wait(), timeout_s)

    async def _send_updates(
        self, chain: mpb.Chain, nxt: mpb.Target, updates: list[Update], full_keys: set[ChunkKey], from_target: int,
        *, no_forward: bool = False,
    ) -> list[spb.UpdateResult]:  # fmt: skip
        syncing = Public(nxt.public_state) is Public.SYNCING
        msgs: list[spb.ChunkUpdate] = []
        parts: list[Payload] = []
        offset = 0
        transfer_id = uuid.uuid4().hex
        total = sum(len(u.content or b"") if (u.full or syncing or u.key in full_keys) else len(u.data)
                    for u in updates)  # fmt: skip
        bulk = total > INLINE_FORWARD_MAX_BYTES
        for u in updates:
            full = u.full or syncing or u.key in full_keys
            payload = (u.content or b"") if full else u.data
            kind = u.kind if not full or u.kind == spb.UPDATE_TYPE_REMOVE else spb.UPDATE_TYPE_WRITE
            msg = spb.ChunkUpdate(
                chain_id=chain.chain_id, chain_version=u.chain_version if no_forward else chain.version,
                chunk_id=spb.ChunkId(inode_id=u.key[0], chunk_index=u.key[1]),
                update_type=spb.UpdateType.ValueType(kind),
                update_version=u.version, chunk_size_bytes=u.chunk_size, offset_bytes=0 if full else u.offset,
                length_bytes=len(payload) if kind == spb.UPDATE_TYPE_WRITE else u.length,
                checksum=spb.Checksum(type=spb.CHECKSUM_TYPE_CRC32C, value=_payload_checksum(u, payload)),
                full_chunk_replace=full, no_forward=no_forward,
            )  # fmt: skip
            if kind == spb.UPDATE_TYPE_WRITE:
                if bulk:
                    msg.transfer.CopyFrom(spb.TransferRef(transfer_id=transfer_id, offset_bytes=offset))
                    parts.append(payload)
                    offset += len(payload)
                else:
                    msg.inline_data = bytes(payload)
            msgs.append(msg)
        if parts:
            node = self.view.node(nxt.node_id) if self.view else None
            if node is None or not node.data:
                raise ConnectionError(f"node {nxt.node_id} has no data endpoint")
            await self._data.get(node.data).push(transfer_id, parts)
        resp = await self._rpc.unary(self._stub(nxt.node_id).ForwardUpdates,
                                     spb.ForwardUpdatesRequest(from_target_id=from_target, updates=msgs))  # fmt: skip
        return list(resp.results)

    # ---- write (replicas) ----

    async def forward_updates(self, request: spb.ForwardUpdatesRequest, owner: str) -> list[spb.UpdateResult]:
        results = [spb.UpdateResult() for _ in request.updates]
        groups: dict[int, list[tuple[int, Update]]] = defaultdict(list)
        blobs: dict[str, bytearray | None] = {}
        for n, cu in enumerate(request.updates):
            key = check_chunk_id(cu.chunk_id.inode_id, cu.chunk_id.chunk_index)
            target = self._target_of_chain(cu.chain_id)
            if target is None:
                results[n] = _res(spb.CHUNK_IO_STATUS_TARGET_NOT_SERVING, f"no target of chain {cu.chain_id} here")
                continue
            pos = self._position(target)
            if not target.role.may_update(self.lease_ok) or pos is None:
                results[n] = _res(spb.CHUNK_IO_STATUS_TARGET_NOT_SERVING, f"target {target.target_id} not serving")
                continue
            if not cu.no_forward and pos[0].version != cu.chain_version:
                results[n] = _res(spb.CHUNK_IO_STATUS_STALE_CHAIN_VERSION, f"chain at version {pos[0].version}")
                continue
            data: Payload = b""
            if cu.WhichOneof("data") == "inline_data":
                data = cu.inline_data
            elif cu.WhichOneof("data") == "transfer":
                tid = cu.transfer.transfer_id
                if tid not in blobs:
                    blobs[tid] = await self.boxes.take(tid, owner, self.config.data_wait_s)
                blob = blobs[tid]
                start = cu.transfer.offset_bytes
                if blob is None or start + cu.length_bytes > len(blob):
                    results[n] = _res(spb.CHUNK_IO_STATUS_DATA_TIMEOUT, "bulk data did not arrive")
                    continue
                data = memoryview(blob)[start : start + cu.length_bytes]
            if cu.update_type == spb.UPDATE_TYPE_WRITE and crc32c_of(data) != cu.checksum.value:
                results[n] = _res(spb.CHUNK_IO_STATUS_CHECKSUM_MISMATCH, "forwarded data does not match its checksum")
                continue
            groups[target.target_id].append((n, Update(
                key=key, kind=cu.update_type, chunk_size=cu.chunk_size_bytes, offset=cu.offset_bytes, data=data,
                data_checksum=cu.checksum.value if cu.update_type == spb.UPDATE_TYPE_WRITE else None,
                length=cu.length_bytes, full=cu.full_chunk_replace, version=cu.update_version,
                chain_version=cu.chain_version,
            )))  # fmt: skip
            if cu.no_forward:
                groups[target.target_id][-1][1].result.message = "no_forward"
        await asyncio.gather(*(self._replica_updates(self.targets[t], [u for _, u in items])
                               for t, items in groups.items()))  # fmt: skip
        for items in groups.values():
            for n, u in items:
                results[n] = u.result
        return results

    async def _replica_updates(self, target: Target, updates: list[Update]) -> None:
        for round_ in _rounds(updates):
            async with self.locks.hold(target.target_id, [u.key for u in round_]):
                no_forward = [u for u in round_ if u.result.message == "no_forward"]
                for u in no_forward:
                    u.result = spb.UpdateResult()
                await asyncio.to_thread(self._prepare, target, round_, False)
                local_only = [u for u in no_forward if u.pending is not None]
                chained = [u for u in round_ if u.pending is not None and u not in local_only]
                if local_only:
                    metas = await asyncio.to_thread(target.engine.commit, [u.pending for u in local_only if u.pending])
                    for u, meta in zip(local_only, metas, strict=True):
                        u.result = _res(spb.CHUNK_IO_STATUS_OK, "", u.version, meta)
                await self._forward_and_commit(target, chained)

    # ---- read ----

    async def batch_read(
        self, ios: list[spb.ReadIO], transport: int, owner: str
    ) -> tuple[list[spb.ReadResult], str, int]:
        for n, io in enumerate(ios):
            check_chunk_id(io.chunk_id.inode_id, io.chunk_id.chunk_index)
            try:
                check_read_range(io.offset_bytes, io.length_bytes, self.config.max_io_bytes)
            except InvalidRequest as exc:
                raise InvalidRequest(f"ios[{n}]: {exc}") from None
        bulk = transport == spb.DATA_TRANSPORT_BULK
        found = await asyncio.to_thread(lambda: [self._read_one(io) for io in ios])  # one thread hop per batch
        results: list[spb.ReadResult] = []
        parts: list[bytes | memoryview] = []
        offset = 0
        transfer_id = uuid.uuid4().hex if bulk else ""
        for res, data in found:
            if data is not None:
                if bulk:
                    res.transfer.CopyFrom(spb.TransferRef(transfer_id=transfer_id, offset_bytes=offset))
                    parts.append(data)
                    offset += len(data)
                else:
                    res.inline_data = bytes(data)
            results.append(res)
        if not parts:
            return results, "", 0
        return results, transfer_id, self.boxes.stage(transfer_id, owner, parts)

    def _read_one(self, io: spb.ReadIO) -> tuple[spb.ReadResult, memoryview | None]:
        target = self._target_of_chain(io.chain_id)
        if target is None or not target.role.may_read(self.lease_ok):
            return spb.ReadResult(status=spb.CHUNK_IO_STATUS_TARGET_NOT_SERVING, message="not serving reads"), None
        if target.role.chain_version != io.chain_version:
            return spb.ReadResult(status=spb.CHUNK_IO_STATUS_STALE_CHAIN_VERSION,
                                  message=f"chain at version {target.role.chain_version}"), None  # fmt: skip
        key = (io.chunk_id.inode_id, io.chunk_id.chunk_index)
        meta = target.engine.get(key)
        if meta is None:
            return spb.ReadResult(status=spb.CHUNK_IO_STATUS_CHUNK_NOT_FOUND, message="no such chunk"), None
        if meta.pending_version and not io.relaxed:
            return spb.ReadResult(status=spb.CHUNK_IO_STATUS_PENDING_VERSION,
                                  message=f"version {meta.pending_version} is pending"), None  # fmt: skip
        checksum: int | None = None  # of the whole chunk, when already verified
        data: bytes | memoryview
        try:
            if meta.pending_version:
                got = target.engine.read_pending(key)
                if got is None:
                    return spb.ReadResult(status=spb.CHUNK_IO_STATUS_CHUNK_NOT_FOUND, message="pending remove"), None
                version, data, pending = got[0].version, got[1], True
            else:
                committed = target.engine.map_committed(key)
                if committed is None:
                    return spb.ReadResult(status=spb.CHUNK_IO_STATUS_CHUNK_NOT_FOUND, message="no such chunk"), None
                version, data, pending = committed[0].committed_version, committed[1], False
                checksum = committed[0].checksum  # map_committed verified the bytes against it
        except ChunkCorrupt as exc:
            self._loop_spawn(target, key)
            return spb.ReadResult(status=spb.CHUNK_IO_STATUS_CHECKSUM_MISMATCH, message=str(exc)), None
        piece = memoryview(data)[io.offset_bytes : io.offset_bytes + io.length_bytes]
        if checksum is None or len(piece) != len(data):
            checksum = crc32c_of(piece)
        return spb.ReadResult(
            status=spb.CHUNK_IO_STATUS_OK, length_bytes=len(piece), version=version, is_pending=pending,
            checksum=spb.Checksum(type=spb.CHECKSUM_TYPE_CRC32C, value=checksum),
        ), piece  # fmt: skip

    def _loop_spawn(self, target: Target, key: ChunkKey) -> None:
        loop = self._loop
        loop.call_soon_threadsafe(lambda: self.spawn(self.request_repair(target, [key])))

    _loop: asyncio.AbstractEventLoop

    def bind_loop(self) -> None:
        self._loop = asyncio.get_running_loop()

    def query_last(self, q: spb.LastChunkQuery) -> spb.LastChunkResult:
        check_chunk_id(q.inode_id, q.begin_chunk_index)
        target = self._target_of_chain(q.chain_id)
        if target is None or not target.role.may_read(self.lease_ok):
            return spb.LastChunkResult(status=spb.CHUNK_IO_STATUS_TARGET_NOT_SERVING)
        if target.role.chain_version != q.chain_version:
            return spb.LastChunkResult(status=spb.CHUNK_IO_STATUS_STALE_CHAIN_VERSION)
        last, count, pending = target.engine.last_chunk(q.inode_id, q.begin_chunk_index, q.end_chunk_index)
        if last is None:
            return spb.LastChunkResult(status=spb.CHUNK_IO_STATUS_CHUNK_NOT_FOUND)
        status = spb.CHUNK_IO_STATUS_PENDING_VERSION if pending else spb.CHUNK_IO_STATUS_OK
        return spb.LastChunkResult(status=status, last_chunk_index=last.chunk_index,
                                   last_chunk_length_bytes=last.length, num_chunks=count)  # fmt: skip

    # ---- repair ----

    def spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def request_repair(self, target: Target, keys: list[ChunkKey]) -> None:
        """Ask the chain's head to rewrite these chunks everywhere from a good copy."""
        chain = self.view.chain(target.record.chain_id) if self.view else None
        if chain is None or not chain.targets:
            return
        chunk_ids = [spb.ChunkId(inode_id=k[0], chunk_index=k[1]) for k in keys]
        request = spb.RepairChunksRequest(chain_id=chain.chain_id, chain_version=chain.version, chunk_ids=chunk_ids)
        try:
            if chain.targets[0].node_id == self.node_id:
                await self.repair(request)
            else:
                await self._rpc.unary(self._stub(chain.targets[0].node_id).RepairChunks, request)
            logger.warning("repaired chunk(s) %s of chain %d", keys, chain.chain_id)
        except Exception:
            logger.exception("repair of %s failed", keys)

    async def repair(self, request: spb.RepairChunksRequest) -> list[spb.UpdateResult]:
        target = self._target_of_chain(request.chain_id)
        if target is None:
            raise InvalidRequest(f"no target of chain {request.chain_id} on this node")
        pos = self._position(target)
        if pos is None or pos[1] != 0:
            raise InvalidRequest(f"target {target.target_id} is not the head of chain {request.chain_id}")
        chain = pos[0]
        results = []
        for cid in request.chunk_ids:
            key = check_chunk_id(cid.inode_id, cid.chunk_index)
            async with self.locks.hold(target.target_id, [key]):
                results.append(await self._repair_one(target, chain, key))
        return results

    async def _repair_one(self, target: Target, chain: mpb.Chain, key: ChunkKey) -> spb.UpdateResult:
        meta = target.engine.get(key)
        if meta is None or not meta.committed_version:
            return _res(spb.CHUNK_IO_STATUS_CHUNK_NOT_FOUND, "head has no committed copy")
        own_bad = False
        try:
            got = await asyncio.to_thread(target.engine.read_committed, key)
            content = got[1] if got else b""
        except ChunkCorrupt:
            own_bad, content = True, b""
            for other in chain.targets[1:]:
                if Public(other.public_state) is not Public.SERVING:
                    continue
                cid = spb.ChunkId(inode_id=key[0], chunk_index=key[1])
                read = spb.ReadIO(chain_id=chain.chain_id, chain_version=chain.version, chunk_id=cid,
                                  length_bytes=meta.length)  # fmt: skip
                with contextlib.suppress(RpcError, ConnectionError):
                    resp = await self._rpc.unary(self._stub(other.node_id).BatchRead, spb.BatchReadRequest(
                        ios=[read], transport=spb.DATA_TRANSPORT_INLINE))  # fmt: skip
                    r = resp.results[0]
                    if r.status == spb.CHUNK_IO_STATUS_OK and crc32c_of(r.inline_data) == meta.checksum:
                        content = r.inline_data
                        break
            else:
                return _res(spb.CHUNK_IO_STATUS_CHECKSUM_MISMATCH, "no good copy found")
        up = Update(key=key, kind=spb.UPDATE_TYPE_WRITE, chunk_size=meta.length or 1, data=content, content=content,
                    length=len(content), full=True, version=meta.committed_version,
                    chain_version=meta.chain_version)  # fmt: skip
        if own_bad:
            pend = await asyncio.to_thread(target.engine.write_pending,
                                           [(key, up.version, up.chain_version, content, None)])  # fmt: skip
            await asyncio.to_thread(target.engine.commit, pend)
        for other in chain.targets[1:]:
            if Public(other.public_state) is Public.SERVING:
                with contextlib.suppress(RpcError, ConnectionError, OSError):
                    await self._send_updates(chain, other, [up], set(), target.target_id, no_forward=True)
        return _res(spb.CHUNK_IO_STATUS_OK, "repaired", meta.committed_version, target.engine.get(key))

    # ---- recovery ----

    def dump_chunk_meta(self, target_id: int) -> list[spb.ChunkMeta]:
        target = self.get_target(target_id)
        return [
            spb.ChunkMeta(
                chunk_id=spb.ChunkId(inode_id=m.inode_id, chunk_index=m.chunk_index), chain_version=m.chain_version,
                committed_version=m.committed_version, pending_version=m.pending_version, length_bytes=m.length,
                checksum=spb.Checksum(type=spb.CHECKSUM_TYPE_CRC32C, value=m.checksum),
            )
            for m in target.engine.all_metas()
        ]  # fmt: skip

    def complete_sync(self, target_id: int, chain_version: int) -> None:
        target = self.get_target(target_id)
        if target.role.public is not Public.SYNCING:
            raise InvalidRequest(f"target {target_id} is not syncing")
        target.role.sync_done(chain_version)
        logger.info("target %d: sync done at chain version %d", target_id, chain_version)

    async def sync_loop(self, stop: asyncio.Event, interval_s: float) -> None:
        """Start a sync for every chain where this node's serving target precedes a syncing one."""
        while not stop.is_set():
            for target in list(self.targets.values()):
                succ = self._successor(target)
                if succ is None or target.role.public is not Public.SERVING:
                    continue
                chain, nxt = succ
                if nxt is None:
                    continue
                job = (chain.chain_id, nxt.target_id, chain.version)
                if Public(nxt.public_state) is Public.SYNCING and job not in self._syncing:
                    self._syncing.add(job)
                    self.spawn(self._sync(target, chain, nxt, job))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_s)

    async def _sync(self, target: Target, chain: mpb.Chain, nxt: mpb.Target, job: tuple[int, int, int]) -> None:
        try:
            logger.info("syncing target %d from %d (chain %d v%d)", nxt.target_id, target.target_id, chain.chain_id,
                        chain.version)  # fmt: skip
            stub = self._stub(nxt.node_id)
            remote = {}
            dump = spb.DumpChunkMetaRequest(chain_id=chain.chain_id, chain_version=chain.version,
                                            target_id=nxt.target_id)  # fmt: skip
            async for batch in self._rpc.stream(stub.DumpChunkMeta, dump, timeout_s=60):
                for m in batch.chunks:
                    remote[(m.chunk_id.inode_id, m.chunk_id.chunk_index)] = _meta_from_pb(m)
            plan = sync_diff(target.engine.committed_metas(), remote)
            for i in range(0, len(plan.transfer), SYNC_BATCH):
                await self._sync_batch(target, chain, nxt, plan.transfer[i : i + SYNC_BATCH], remove=False)
            for i in range(0, len(plan.remove), SYNC_BATCH):
                await self._sync_batch(target, chain, nxt, plan.remove[i : i + SYNC_BATCH], remove=True)
            await self._rpc.unary(stub.CompleteSync, spb.CompleteSyncRequest(
                chain_id=chain.chain_id, chain_version=chain.version, target_id=nxt.target_id))  # fmt: skip
            logger.info("synced target %d: %d transferred, %d removed", nxt.target_id, len(plan.transfer),
                        len(plan.remove))  # fmt: skip
        except Exception as exc:
            logger.warning("sync of target %d failed (will retry): %s", nxt.target_id, exc)
            await asyncio.sleep(0.5)
            self._syncing.discard(job)

    async def _sync_batch(
        self, target: Target, chain: mpb.Chain, nxt: mpb.Target, keys: list[ChunkKey], *, remove: bool
    ) -> None:
        async with self.locks.hold(target.target_id, keys):
            ups = []
            for key in keys:
                got = None if remove else await asyncio.to_thread(target.engine.read_committed, key)
                if got is None:
                    ups.append(Update(key=key, kind=spb.UPDATE_TYPE_REMOVE, chunk_size=0, full=True,
                                      version=2**62, chain_version=chain.version))  # fmt: skip
                    continue
                meta, content = got
                ups.append(Update(key=key, kind=spb.UPDATE_TYPE_WRITE, chunk_size=max(1, meta.length), data=content,
                                  content=content, length=len(content), full=True, version=meta.committed_version,
                                  chain_version=meta.chain_version))  # fmt: skip
            answers = await self._send_updates(chain, nxt, ups, set(), target.target_id, no_forward=True)
            bad = [r for r in answers if r.status != spb.CHUNK_IO_STATUS_OK]
            if bad:
                raise RuntimeError(f"{len(bad)} sync write(s) refused: {bad[0].message}")


class _NotServing(InvalidRequest):
    """Raised for calls without per-IO results when the target does not serve (mapped like bad input)."""


def _rounds(updates: list[Update]) -> list[list[Update]]:
    """Split so that each round touches a chunk at most once (updates to one chunk apply in order)."""
    rounds: list[list[Update]] = []
    for u in updates:
        for r in rounds:
            if all(x.key != u.key for x in r):
                r.append(u)
                break
        else:
            rounds.append([u])
    return rounds


def _payload_checksum(u: Update, payload: Payload) -> int:
    """CRC of what is forwarded, reusing one already computed over the very same object."""
    if payload is u.data and u.data_checksum is not None:
        return u.data_checksum
    if u.pending is not None and u.pending.path is not None and payload is u.content:
        return u.pending.checksum
    return crc32c_of(payload)


def _res(status: int, message: str = "", version: int = 0, meta: Any = None) -> spb.UpdateResult:
    r = spb.UpdateResult(status=spb.ChunkIoStatus.ValueType(status), message=message, committed_version=version)
    if meta is not None:
        r.chunk_length_bytes = meta.length
        r.chunk_checksum.CopyFrom(spb.Checksum(type=spb.CHECKSUM_TYPE_CRC32C, value=meta.checksum))
    return r


def _meta_from_pb(m: spb.ChunkMeta) -> Any:
    from ff_storage.core.chunks import ChunkMeta

    return ChunkMeta(inode_id=m.chunk_id.inode_id, chunk_index=m.chunk_id.chunk_index, chain_version=m.chain_version,
                     committed_version=m.committed_version, length=m.length_bytes, checksum=m.checksum.value,
                     pending_version=m.pending_version)  # fmt: skip


Factory = Callable[[], StorageNode]
