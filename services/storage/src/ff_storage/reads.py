"""The read path (``ChunkReader``): chunk reads from any serving replica, verified against their checksums.

The bytes are staged for the reader's pull on the data path (or inline); a damaged copy asks the head for a
repair (``RepairRequests``: recovery).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Protocol

from ff_fsprotocol.checksum import crc32c_of
from ff_storage.core.chunks import (
    ChunkKey,
    check_chunk_id,
    check_read_range,
)
from ff_storage.core.errors import ChunkCorrupt, InvalidRequest, TooCostly
from ff_storage.core.requests import LastChunkQuery, LastChunkResult, ReadIO, ReadResult
from ff_storage.core.results import IoStatus
from ff_storage.io_stats import READ
from ff_storage.node_state import NodeState, Target
from ff_storage.store.chunk_engine import Pending

logger = logging.getLogger(__name__)


# Called on the worker thread that read a batch, with its results and each IO's bytes (None unless OK).
Deliver = Callable[[list[ReadResult], list[bytes | memoryview | None]], None]


class RepairRequests(Protocol):
    """What the reader asks of recovery: have the chain's head rewrite damaged chunks from a good copy."""

    async def request_repair(self, target: Target, keys: list[ChunkKey]) -> None:
        """Have the head of ``target``'s chain rewrite ``keys`` from a good copy (best effort, errors logged)."""
        ...


class ChunkReader:
    """Chunk reads of one node's targets (see the module doc)."""

    def __init__(self, state: NodeState, repairs: RepairRequests) -> None:
        self.state, self.repairs = state, repairs

    async def batch_read(self, ios: Sequence[ReadIO], *, bulk: bool, owner: str) -> tuple[list[ReadResult], str, int]:
        """Read ``ios``; ``bulk`` bytes are staged under a new transfer id for the reader's pull (else in the results).

        Returns the results, the transfer id ("" when nothing was staged) and its length.
        """
        results, found = await self.read_parts(ios, bulk=bulk)
        parts = [p for p in found if p is not None]
        if not parts:
            return results, "", 0
        transfer_id = uuid.uuid4().hex
        return results, transfer_id, self.state.boxes.stage(transfer_id, owner, parts)

    async def read_parts(
        self, ios: Sequence[ReadIO], *, bulk: bool, deliver: Deliver | None = None
    ) -> tuple[list[ReadResult], list[bytes | memoryview | None]]:
        """Read ``ios``: the results, and (``bulk``) each IO's bytes (None unless OK), for the caller to send.

        The bytes are to be laid out back to back in that order at each result's ``transfer_offset`` (not
        inline). ``deliver``, if given, is called with both on the worker thread that read them, right after
        (the data path sends them from there: no hop back to the event loop before the reader gets its bytes).
        """
        self._check_reads(ios, bulk)

        def work() -> tuple[list[ReadResult], list[bytes | memoryview | None]]:  # one thread hop per batch
            results, parts = self._lay_out([self._read_counted(io) for io in ios], bulk)
            if deliver is not None:
                deliver(results, parts)
            return results, parts

        return await asyncio.to_thread(work)

    @staticmethod
    def _lay_out(
        found: list[tuple[ReadResult, memoryview | None]], bulk: bool
    ) -> tuple[list[ReadResult], list[bytes | memoryview | None]]:
        results: list[ReadResult] = []
        parts: list[bytes | memoryview | None] = []
        offset = 0
        for res, data in found:
            if data is not None and bulk:
                res.transfer_offset = offset
                offset += len(data)
            elif data is not None:
                res.inline_data = bytes(data)
            results.append(res)
            parts.append(data if bulk else None)
        return results, parts

    def _check_reads(self, ios: Sequence[ReadIO], bulk: bool) -> None:
        """Check what a BatchRead may cost, before any work: IOs, bytes in all, no IO asked twice.

        Fewer bytes may go inline, where each is copied into the answer; the same range read again costs again
        and brings nothing.
        """
        self.state.check_count("IOs", len(ios))
        seen: dict[tuple[int, int, int, int, int, bool], int] = {}
        total = 0
        for n, io in enumerate(ios):
            check_chunk_id(*io.key)
            try:
                check_read_range(io.offset, io.length, self.state.config.max_io_bytes)
            except InvalidRequest as exc:
                raise InvalidRequest(f"ios[{n}]: {exc}") from None
            what = (io.chain_id, *io.key, io.offset, io.length, io.relaxed)
            if (first := seen.setdefault(what, n)) != n:
                raise InvalidRequest(f"ios[{n}] asks for the same range as ios[{first}]")
            total += io.length
        limit = self.state.config.max_read_batch_bytes
        if not bulk:
            limit = min(limit, self.state.config.max_inline_read_bytes)
        if total > limit:
            raise TooCostly(f"reads of {total} bytes in one call{'' if bulk else ' inline'}: the limit is {limit}")

    def _read_counted(self, io: ReadIO) -> tuple[ReadResult, memoryview | None]:
        started = time.perf_counter()
        res, data = self._read_one(io)
        target = self.state.target_of_chain(io.chain_id) if data is not None else None
        if target is not None:
            self.state.io_stats.record(READ, target.target_id, len(data or b""), time.perf_counter() - started)
        return res, data

    def _read_one(self, io: ReadIO) -> tuple[ReadResult, memoryview | None]:
        target = self.state.target_of_chain(io.chain_id)
        if target is None or not target.role.may_read(self.state.lease_ok):
            return _failed(IoStatus.TARGET_NOT_SERVING, "not serving reads")
        if target.role.chain_version != io.chain_version:
            return _failed(IoStatus.STALE_CHAIN_VERSION, f"chain at version {target.role.chain_version}")
        key = io.key
        meta = target.engine.get(key)
        if meta is None:
            return _failed(IoStatus.CHUNK_NOT_FOUND, "no such chunk")
        if meta.pending_version and not io.relaxed:
            return _failed(IoStatus.PENDING_VERSION, f"version {meta.pending_version} is pending")
        checksum: int | None = None  # of the whole chunk, when already verified
        data: bytes | memoryview
        try:
            # relaxed: the pending version's content if it is stored; a reserved one (nothing written yet) or
            # one committed or dropped since ``get`` reads as the committed version
            got = target.engine.read_pending(key) if meta.pending_version else None
            if got is None and meta.pending_version and _removing(target.engine.pending(key)):
                return _failed(IoStatus.CHUNK_NOT_FOUND, "pending remove")
            if got is not None:
                version, data, pending = got[0].version, got[1], True
            else:
                committed = target.engine.map_committed(key)
                if committed is None:
                    return _failed(IoStatus.CHUNK_NOT_FOUND, "no such chunk")
                version, data, pending = committed[0].committed_version, committed[1], False
                checksum = committed[0].checksum  # map_committed verified the bytes against it
        except ChunkCorrupt as exc:
            self._loop_spawn(target, key)
            return _failed(IoStatus.CHECKSUM_MISMATCH, str(exc))
        piece = memoryview(data)[io.offset : io.offset + io.length]
        if checksum is None or len(piece) != len(data):
            checksum = crc32c_of(piece)
        return ReadResult(
            status=IoStatus.OK, length=len(piece), version=version, is_pending=pending, checksum=checksum
        ), piece

    def _loop_spawn(self, target: Target, key: ChunkKey) -> None:
        loop = self._loop
        loop.call_soon_threadsafe(lambda: self.state.spawn(self.repairs.request_repair(target, [key])))

    _loop: asyncio.AbstractEventLoop

    def bind_loop(self) -> None:
        """Remember the running event loop, so reads on worker threads can start repairs on it (call once, on it)."""
        self._loop = asyncio.get_running_loop()

    def query_last_all(self, queries: Sequence[LastChunkQuery]) -> list[LastChunkResult]:
        """The last chunk of each query's inode range, with the number of chunks in it (QueryLastChunk).

        Raises:
            TooCostly: more queries than ``max_batch_ios``.
            InvalidRequest: a chunk id is out of range.
        """
        self.state.check_count("queries", len(queries))
        for q in queries:
            check_chunk_id(q.inode_id, q.begin_index)
        return [self._query_last(q) for q in queries]

    def _query_last(self, q: LastChunkQuery) -> LastChunkResult:
        check_chunk_id(q.inode_id, q.begin_index)
        target = self.state.target_of_chain(q.chain_id)
        if target is None or not target.role.may_read(self.state.lease_ok):
            return LastChunkResult(status=IoStatus.TARGET_NOT_SERVING)
        if target.role.chain_version != q.chain_version:
            return LastChunkResult(status=IoStatus.STALE_CHAIN_VERSION)
        last, count, pending = target.engine.last_chunk(q.inode_id, q.begin_index, q.end_index)
        if last is None:
            return LastChunkResult(status=IoStatus.CHUNK_NOT_FOUND)
        status = IoStatus.PENDING_VERSION if pending else IoStatus.OK
        return LastChunkResult(status=status, last_index=last.chunk_index, last_length=last.length, num_chunks=count)


def _failed(status: IoStatus, message: str) -> tuple[ReadResult, None]:
    """A read that found no bytes to send: its status and why."""
    return ReadResult(status=status, message=message), None


def _removing(pending: Pending | None) -> bool:
    """A stored pending version that removes the chunk (not a reservation)."""
    return pending is not None and pending.stored and pending.path is None
