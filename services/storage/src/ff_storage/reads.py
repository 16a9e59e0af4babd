"""The read path (``ChunkReader``): chunk reads from any serving replica, verified against their checksums.

The bytes are staged for the reader's pull on the data path (or inline); a damaged copy asks the head for a
repair (``RepairRequests``: recovery).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from typing import Protocol

from ff_fsprotocol.checksum import crc32c_of
from ff_storage.core.chunks import (
    ChunkKey,
    check_chunk_id,
    check_read_range,
)
from ff_storage.core.errors import ChunkCorrupt, InvalidRequest, TooCostly
from ff_storage.io_stats import READ
from ff_storage.node_state import NodeState, Target
from ff_storage.store.chunk_engine import Pending
from fireflyer.storage.v1 import storage_pb2 as spb

logger = logging.getLogger(__name__)


# Called on the worker thread that read a batch, with its results and each IO's bytes (None unless OK).
Deliver = Callable[[list[spb.ReadResult], list[bytes | memoryview | None]], None]


class RepairRequests(Protocol):
    """What the reader asks of recovery: have the chain's head rewrite damaged chunks from a good copy."""

    async def request_repair(self, target: Target, keys: list[ChunkKey]) -> None:
        """Have the head of ``target``'s chain rewrite ``keys`` from a good copy (best effort, errors logged)."""
        ...


class ChunkReader:
    """Chunk reads of one node's targets (see the module doc)."""

    def __init__(self, state: NodeState, repairs: RepairRequests) -> None:
        self.state, self.repairs = state, repairs

    async def batch_read(
        self, ios: list[spb.ReadIO], transport: int, owner: str
    ) -> tuple[list[spb.ReadResult], str, int]:
        """Read ``ios``; bulk bytes are staged under a new transfer id for the reader's pull (inline: in the results).

        Returns the results, the transfer id ("" when nothing was staged) and its length.
        """
        bulk = transport == spb.DATA_TRANSPORT_BULK
        transfer_id = uuid.uuid4().hex if bulk else ""
        results, found = await self.read_parts(ios, bulk=bulk, transfer_id=transfer_id)
        parts = [p for p in found if p is not None]
        if not parts:
            return results, "", 0
        return results, transfer_id, self.state.boxes.stage(transfer_id, owner, parts)

    async def read_parts(
        self, ios: list[spb.ReadIO], *, bulk: bool, transfer_id: str = "", deliver: Deliver | None = None
    ) -> tuple[list[spb.ReadResult], list[bytes | memoryview | None]]:
        """Read ``ios``: the results, and (``bulk``) each IO's bytes (None unless OK), for the caller to send.

        The bytes are to be laid out back to back in that order at each result's ``transfer`` offset (not
        inline). ``deliver``, if given, is called with both on the worker thread that read them, right after
        (the data path sends them from there: no hop back to the event loop before the reader gets its bytes).
        """
        self._check_reads(ios, bulk)

        def work() -> tuple[list[spb.ReadResult], list[bytes | memoryview | None]]:  # one thread hop per batch
            results, parts = self._lay_out([self._read_counted(io) for io in ios], bulk, transfer_id)
            if deliver is not None:
                deliver(results, parts)
            return results, parts

        return await asyncio.to_thread(work)

    @staticmethod
    def _lay_out(
        found: list[tuple[spb.ReadResult, memoryview | None]], bulk: bool, transfer_id: str
    ) -> tuple[list[spb.ReadResult], list[bytes | memoryview | None]]:
        results: list[spb.ReadResult] = []
        parts: list[bytes | memoryview | None] = []
        offset = 0
        for res, data in found:
            if data is not None and bulk:
                res.transfer.CopyFrom(spb.TransferRef(transfer_id=transfer_id, offset_bytes=offset))
                offset += len(data)
            elif data is not None:
                res.inline_data = bytes(data)
            results.append(res)
            parts.append(data if bulk else None)
        return results, parts

    def _check_reads(self, ios: list[spb.ReadIO], bulk: bool) -> None:
        """Check what a BatchRead may cost, before any work: IOs, bytes in all, no IO asked twice.

        Fewer bytes may go inline, where each is copied into the answer; the same range read again costs again
        and brings nothing.
        """
        self.state.check_count("IOs", len(ios))
        seen: dict[tuple[int, int, int, int, int, bool], int] = {}
        total = 0
        for n, io in enumerate(ios):
            check_chunk_id(io.chunk_id.inode_id, io.chunk_id.chunk_index)
            try:
                check_read_range(io.offset_bytes, io.length_bytes, self.state.config.max_io_bytes)
            except InvalidRequest as exc:
                raise InvalidRequest(f"ios[{n}]: {exc}") from None
            what = (
                io.chain_id,
                io.chunk_id.inode_id,
                io.chunk_id.chunk_index,
                io.offset_bytes,
                io.length_bytes,
                io.relaxed,
            )
            if (first := seen.setdefault(what, n)) != n:
                raise InvalidRequest(f"ios[{n}] asks for the same range as ios[{first}]")
            total += io.length_bytes
        limit = self.state.config.max_read_batch_bytes
        if not bulk:
            limit = min(limit, self.state.config.max_inline_read_bytes)
        if total > limit:
            raise TooCostly(f"reads of {total} bytes in one call{'' if bulk else ' inline'}: the limit is {limit}")

    def _read_counted(self, io: spb.ReadIO) -> tuple[spb.ReadResult, memoryview | None]:
        started = time.perf_counter()
        res, data = self._read_one(io)
        target = self.state.target_of_chain(io.chain_id) if data is not None else None
        if target is not None:
            self.state.io_stats.record(READ, target.target_id, len(data or b""), time.perf_counter() - started)
        return res, data

    def _read_one(self, io: spb.ReadIO) -> tuple[spb.ReadResult, memoryview | None]:
        target = self.state.target_of_chain(io.chain_id)
        if target is None or not target.role.may_read(self.state.lease_ok):
            return spb.ReadResult(status=spb.CHUNK_IO_STATUS_TARGET_NOT_SERVING, message="not serving reads"), None
        if target.role.chain_version != io.chain_version:
            return spb.ReadResult(
                status=spb.CHUNK_IO_STATUS_STALE_CHAIN_VERSION, message=f"chain at version {target.role.chain_version}"
            ), None
        key = (io.chunk_id.inode_id, io.chunk_id.chunk_index)
        meta = target.engine.get(key)
        if meta is None:
            return spb.ReadResult(status=spb.CHUNK_IO_STATUS_CHUNK_NOT_FOUND, message="no such chunk"), None
        if meta.pending_version and not io.relaxed:
            return spb.ReadResult(
                status=spb.CHUNK_IO_STATUS_PENDING_VERSION, message=f"version {meta.pending_version} is pending"
            ), None
        checksum: int | None = None  # of the whole chunk, when already verified
        data: bytes | memoryview
        try:
            # relaxed: the pending version's content if it is stored; a reserved one (nothing written yet) or
            # one committed or dropped since ``get`` reads as the committed version
            got = target.engine.read_pending(key) if meta.pending_version else None
            if got is None and meta.pending_version and _removing(target.engine.pending(key)):
                return spb.ReadResult(status=spb.CHUNK_IO_STATUS_CHUNK_NOT_FOUND, message="pending remove"), None
            if got is not None:
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
            status=spb.CHUNK_IO_STATUS_OK,
            length_bytes=len(piece),
            version=version,
            is_pending=pending,
            checksum=spb.Checksum(type=spb.CHECKSUM_TYPE_CRC32C, value=checksum),
        ), piece

    def _loop_spawn(self, target: Target, key: ChunkKey) -> None:
        loop = self._loop
        loop.call_soon_threadsafe(lambda: self.state.spawn(self.repairs.request_repair(target, [key])))

    _loop: asyncio.AbstractEventLoop

    def bind_loop(self) -> None:
        """Remember the running event loop, so reads on worker threads can start repairs on it (call once, on it)."""
        self._loop = asyncio.get_running_loop()

    def query_last_all(self, queries: list[spb.LastChunkQuery]) -> list[spb.LastChunkResult]:
        """The last chunk of each query's inode range, with the number of chunks in it (QueryLastChunk).

        Raises:
            TooCostly: more queries than ``max_batch_ios``.
            InvalidRequest: a chunk id is out of range.
        """
        self.state.check_count("queries", len(queries))
        for q in queries:
            check_chunk_id(q.inode_id, q.begin_chunk_index)
        return [self._query_last(q) for q in queries]

    def _query_last(self, q: spb.LastChunkQuery) -> spb.LastChunkResult:
        check_chunk_id(q.inode_id, q.begin_chunk_index)
        target = self.state.target_of_chain(q.chain_id)
        if target is None or not target.role.may_read(self.state.lease_ok):
            return spb.LastChunkResult(status=spb.CHUNK_IO_STATUS_TARGET_NOT_SERVING)
        if target.role.chain_version != q.chain_version:
            return spb.LastChunkResult(status=spb.CHUNK_IO_STATUS_STALE_CHAIN_VERSION)
        last, count, pending = target.engine.last_chunk(q.inode_id, q.begin_chunk_index, q.end_chunk_index)
        if last is None:
            return spb.LastChunkResult(status=spb.CHUNK_IO_STATUS_CHUNK_NOT_FOUND)
        status = spb.CHUNK_IO_STATUS_PENDING_VERSION if pending else spb.CHUNK_IO_STATUS_OK
        return spb.LastChunkResult(
            status=status, last_chunk_index=last.chunk_index, last_chunk_length_bytes=last.length, num_chunks=count
        )


def _removing(pending: Pending | None) -> bool:
    """A stored pending version that removes the chunk (not a reservation)."""
    return pending is not None and pending.stored and pending.path is None
