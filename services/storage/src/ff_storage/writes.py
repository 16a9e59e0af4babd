"""The CRAQ write path: at the head, lock, pending = committed + 1, forward, commit on the successor's ack;
at the replicas, apply what the predecessor forwards (or, while syncing, full-chunk replaces) and pass
it on. Writes, partial updates, truncates and removes all go through it."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import time
import uuid
from collections import defaultdict

from google.protobuf.message import DecodeError

from ff_rpc import RpcError
from ff_storage.core import admission
from ff_storage.core.chunks import (
    MAX_CHUNK_SIZE_BYTES,
    ChunkKey,
    ForwardDecision,
    UpdateKey,
    UpdateRecord,
    apply_truncate,
    apply_write,
    chain_update_id,
    check_chunk_id,
    check_range,
    check_update_id,
    decide_forward,
)
from ff_storage.core.errors import ChunkCorrupt, InvalidRequest, NotServing, TooCostly
from ff_storage.core.target_role import Public
from ff_storage.io_stats import WRITE
from ff_storage.node_base import NodeBase, Payload, Target, Update, _res
from ff_storage.store.chunk_engine import ChunkEngine, Pending, PendingItem
from fireflyer.mgmtd.v1 import mgmtd_pb2 as mpb
from fireflyer.storage.v1 import storage_pb2 as spb
from hf3fs.checksum import crc32c_of
from hf3fs.datapath import DataPathError

logger = logging.getLogger(__name__)

INLINE_FORWARD_MAX_BYTES = 64 * 1024
_HEAD_CLIENT_ID = uuid.uuid4().bytes  # ids the head gives updates that come without one
_head_request_ids = itertools.count(1)


class WritePath(NodeBase):
    # ---- write (head) ----

    def _update_id(self, what: str, pb_id: spb.UpdateId, owner: str = "", *fields: int) -> UpdateKey | None:
        """The update's id from the wire bound to its caller and content (``chain_update_id``), or a new one of
        the head's when it has none (ids on)."""
        got = check_update_id(what, pb_id.client_id, pb_id.request_id)
        if got is None:
            return (_HEAD_CLIENT_ID, next(_head_request_ids)) if self.config.update_ids else None
        return chain_update_id(owner, got, *fields)

    async def batch_write(self, ios: list[spb.WriteIO], owner: str) -> list[spb.UpdateResult]:
        self.check_count("IOs", len(ios))
        total = 0
        ids: list[UpdateKey | None] = []
        for n, io in enumerate(ios):
            check_chunk_id(io.chunk_id.inode_id, io.chunk_id.chunk_index)
            ids.append(self._update_id(f"ios[{n}]", io.update_id, owner, spb.UPDATE_TYPE_WRITE, io.offset_bytes,
                                       io.length_bytes, io.checksum.value, io.chunk_size_bytes))  # fmt: skip
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
            raise TooCostly(f"batch of {total} bytes is over the limit of {self.config.max_batch_bytes}")
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
                length=io.length_bytes, update_id=ids[n],
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
        return _status(admission.at_head(self._admission_state(target), chain_id, chain_version))

    def _admission_state(self, target: Target | None) -> admission.TargetState | None:
        """What ``core.admission`` decides on: the target's place in its chain and its role, as they are now."""
        if target is None:
            return None
        pos = self._position(target)
        return admission.TargetState(
            target_id=target.target_id, chain_version=pos[0].version if pos else None, index=pos[1] if pos else None,
            may_update=target.role.may_update(self.lease_ok), serving=target.role.public is Public.SERVING,
        )  # fmt: skip

    async def truncate(self, ios: list[spb.TruncateIO]) -> list[spb.UpdateResult]:
        self.check_count("IOs", len(ios))
        ids = []
        for n, io in enumerate(ios):
            check_chunk_id(io.chunk_id.inode_id, io.chunk_id.chunk_index)
            if not 0 < io.chunk_size_bytes <= MAX_CHUNK_SIZE_BYTES:
                raise InvalidRequest(f"ios[{n}]: chunk_size_bytes {io.chunk_size_bytes} must be in "
                                     f"1..{MAX_CHUNK_SIZE_BYTES}")  # fmt: skip
            if io.length_bytes > io.chunk_size_bytes:
                raise InvalidRequest(f"ios[{n}]: length {io.length_bytes} is past chunk size {io.chunk_size_bytes}")
            ids.append(self._update_id(f"ios[{n}]", io.update_id, "", spb.UPDATE_TYPE_TRUNCATE, io.length_bytes,
                                       io.chunk_size_bytes))  # fmt: skip
        return await self._head_simple(
            [(io.chain_id, io.chain_version, Update(key=(io.chunk_id.inode_id, io.chunk_id.chunk_index),
                                                    kind=spb.UPDATE_TYPE_TRUNCATE, chunk_size=io.chunk_size_bytes,
                                                    length=io.length_bytes, update_id=uid))
             for io, uid in zip(ios, ids, strict=True)]
        )  # fmt: skip

    async def remove(self, request: spb.RemoveChunksRequest, max_default: int = 256) -> tuple[int, bool]:
        check_chunk_id(request.inode_id, request.begin_chunk_index)
        target = self._target_of_chain(request.chain_id)
        status = self._head_check(target, request.chain_id, request.chain_version)
        if status:
            raise InvalidRequest(status[1]) if target is None else NotServing(status[1])
        assert target is not None
        keys = target.engine.keys_of_inode(request.inode_id, request.begin_chunk_index, request.end_chunk_index)
        limit = min(request.max_chunks or max_default, self.config.max_batch_ios)
        todo = keys[:limit]
        results = await self._head_simple(
            [(request.chain_id, request.chain_version, Update(key=k, kind=spb.UPDATE_TYPE_REMOVE, chunk_size=0,
                                                              update_id=self._update_id("remove", spb.UpdateId())))
             for k in todo]
        )  # fmt: skip
        if any(r.status != spb.CHUNK_IO_STATUS_OK for r in results):
            raise NotServing("some removals did not complete; retry")
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
        """Lock, pending = committed + 1, forward, commit on ack (3FS CRAQ at the head); a round started goes
        on to its end even if the caller goes away (``update_to_the_end``)."""
        started = time.perf_counter()
        for round_ in _rounds(updates):
            await self.update_to_the_end(target.target_id, [u.key for u in round_],
                                         functools.partial(self._head_round, target, round_))  # fmt: skip
        ok = spb.CHUNK_IO_STATUS_OK
        written = sum(u.length for u in updates if u.kind == spb.UPDATE_TYPE_WRITE and u.result.status == ok)
        self.io_stats.record(WRITE, target.target_id, written, time.perf_counter() - started)

    async def _head_round(self, target: Target, round_: list[Update]) -> None:
        chain_version = self._position(target)[0].version if self._position(target) else 0  # type: ignore[index]
        for u in round_:
            u.chain_version = chain_version
        ready = await asyncio.to_thread(self._prepare, target, round_, True)
        damaged = [u for u in round_ if u.corrupt]
        for u in damaged:  # the head's own copy is bad: repair it (and the chain) from a good one, then go on
            if await self.repair_locked(target, u.key):
                u.corrupt, u.result = False, spb.UpdateResult()
                ready += await asyncio.to_thread(self._prepare, target, [u], True)
        await self._store_forward_commit(target, ready)

    def _prepare(self, target: Target, updates: list[Update], at_head: bool) -> list[Update]:
        """Decide each update and compute its new content (thread); returns the ones to store and pass on.
        The others have their result set (already committed, duplicate, missing update, corrupt base chunk:
        ``corrupt`` set, the caller repairs; nothing to remove). Runs in a worker thread: no event loop here."""
        ready: list[Update] = []
        for u in updates:
            meta = target.engine.get(u.key)
            committed = meta.committed_version if meta else 0
            if at_head:
                done = self._already_committed(target, u)
                if done is not None:  # a retry of an update committed before: its original result
                    u.result = _res(spb.CHUNK_IO_STATUS_OK, "already committed", done.version)
                    u.result.chunk_length_bytes = done.length
                    u.result.chunk_checksum.CopyFrom(spb.Checksum(type=spb.CHECKSUM_TYPE_CRC32C, value=done.checksum))
                    continue
                u.version = committed + 1
            else:
                decision = decide_forward(committed, u.version, u.full, self._same_update(target, u, committed))
                if decision is ForwardDecision.DUPLICATE:
                    u.result = _res(spb.CHUNK_IO_STATUS_OK, "duplicate", committed, meta)
                    continue
                if decision is ForwardDecision.MISSING:
                    u.result = _res(spb.CHUNK_IO_STATUS_MISSING_UPDATE, f"have version {committed}, got {u.version}")
                    continue
            try:
                u.content = self._new_content(target, u)
            except ChunkCorrupt as exc:
                # a replica asks for the whole chunk instead (which replaces its bad copy); the head repairs
                status = spb.CHUNK_IO_STATUS_CHECKSUM_MISMATCH if at_head else spb.CHUNK_IO_STATUS_MISSING_UPDATE
                u.result, u.corrupt = _res(status, str(exc)), True
                continue
            if u.kind == spb.UPDATE_TYPE_REMOVE and meta is None and not at_head:
                u.result = _res(spb.CHUNK_IO_STATUS_OK, "already removed")
                continue
            if u.content is not None:
                u.content_checksum = u.data_checksum if u.content is u.data else None
                if u.content_checksum is None:
                    u.content_checksum = crc32c_of(u.content)
            ready.append(u)
        return ready

    def _already_committed(self, target: Target, u: Update) -> UpdateRecord | None:
        if not self.config.update_ids or u.update_id is None:
            return None
        return target.engine.find_update(u.key, u.update_id)

    def _same_update(self, target: Target, u: Update, committed: int) -> bool | None:
        """Whether this replica committed ``u.version`` from this very update (None: ids off, or the update
        has none, so the version alone decides)."""
        if not self.config.update_ids or u.update_id is None or u.full or u.version > committed:
            return None
        record = target.engine.update_at(u.key, u.version)
        return record is not None and record.update_id == u.update_id

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

    async def _store_forward_commit(self, target: Target, updates: list[Update], *, forward: bool = True) -> None:
        """Store the updates as pending versions here while passing them on, then commit those the successor
        acknowledged (the tail: all of them) and drop the rest.

        The versions are reserved first (reads here answer "pending" from now on, as before the write began);
        then the local write (file + fsync) and the forward run at once, so a chain of 3 pays about one
        write's latency instead of three in a row. The ack upstream waits for both, so an acknowledged update
        is durable on every replica. If storing or committing here fails after the successor took an update,
        this replica is a version behind the rest of the chain: the target reports offline and goes through
        recovery, as after a restart. Callers run it through ``update_to_the_end``, so it is not cancelled
        when a client or predecessor gives up; cancelled anyway (the service stopping), it drops what it
        stored once the write thread is done.
        """
        if not updates:
            return
        engine = target.engine
        reserved = engine.reserve([(u.key, u.version, u.chain_version) for u in updates])
        items: list[PendingItem] = [(u.key, u.version, u.chain_version, u.content, u.content_checksum)
                                    for u in updates]  # fmt: skip
        store = asyncio.ensure_future(asyncio.to_thread(engine.write_pending, items, reserved))
        try:
            failed = await self._forward(target, updates) if forward else []
            stored = await asyncio.shield(store)
        except BaseException as exc:
            store.add_done_callback(functools.partial(_drop_stored, engine, reserved))
            failed_here = store.done() and not store.cancelled() and store.exception() is exc
            if failed_here and any(u.forwarded for u in updates):
                self._behind_the_chain(target, "storing", exc)
            raise
        for u, p in zip(updates, stored, strict=True):
            u.pending = p
        done = [u for u in updates if u not in failed]
        tags = [(u.update_id, u.records if u.full else None) for u in done if u.pending]
        try:
            metas = await asyncio.to_thread(engine.commit, [u.pending for u in done if u.pending], tags)
        except Exception as exc:
            if any(u.forwarded for u in done):
                self._behind_the_chain(target, "committing", exc)
            engine.abort(stored)
            raise
        for u, meta in zip(done, metas, strict=True):
            u.result = _res(spb.CHUNK_IO_STATUS_OK, "", u.version, meta)
        if failed:
            engine.abort([u.pending for u in failed if u.pending])

    def _behind_the_chain(self, target: Target, what: str, exc: BaseException) -> None:
        logger.error("target %d: %s updates its successor already took failed (%s); it goes through recovery",
                     target.target_id, what, exc)  # fmt: skip
        target.role.needs_recovery()

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
            except (RpcError, OSError, ConnectionError, DataPathError, DecodeError) as exc:
                answers = [_res(spb.CHUNK_IO_STATUS_FORWARD_FAILED, f"successor {nxt.target_id}: {exc}")] * len(todo)
            retry = []
            for u, r in zip(todo, answers, strict=True):
                if r.status == spb.CHUNK_IO_STATUS_OK:
                    u.forwarded = True
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
            if u.update_id is not None:
                msg.update_id.CopyFrom(spb.UpdateId(client_id=u.update_id[0], request_id=u.update_id[1]))
            if full:
                records = u.records if u.records is not None else self.targets[from_target].engine.recent_updates(u.key)
                msg.recent_updates.extend(_record_pb(r) for r in records)
            if kind == spb.UPDATE_TYPE_WRITE:
                if bulk:
                    msg.transfer.CopyFrom(spb.TransferRef(transfer_id=transfer_id, offset_bytes=offset))
                    parts.append(payload)
                    offset += len(payload)
                else:
                    msg.inline_data = bytes(payload)
            msgs.append(msg)
        request = spb.ForwardUpdatesRequest(from_target_id=from_target, updates=msgs)
        node = self.view.node(nxt.node_id) if self.view else None
        if node is not None and node.data:
            # one round trip on the data path: the request and its bytes together, no push, no gRPC call
            async with asyncio.timeout(self.config.forward_timeout_s):  # the version check too
                if await self._data.calls_direct(node.data):
                    raw = await self._data.call(node.data, "ForwardUpdates", request.SerializeToString(),
                                                transfer_id, parts)  # fmt: skip
                    return list(spb.ForwardUpdatesResponse.FromString(raw).results)
        if parts:
            if node is None or not node.data:
                raise ConnectionError(f"node {nxt.node_id} has no data endpoint")
            await self._data.get(node.data).push(transfer_id, parts)
        resp = await self._rpc.unary(self._stub(nxt.node_id).ForwardUpdates, request)
        return list(resp.results)

    # ---- write (replicas) ----

    def _check_forwarded(self, n: int, cu: spb.ChunkUpdate) -> tuple[UpdateKey | None, list[UpdateRecord] | None]:
        """A forwarded update's shape (before any work): its id, and a full replace's records."""
        what = f"updates[{n}]"
        check_chunk_id(cu.chunk_id.inode_id, cu.chunk_id.chunk_index)
        kind = cu.update_type
        if kind not in (spb.UPDATE_TYPE_WRITE, spb.UPDATE_TYPE_TRUNCATE, spb.UPDATE_TYPE_REMOVE):
            raise InvalidRequest(f"{what}: update_type {kind} is not a write, truncate or remove")
        if kind != spb.UPDATE_TYPE_REMOVE:
            if not 0 < cu.chunk_size_bytes <= MAX_CHUNK_SIZE_BYTES:
                raise InvalidRequest(f"{what}: chunk_size_bytes {cu.chunk_size_bytes} must be in "
                                     f"1..{MAX_CHUNK_SIZE_BYTES}")  # fmt: skip
            end = cu.offset_bytes + (cu.length_bytes if kind == spb.UPDATE_TYPE_WRITE else 0)
            if max(end, cu.length_bytes) > cu.chunk_size_bytes:
                raise InvalidRequest(f"{what}: offset {cu.offset_bytes} + length {cu.length_bytes} is past the "
                                     f"chunk size {cu.chunk_size_bytes}")  # fmt: skip
        if cu.update_version <= 0:
            raise InvalidRequest(f"{what}: update_version must be positive")
        which = cu.WhichOneof("data")
        if which == "inline_data" and len(cu.inline_data) != cu.length_bytes:
            raise InvalidRequest(f"{what}: inline data has {len(cu.inline_data)} bytes, length says {cu.length_bytes}")
        if kind == spb.UPDATE_TYPE_WRITE and which is None and cu.length_bytes:
            raise InvalidRequest(f"{what}: a write without data")
        self.check_count("recent_updates", len(cu.recent_updates))
        records = [record_from_pb(r) for r in cu.recent_updates] if cu.full_chunk_replace else None
        return check_update_id(what, cu.update_id.client_id, cu.update_id.request_id), records

    def _check_forward_call(
        self, request: spb.ForwardUpdatesRequest
    ) -> list[tuple[UpdateKey | None, list[UpdateRecord] | None]]:
        self.check_count("updates", len(request.updates))
        checked = [self._check_forwarded(n, cu) for n, cu in enumerate(request.updates)]
        total = sum(cu.length_bytes for cu in request.updates if cu.update_type == spb.UPDATE_TYPE_WRITE)
        if total > self.config.max_batch_bytes:
            raise TooCostly(f"updates of {total} bytes in one call: the limit is {self.config.max_batch_bytes}")
        return checked

    async def forward_updates(self, request: spb.ForwardUpdatesRequest, owner: str) -> list[spb.UpdateResult]:
        checked = self._check_forward_call(request)
        results = [spb.UpdateResult() for _ in request.updates]
        groups: dict[int, list[tuple[int, Update]]] = defaultdict(list)
        blobs: dict[str, bytearray | None] = {}
        for n, cu in enumerate(request.updates):
            key = (cu.chunk_id.inode_id, cu.chunk_id.chunk_index)
            target = self._target_of_chain(cu.chain_id)
            refused = _status(admission.at_replica(self._admission_state(target), cu.chain_id, cu.chain_version,
                                                   cu.no_forward))  # fmt: skip
            if refused is not None:
                results[n] = _res(*refused)
                continue
            assert target is not None
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
                chain_version=cu.chain_version, update_id=checked[n][0], records=checked[n][1],
                no_forward=cu.no_forward,
            )))  # fmt: skip
        await asyncio.gather(*(self._replica_updates(self.targets[t], [u for _, u in items])
                               for t, items in groups.items()))  # fmt: skip
        for items in groups.values():
            for n, u in items:
                results[n] = u.result
        return results

    async def _replica_updates(self, target: Target, updates: list[Update]) -> None:
        """Apply what the predecessor forwarded and pass it on; a round started goes on to its end even if the
        predecessor goes away (``update_to_the_end``)."""
        for round_ in _rounds(updates):
            await self.update_to_the_end(target.target_id, [u.key for u in round_],
                                         functools.partial(self._replica_round, target, round_))  # fmt: skip

    async def _replica_round(self, target: Target, round_: list[Update]) -> None:
        ready = await asyncio.to_thread(self._prepare, target, round_, False)
        await self._store_forward_commit(target, [u for u in ready if u.no_forward], forward=False)
        await self._store_forward_commit(target, [u for u in ready if not u.no_forward])


_REFUSAL_STATUS = {
    admission.Refusal.NOT_SERVING: spb.CHUNK_IO_STATUS_TARGET_NOT_SERVING,
    admission.Refusal.STALE_CHAIN_VERSION: spb.CHUNK_IO_STATUS_STALE_CHAIN_VERSION,
}


def _status(refusal: tuple[admission.Refusal, str] | None) -> tuple[int, str] | None:
    return None if refusal is None else (_REFUSAL_STATUS[refusal[0]], refusal[1])


def _record_pb(r: UpdateRecord) -> spb.UpdateRecord:
    return spb.UpdateRecord(
        update_id=spb.UpdateId(client_id=r.update_id[0], request_id=r.update_id[1]), version=r.version,
        chunk_length_bytes=r.length, chunk_checksum=spb.Checksum(type=spb.CHECKSUM_TYPE_CRC32C, value=r.checksum),
        committed_at_ms=r.committed_at_ms,
    )  # fmt: skip


def record_from_pb(m: spb.UpdateRecord) -> UpdateRecord:
    got = check_update_id("recent_updates", m.update_id.client_id, m.update_id.request_id)
    if got is None:
        raise InvalidRequest("recent_updates: a record without an update id")
    return UpdateRecord(update_id=got, version=m.version, length=m.chunk_length_bytes,
                        checksum=m.chunk_checksum.value, committed_at_ms=m.committed_at_ms)  # fmt: skip


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
    if payload is u.content and u.content_checksum is not None:
        return u.content_checksum
    return crc32c_of(payload)


def _drop_stored(engine: ChunkEngine, reserved: list[Pending], store: asyncio.Future[list[Pending]]) -> None:
    """Once the write thread of an abandoned update is done: drop what it stored (or its reservations)."""
    if store.cancelled() or store.exception() is not None:
        engine.abort(reserved)
    else:
        engine.abort(store.result())
