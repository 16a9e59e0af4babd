"""The CRAQ write path (``ChainWriter``): the head versions and forwards updates, the replicas apply them.

At the head: lock, pending = committed + 1, forward, commit on the successor's ack; at the replicas, apply
what the predecessor forwards (or, while syncing, full-chunk replaces) and pass it on. Writes, partial
updates, truncates and removes all go through it. It acts on the node's state (``node_state``), sends through
``peers`` and asks ``Repairs`` (recovery) to rewrite a damaged chunk at the head.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from ff_fsprotocol.checksum import crc32c_of
from ff_fsprotocol.datapath import DataPathError
from ff_rpc import RpcError
from ff_storage.core import admission, craq
from ff_storage.core.chunks import (
    MAX_CHUNK_SIZE_BYTES,
    ChunkKey,
    ChunkMeta,
    UpdateKey,
    chain_update_id,
    check_chunk_id,
    check_range,
    check_update_id,
)
from ff_storage.core.errors import InvalidRequest, NotServing, TooCostly
from ff_storage.core.requests import ChunkUpdate, Payload, RemoveRequest, TransferRef, TruncateIO, UpdateKind, WriteIO
from ff_storage.core.results import IoStatus, UpdateResult
from ff_storage.core.target_role import Public
from ff_storage.io_stats import WRITE
from ff_storage.node_state import NodeState, Target, Update, result_of
from ff_storage.peers import Peers
from ff_storage.prepare import prepare
from ff_storage.rounds import content_bytes, merged_writes, plan_rounds
from ff_storage.store.chunk_engine import ChunkEngine, Pending, PendingItem

logger = logging.getLogger(__name__)

# A round of at most this many updates whose chunks come to at most this many bytes in memory is prepared on the
# event loop (``_prepared``): each update may read its committed chunk there.
INLINE_PREPARE_UPDATES = 4
INLINE_PREPARE_BYTES = 256 * 1024
_HEAD_CLIENT_ID = uuid.uuid4().bytes  # ids the head gives updates that come without one
_head_request_ids = itertools.count(1)


class Repairs(Protocol):
    """What the writer asks of recovery: at the head, chunk lock held, rewrite ``key`` from a good copy."""

    async def repair_locked(self, target: Target, key: ChunkKey) -> bool:
        """Rewrite ``key`` from a good copy if ``target`` is its chain's head; whether the chunk is good now."""
        ...


class ChainWriter:
    """The CRAQ update pipeline of one node's targets (see the module doc)."""

    def __init__(self, state: NodeState, peers: Peers, repairs: Repairs) -> None:
        self.state, self.peers, self.repairs = state, peers, repairs
        self._flush_waiting: set[int] = set()  # targets with a flush of in-memory commits waiting to run

    # ---- write (head) ----

    def _update_id(self, what: str, claimed: UpdateKey | None, owner: str = "", *fields: int) -> UpdateKey | None:
        """The update's id as the client sent it, checked and bound to its caller and content (``chain_update_id``).

        A new one of the head's when it has none (ids on).
        """
        got = None if claimed is None else check_update_id(what, *claimed)
        if got is None:
            return (_HEAD_CLIENT_ID, next(_head_request_ids)) if self.state.config.update_ids else None
        return chain_update_id(owner, got, *fields)

    async def batch_write(
        self, ios: Sequence[WriteIO], owner: str, attached: Mapping[str, bytearray] | None = None
    ) -> list[UpdateResult]:
        """Write ``ios`` at their chains' heads on this node (BatchWrite); one result per IO, in order.

        The whole call is checked before any IO is applied; an IO this target does not take gets its status in
        its result. ``owner`` is the caller, whose pushed bytes the IOs may name; ``attached``: bytes that came
        with the call itself (a data-path ``call``), by transfer id, taken before the inbox is looked at.

        Raises:
            InvalidRequest: an IO is malformed (chunk id, range, data, unknown chain).
            TooCostly: too many IOs or bytes in one call.
        """
        self.state.check_count("IOs", len(ios))
        total = 0
        ids: list[UpdateKey | None] = []
        for n, io in enumerate(ios):
            check_chunk_id(*io.key)
            ids.append(
                self._update_id(
                    f"ios[{n}]", io.update_id, owner, UpdateKind.WRITE, io.offset, io.length, io.checksum, io.chunk_size
                )
            )
            check_range(f"ios[{n}]", io.chunk_size, io.offset, io.length, self.state.config.max_io_bytes)
            if io.data is None and io.transfer is None:
                raise InvalidRequest(f"ios[{n}]: no data (inline_data or transfer)")
            if io.data is not None and len(io.data) != io.length:
                raise InvalidRequest(f"ios[{n}]: inline data has {len(io.data)} bytes, length says {io.length}")
            if self.state.view is not None and self.state.view.chain(io.chain_id) is None:
                raise InvalidRequest(f"ios[{n}]: unknown chain {io.chain_id}")
            total += io.length
        if total > self.state.config.max_batch_bytes:
            raise TooCostly(f"batch of {total} bytes is over the limit of {self.state.config.max_batch_bytes}")
        results = [UpdateResult() for _ in ios]
        payloads = await self._gather_payloads(ios, owner, results, attached or {})
        groups: dict[int, list[Update]] = defaultdict(list)
        slots: dict[int, list[int]] = defaultdict(list)
        for n, io in enumerate(ios):
            if results[n].status:
                continue
            data = payloads[n]
            if io.checksum != crc32c_of(data):
                results[n] = result_of(IoStatus.CHECKSUM_MISMATCH, "payload does not match its checksum")
                continue
            target = self.state.target_of_chain(io.chain_id)
            status = self._head_check(target, io.chain_id, io.chain_version)
            if status:
                results[n] = result_of(status[0], status[1])
                continue
            assert target is not None
            groups[target.target_id].append(
                Update(
                    key=io.key,
                    kind=UpdateKind.WRITE,
                    chunk_size=io.chunk_size,
                    offset=io.offset,
                    data=data,
                    data_checksum=io.checksum,
                    length=io.length,
                    update_id=ids[n],
                )
            )
            slots[target.target_id].append(n)
        await asyncio.gather(*(self._head_updates(self.state.targets[t], ups) for t, ups in groups.items()))
        for t, ups in groups.items():
            for n, up in zip(slots[t], ups, strict=True):
                results[n] = up.result
        return results

    async def _gather_payloads(
        self, ios: Sequence[WriteIO], owner: str, results: list[UpdateResult], attached: Mapping[str, bytearray]
    ) -> list[Payload]:
        blobs: dict[str, bytearray | None] = {}
        for io in ios:
            if io.transfer is not None and io.transfer.transfer_id not in blobs:
                blobs[io.transfer.transfer_id] = None
        for tid in blobs:
            blobs[tid] = await self._bulk_bytes(tid, owner, attached)
        out: list[Payload] = []
        for n, io in enumerate(ios):
            if io.data is not None:
                out.append(io.data)
                continue
            assert io.transfer is not None  # checked by batch_write
            data = _transferred(blobs[io.transfer.transfer_id], io.transfer, io.length)
            if data is None:
                results[n] = result_of(IoStatus.DATA_TIMEOUT, "bulk data did not arrive (or is short)")
                out.append(b"")
                continue
            out.append(data)
        return out

    def _head_check(self, target: Target | None, chain_id: int, chain_version: int) -> tuple[IoStatus, str] | None:
        return _status(admission.at_head(self._admission_state(target), chain_id, chain_version))

    def _admission_state(self, target: Target | None) -> admission.TargetState | None:
        """What ``core.admission`` decides on: the target's place in its chain and its role, as they are now."""
        if target is None:
            return None
        pos = self.state.position(target)
        return admission.TargetState(
            target_id=target.target_id,
            chain_version=pos[0].version if pos else None,
            index=pos[1] if pos else None,
            may_update=target.role.may_update(self.state.lease_ok),
            serving=target.role.public is Public.SERVING,
        )

    async def truncate(self, ios: Sequence[TruncateIO]) -> list[UpdateResult]:
        """Cut or zero-extend chunks at their chains' heads (TruncateChunks); one result per IO, in order.

        Raises:
            InvalidRequest: an IO is malformed (chunk id, chunk size, length).
            TooCostly: too many IOs in one call.
        """
        self.state.check_count("IOs", len(ios))
        ids = []
        for n, io in enumerate(ios):
            check_chunk_id(*io.key)
            if not 0 < io.chunk_size <= MAX_CHUNK_SIZE_BYTES:
                raise InvalidRequest(f"ios[{n}]: chunk_size_bytes {io.chunk_size} must be in 1..{MAX_CHUNK_SIZE_BYTES}")
            if io.length > io.chunk_size:
                raise InvalidRequest(f"ios[{n}]: length {io.length} is past chunk size {io.chunk_size}")
            ids.append(self._update_id(f"ios[{n}]", io.update_id, "", UpdateKind.TRUNCATE, io.length, io.chunk_size))
        return await self._head_simple(
            [
                (
                    io.chain_id,
                    io.chain_version,
                    Update(
                        key=io.key,
                        kind=UpdateKind.TRUNCATE,
                        chunk_size=io.chunk_size,
                        length=io.length,
                        update_id=uid,
                    ),
                )
                for io, uid in zip(ios, ids, strict=True)
            ]
        )

    async def remove(self, request: RemoveRequest, max_default: int = 256) -> tuple[int, bool]:
        """Remove an inode's chunks in a range at the chain's head (RemoveChunks), a bounded number per call.

        Returns how many were removed and whether more are left (the caller calls again).

        Raises:
            InvalidRequest: the chunk id is out of range, or this node holds no target of the chain.
            NotServing: the target does not take updates now, or some removals did not complete.
        """
        check_chunk_id(request.inode_id, request.begin_index)
        target = self.state.target_of_chain(request.chain_id)
        status = self._head_check(target, request.chain_id, request.chain_version)
        if status:
            raise InvalidRequest(status[1]) if target is None else NotServing(status[1])
        assert target is not None
        # With the chunks whose updates are running or waiting (a first write has no committed version yet): their
        # removal waits for their locks and removes what they committed, where skipping them would leave orphan
        # chunks of a removed file. (A write that arrives after this listing is meta's to keep out: it removes a
        # file's chunks once no write session of it is left.)
        begin, end = request.begin_index, request.end_index
        keys = sorted(
            {
                *target.engine.keys_of_inode(request.inode_id, begin, end),
                *self.state.locks.keys_in_use(target.target_id, request.inode_id, begin, end),
            }
        )
        limit = min(request.max_chunks or max_default, self.state.config.max_batch_ios)
        todo = keys[:limit]
        results = await self._head_simple(
            [
                (
                    request.chain_id,
                    request.chain_version,
                    Update(
                        key=k,
                        kind=UpdateKind.REMOVE,
                        chunk_size=0,
                        update_id=self._update_id("remove", None),
                    ),
                )
                for k in todo
            ]
        )
        if any(r.status != IoStatus.OK for r in results):
            raise NotServing("some removals did not complete; retry")
        return len(todo), len(keys) > limit

    async def _head_simple(self, items: list[tuple[int, int, Update]]) -> list[UpdateResult]:
        groups: dict[int, list[Update]] = defaultdict(list)
        results: list[UpdateResult | Update] = []
        for chain_id, chain_version, up in items:
            target = self.state.target_of_chain(chain_id)
            status = self._head_check(target, chain_id, chain_version)
            if status:
                results.append(result_of(status[0], status[1]))
                continue
            assert target is not None
            groups[target.target_id].append(up)
            results.append(up)
        await asyncio.gather(*(self._head_updates(self.state.targets[t], ups) for t, ups in groups.items()))
        return [r.result if isinstance(r, Update) else r for r in results]

    async def _head_updates(self, target: Target, updates: list[Update]) -> None:
        """Lock, pending = committed + 1, forward, commit on ack (3FS CRAQ at the head).

        A round started goes on to its end even if the caller goes away (``update_to_the_end``).
        """
        started = time.perf_counter()
        merged = merged_writes(updates)
        for round_ in self._rounds(target, merged):
            await self.state.update_to_the_end(
                target.target_id, [u.key for u in round_], functools.partial(self._head_round, target, round_)
            )
        for u in merged:
            for m in u.members or ():
                m.result = u.result
        ok = IoStatus.OK
        written = sum(u.length for u in updates if u.kind is UpdateKind.WRITE and u.result.status == ok)
        self.state.io_stats.record(WRITE, target.target_id, written, time.perf_counter() - started)

    async def _head_round(self, target: Target, round_: list[Update]) -> None:
        if not self._still_head(target):  # a batch's later rounds: another target may have become the head since
            _not_head(target, round_)
            return
        chain_version = self.state.position(target)[0].version if self.state.position(target) else 0  # type: ignore[index]
        for u in round_:
            u.chain_version, u.at_head = chain_version, True
        ready = await self._prepared(target, round_, True)
        damaged = [u for u in round_ if u.corrupt]
        for u in damaged:  # the head's own copy is bad: repair it (and the chain) from a good one, then go on
            if await self.repairs.repair_locked(target, u.key):
                u.corrupt, u.result = False, UpdateResult()
                ready += await self._prepared(target, [u], True)
        await self._store_forward_commit(target, ready)

    def _still_head(self, target: Target) -> bool:
        """Whether ``target`` is its chain's serving head now: only the head versions and acknowledges updates.

        A batch was admitted at its start (``batch_write``), but its rounds take turns on their chunks. A head taken
        out of its chain meanwhile (its lease lapsed) and back as a replica must neither version the rest, nor
        forward them past the new head: the replicas after it would hold writes the head never saw.
        """
        return self.state.heads(target)

    async def _prepared(self, target: Target, updates: list[Update], at_head: bool) -> list[Update]:
        """``prepare.prepare`` on the event loop when the chunks it builds are small, else in a worker thread.

        A trip to a worker thread and back costs a few hundred microseconds on a busy machine, more than
        building a small chunk; a chain write pays it at every replica, in a row.
        """
        update_ids = self.state.config.update_ids
        small = len(updates) <= INLINE_PREPARE_UPDATES
        if small and sum(content_bytes(target, u) for u in updates) <= INLINE_PREPARE_BYTES:
            return prepare(target, updates, at_head, update_ids)
        return await asyncio.to_thread(prepare, target, updates, at_head, update_ids)

    async def _store_forward_commit(self, target: Target, updates: list[Update], *, forward: bool = True) -> None:
        """Store the updates as pending here while passing them on; commit what the successor acknowledged.

        The tail commits all of them; the rest are dropped.

        The versions are reserved first (reads here answer "pending" from now on, as before the write began);
        then the forward goes out and the local write runs beside it, so a chain of 3 pays about one write's
        latency instead of three in a row (the tail, with nothing to forward, stores and commits in one trip to a
        worker thread: ``_store_and_commit``). The local write is a durable pending version: its file and its
        row are on disk when it ends (``store/pending_rows.py``). The ack upstream waits for both, so an
        acknowledged update is on disk at every replica; the commit is then made in memory and its rows written
        after the ack (``_flush_soon``): after a crash, ``open`` promotes the durable pending version. If storing
        or committing here fails after the successor took an update, this replica is a version behind the rest
        of the chain: the target reports offline and goes through recovery, as after a restart. Callers run it
        through ``update_to_the_end``, so it is not cancelled when a client or predecessor gives up; cancelled
        anyway (the service stopping), it drops what it stored once the write thread is done.
        """
        if not updates:
            return
        engine = target.engine
        reserved = engine.reserve([(u.key, u.version, u.chain_version) for u in updates])
        items: list[PendingItem] = [(u.key, u.version, u.chain_version, u.content, u.content_checksum) for u in updates]
        if not forward or self._is_tail(target, updates[0].at_head):
            await self._store_and_commit(target, updates, items, reserved)
            return
        sending = asyncio.ensure_future(self._forward(target, updates))
        try:
            await asyncio.sleep(0)  # the forward on its way before the store thread competes for the interpreter
        except BaseException:
            sending.cancel()
            sending.add_done_callback(_retrieved)
            engine.abort(reserved)
            raise
        tags = [(u.update_id, u.records) for u in updates]  # durable pending: the commit need not be (``pending_rows``)
        store = asyncio.ensure_future(asyncio.to_thread(engine.write_pending, items, reserved, tags))
        try:
            failed = await sending
            stored = await asyncio.shield(store)
        except BaseException as exc:
            store.add_done_callback(functools.partial(_drop_stored, engine, reserved))
            task = asyncio.current_task()
            if task is None or not task.cancelling():
                # The forward failed unexpectedly: the caller releases the chunks' locks when this returns, and
                # the next update of a chunk must not start while this one's write thread still runs.
                await asyncio.wait([store])
            failed_here = store.done() and not store.cancelled() and store.exception() is exc
            if failed_here:
                self._after_failure(target, "storing", exc, updates)
            raise
        for u, p in zip(updates, stored, strict=True):
            u.pending = p
        done = [u for u in updates if u not in failed]
        pendings = [u.pending for u in done if u.pending]
        tags = [(u.update_id, u.records) for u in done]
        try:
            if engine.needs_durable_commit(pendings):  # not on the loop: it waits for the disk
                metas = await asyncio.to_thread(engine.commit, pendings, tags)
            else:
                metas = engine.commit(pendings, tags, durable=False)
        except Exception as exc:
            self._after_failure(target, "committing", exc, done)
            engine.abort(stored)
            raise
        for u, meta in zip(done, metas, strict=True):
            u.result = result_of(IoStatus.OK, "", u.version, meta)
        if failed:
            engine.abort([u.pending for u in failed if u.pending])
        self._flush_soon(target)

    def _flush_soon(self, target: Target) -> None:
        """Write the target's commits made in memory, in a worker thread, unless a flush is already waiting to."""
        if target.target_id in self._flush_waiting:
            return
        self._flush_waiting.add(target.target_id)

        def in_thread() -> None:
            self._flush_waiting.discard(target.target_id)  # from here on, a new commit asks for another flush
            target.engine.flush()

        async def flush() -> None:
            try:
                await asyncio.to_thread(in_thread)
            except Exception:  # its versions are durable pending ones: a restart promotes them
                logger.exception("target %d: writing commits failed; it goes through recovery", target.target_id)
                target.role.needs_recovery()

        task = self.state.spawn(flush())
        task.add_done_callback(lambda _: self._flush_waiting.discard(target.target_id))  # also if cancelled first

    def _is_tail(self, target: Target, at_head: bool) -> bool:
        """Whether ``target`` commits without passing updates on now (``_forward`` would find nothing to send to).

        A head's own updates count only while it is still the head: else ``_forward`` refuses them.
        """
        if at_head and not self._still_head(target):
            return False
        succ = self.state.successor(target)
        step = craq.forward_step(
            target.role.may_update(self.state.lease_ok), succ is not None, succ is not None and succ[1] is not None
        )
        return step is craq.Step.COMMIT

    async def _store_and_commit(
        self, target: Target, updates: list[Update], items: list[PendingItem], reserved: list[Pending]
    ) -> None:
        """``_store_forward_commit`` with nothing to forward: store, then commit, in one trip to a worker thread.

        At the tail nothing comes between the two; a second trip would add a few hundred microseconds to every
        chain write. The version is stored durable pending and committed in memory, as at the other replicas. The
        outcomes are as there: a failure drops what was stored, a cancelled call drops it once the thread is done
        (a no-op for what it committed).
        """
        engine = target.engine
        stage = ["storing"]

        def store_and_commit() -> list[ChunkMeta | None]:
            tags = [(u.update_id, u.records) for u in updates]
            stored = engine.write_pending(items, reserved, tags)
            for u, p in zip(updates, stored, strict=True):
                u.pending = p
            stage[0] = "committing"
            return engine.commit(stored, tags, durable=False)

        job = asyncio.ensure_future(asyncio.to_thread(store_and_commit))
        try:
            metas = await asyncio.shield(job)
        except BaseException as exc:
            job.add_done_callback(functools.partial(_drop_all, engine, [*reserved], updates))
            if job.done() and not job.cancelled() and job.exception() is exc:
                self._after_failure(target, stage[0], exc, updates)
            raise
        for u, meta in zip(updates, metas, strict=True):
            u.result = result_of(IoStatus.OK, "", u.version, meta)
        self._flush_soon(target)

    def _after_failure(self, target: Target, what: str, exc: BaseException, updates: list[Update]) -> None:
        """Storing or committing ``updates`` here failed (what is stored is dropped by the caller).

        If the successor took any, this replica is behind the chain and goes through recovery.
        """
        if craq.on_failure(any(u.forwarded for u in updates)) is craq.AfterFailure.DROP_AND_RECOVER:
            logger.error(
                "target %d: %s updates its successor already took failed (%s); it goes through recovery",
                target.target_id,
                what,
                exc,
            )
            target.role.needs_recovery()

    async def _forward(self, target: Target, updates: list[Update]) -> list[Update]:  # noqa: PLR0912
        """Send updates to the successor until it acks them (re-forwarding as the chain changes).

        Returns the updates that could not be forwarded before the deadline (their results say why). Updates this
        target versioned as the head (``at_head``) are refused once it is not (the client retries at the new head).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.state.config.forward_timeout_s
        todo = list(updates)
        full_keys: set[ChunkKey] = set()
        while todo:
            if todo[0].at_head and not self._still_head(target):
                _not_head(target, todo)
                return todo
            succ = self.state.successor(target)
            step = craq.forward_step(
                target.role.may_update(self.state.lease_ok), succ is not None, succ is not None and succ[1] is not None
            )
            if step is craq.Step.NOT_SERVING:
                for u in todo:
                    u.result = result_of(IoStatus.TARGET_NOT_SERVING, "this target stopped serving")
                return todo
            if step is craq.Step.NOT_IN_CHAIN:
                break
            if step is craq.Step.COMMIT:
                return []  # this target is the tail
            assert succ is not None
            chain, nxt = succ
            assert nxt is not None
            try:
                answers = await self.peers.send_updates(chain, nxt, todo, full_keys, target.target_id)
            except (RpcError, OSError, ConnectionError, DataPathError) as exc:
                failed = result_of(IoStatus.FORWARD_FAILED, f"successor {nxt.target_id}: {exc}")
                answers = [failed] * len(todo)
            retry = []
            for u, r in zip(todo, answers, strict=True):
                answer = craq.on_answer(r.status == IoStatus.OK, r.status == IoStatus.MISSING_UPDATE)
                if answer is craq.Answer.ACKED:
                    u.forwarded = True
                    continue
                if answer is craq.Answer.SEND_WHOLE_CHUNK:
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
            if not u.result.status or u.result.status == IoStatus.OK:
                u.result = result_of(IoStatus.FORWARD_FAILED, "successor did not acknowledge in time")
        return todo

    async def _wait_routing(self, timeout_s: float) -> None:
        self.state.routing_changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.state.routing_changed.wait(), timeout_s)

    # ---- write (replicas) ----

    def _check_forwarded(self, n: int, cu: ChunkUpdate) -> UpdateKey | None:
        """A forwarded update's shape (before any work); its id."""
        what = f"updates[{n}]"
        check_chunk_id(*cu.key)
        kind = cu.kind
        if kind is not UpdateKind.REMOVE:
            if not 0 < cu.chunk_size <= MAX_CHUNK_SIZE_BYTES:
                raise InvalidRequest(f"{what}: chunk_size_bytes {cu.chunk_size} must be in 1..{MAX_CHUNK_SIZE_BYTES}")
            end = cu.offset + (cu.length if kind is UpdateKind.WRITE else 0)
            if max(end, cu.length) > cu.chunk_size:
                raise InvalidRequest(
                    f"{what}: offset {cu.offset} + length {cu.length} is past the chunk size {cu.chunk_size}"
                )
        if cu.version <= 0:
            raise InvalidRequest(f"{what}: update_version must be positive")
        if cu.data is not None and len(cu.data) != cu.length:
            raise InvalidRequest(f"{what}: inline data has {len(cu.data)} bytes, length says {cu.length}")
        if kind is UpdateKind.WRITE and cu.data is None and cu.transfer is None and cu.length:
            raise InvalidRequest(f"{what}: a write without data")
        self.state.check_count("recent_updates", len(cu.records))
        return None if cu.update_id is None else check_update_id(what, *cu.update_id)

    def _check_forward_call(self, updates: Sequence[ChunkUpdate]) -> list[UpdateKey | None]:
        self.state.check_count("updates", len(updates))
        checked = [self._check_forwarded(n, cu) for n, cu in enumerate(updates)]
        total = sum(cu.length for cu in updates if cu.kind is UpdateKind.WRITE)
        if total > self.state.config.max_batch_bytes:
            raise TooCostly(f"updates of {total} bytes in one call: the limit is {self.state.config.max_batch_bytes}")
        return checked

    async def _bulk_bytes(self, transfer_id: str, owner: str, attached: Mapping[str, bytearray]) -> bytearray | None:
        """The bytes a TransferRef names: those that came with the call, else pushed ones (waited for a while)."""
        blob = attached.get(transfer_id)
        if blob is not None:
            return blob
        return await self.state.boxes.take(transfer_id, owner, self.state.config.data_wait_s)

    async def forward_updates(
        self,
        updates: Sequence[ChunkUpdate],
        owner: str,
        attached: Mapping[str, bytearray] | None = None,
        from_target: int = 0,
    ) -> list[UpdateResult]:
        """Apply at a replica what its predecessor forwarded (ForwardUpdates) and pass it on; one result per update.

        ``attached``: bytes that came with the call itself, by transfer id (as for ``batch_write``). ``from_target``:
        the sender; copies (``no_forward``) are taken only from a serving target ahead of this one (``_ahead``).

        Raises:
            InvalidRequest: an update is malformed.
            TooCostly: too many updates or bytes in one call.
        """
        ids = self._check_forward_call(updates)
        results = [UpdateResult() for _ in updates]
        groups: dict[int, list[tuple[int, Update]]] = defaultdict(list)
        blobs: dict[str, bytearray | None] = {}
        for n, cu in enumerate(updates):
            target = self.state.target_of_chain(cu.chain_id)
            ahead = not cu.no_forward or (target is not None and self._ahead(target, from_target))
            refused = _status(
                admission.at_replica(self._admission_state(target), cu.chain_id, cu.chain_version, cu.no_forward, ahead)
            )
            if refused is not None:
                results[n] = result_of(*refused)
                continue
            assert target is not None
            data: Payload = b"" if cu.data is None else cu.data
            if cu.transfer is not None:
                tid = cu.transfer.transfer_id
                if tid not in blobs:
                    blobs[tid] = await self._bulk_bytes(tid, owner, attached or {})
                transferred = _transferred(blobs[tid], cu.transfer, cu.length)
                if transferred is None:
                    results[n] = result_of(IoStatus.DATA_TIMEOUT, "bulk data did not arrive")
                    continue
                data = transferred
            is_write = cu.kind is UpdateKind.WRITE
            if is_write and crc32c_of(data) != cu.checksum:
                mismatch = "forwarded data does not match its checksum"
                results[n] = result_of(IoStatus.CHECKSUM_MISMATCH, mismatch)
                continue
            groups[target.target_id].append(
                (
                    n,
                    Update(
                        key=cu.key,
                        kind=cu.kind,
                        chunk_size=cu.chunk_size,
                        offset=cu.offset,
                        data=data,
                        data_checksum=cu.checksum if is_write else None,
                        length=cu.length,
                        full=cu.full,
                        version=cu.version,
                        chain_version=cu.chain_version,
                        update_id=ids[n],
                        records=list(cu.records) if cu.full or cu.records else None,
                        no_forward=cu.no_forward,
                    ),
                )
            )
        await asyncio.gather(
            *(self._replica_updates(self.state.targets[t], [u for _, u in items]) for t, items in groups.items())
        )
        for items in groups.values():
            for n, u in items:
                results[n] = u.result
        return results

    def _ahead(self, target: Target, sender: int) -> bool:
        """Whether target ``sender`` serves ahead of ``target`` in its chain, as this node's routing has it now."""
        pos = self.state.position(target)
        if pos is None:
            return False
        chain, index = pos
        return any(t.target_id == sender and Public(t.public_state) is Public.SERVING for t in chain.targets[:index])

    async def _replica_updates(self, target: Target, updates: list[Update]) -> None:
        """Apply what the predecessor forwarded and pass it on.

        A round started goes on to its end even if the predecessor goes away (``update_to_the_end``).
        """
        for round_ in self._rounds(target, updates):
            await self.state.update_to_the_end(
                target.target_id, [u.key for u in round_], functools.partial(self._replica_round, target, round_)
            )

    def _rounds(self, target: Target, updates: list[Update]) -> list[list[Update]]:
        """``rounds.plan_rounds`` with the chunk contents of one round held to ``max_batch_bytes``."""
        return plan_rounds(updates, functools.partial(content_bytes, target), self.state.config.max_batch_bytes)

    async def _replica_round(self, target: Target, round_: list[Update]) -> None:
        ready = await self._prepared(target, round_, False)
        await self._store_forward_commit(target, [u for u in ready if u.no_forward], forward=False)
        await self._store_forward_commit(target, [u for u in ready if not u.no_forward])


_REFUSAL_STATUS = {
    admission.Refusal.NOT_SERVING: IoStatus.TARGET_NOT_SERVING,
    admission.Refusal.STALE_CHAIN_VERSION: IoStatus.STALE_CHAIN_VERSION,
}


def _not_head(target: Target, updates: Sequence[Update]) -> None:
    """Refuse ``updates`` as a target that is no longer its chain's head (the client retries with fresh routing)."""
    for u in updates:
        u.result = result_of(IoStatus.TARGET_NOT_SERVING, f"target {target.target_id} is no longer its chain's head")


def _status(refusal: tuple[admission.Refusal, str] | None) -> tuple[IoStatus, str] | None:
    return None if refusal is None else (_REFUSAL_STATUS[refusal[0]], refusal[1])


def _transferred(blob: bytearray | None, ref: TransferRef, length: int) -> memoryview | None:
    """An IO's ``length`` bytes at ``ref`` in the bytes that came for it (a view, no copy); None if short or absent."""
    if blob is None or ref.offset + length > len(blob):
        return None
    return memoryview(blob)[ref.offset : ref.offset + length]


def _retrieved(task: asyncio.Future[Any]) -> None:
    """Mark an abandoned task's outcome as seen (no "exception was never retrieved" for a call nobody awaits)."""
    if not task.cancelled():
        task.exception()


def _drop_all(
    engine: ChunkEngine, reserved: list[Pending], updates: list[Update], _job: asyncio.Future[object]
) -> None:
    """Once the thread of an abandoned or failed store-and-commit is done: drop whatever of it is still pending."""
    engine.abort([*reserved, *(u.pending for u in updates if u.pending is not None)])


def _drop_stored(engine: ChunkEngine, reserved: list[Pending], store: asyncio.Future[list[Pending]]) -> None:
    """Once the write thread of an abandoned update is done: drop what it stored (or its reservations)."""
    if store.cancelled() or store.exception() is not None:
        engine.abort(reserved)
    else:
        engine.abort(store.result())
