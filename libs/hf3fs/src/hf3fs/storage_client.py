"""Batch chunk I/O across chains: writes to each chain's head, reads from any serving replica.

Routing comes from mgmtd; an IO answered with a stale chain version, a target that no longer serves, or
an unreachable node is retried with fresh routing until ``retry_deadline_s``. Reads verify the checksum
of what they receive, go to another replica on a mismatch, and wait out pending versions (then read
relaxed). Bytes travel on the nodes' bulk data path; a reader lets at most ``max_concurrent_transfers``
nodes send to it at once (3FS request-to-send).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import grpc
from google.protobuf.message import DecodeError

from ff_cluster import MgmtdClient
from ff_fsprotocol.checksum import crc32c_of
from ff_fsprotocol.datapath import DataConnectionPool, DataPathError, DataRefused, parse_message
from ff_fsprotocol.routing import NodeAddress, RoutingCache, RoutingView
from ff_fsprotocol.transport import WriteBytes
from ff_rpc import RpcClient, RpcError
from ff_rpc.client import NO_RETRY, ClientPool
from fireflyer.storage.v1 import storage_pb2 as spb
from fireflyer.storage.v1.storage_client import StorageServiceClient
from hf3fs.readstream import ReadStream

logger = logging.getLogger(__name__)
T = TypeVar("T")

S = spb.ChunkIoStatus
OK = spb.CHUNK_IO_STATUS_OK
# Statuses after which the same IO may succeed with fresh routing or a little later.
RETRY_WRITE = frozenset(
    {
        spb.CHUNK_IO_STATUS_STALE_CHAIN_VERSION,
        spb.CHUNK_IO_STATUS_TARGET_NOT_SERVING,
        spb.CHUNK_IO_STATUS_FORWARD_FAILED,
        spb.CHUNK_IO_STATUS_DATA_TIMEOUT,
        spb.CHUNK_IO_STATUS_UNSPECIFIED,
    }
)
RETRY_READ = frozenset(
    {
        spb.CHUNK_IO_STATUS_STALE_CHAIN_VERSION,
        spb.CHUNK_IO_STATUS_TARGET_NOT_SERVING,
        spb.CHUNK_IO_STATUS_PENDING_VERSION,
        spb.CHUNK_IO_STATUS_CHECKSUM_MISMATCH,
        spb.CHUNK_IO_STATUS_UNSPECIFIED,
    }
)
FATAL_RPC_CODES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)
DEFAULT_MAX_CONCURRENT_TRANSFERS = 64
DEFAULT_READ_CALLS_PER_NODE = 1
MERGED_READ_MAX_BYTES = 64 << 20
# A node's IOs go in calls within the nodes' default cost limits per call (ff_storage's max_batch_ios,
# max_read_batch_bytes, max_batch_bytes); inline reads in answers well under gRPC's 64 MiB message cap
# (the nodes take up to max_inline_read_bytes, 64 MiB, which leaves no room for the rest of the answer).
MAX_CALL_IOS = 4096
MAX_CALL_READ_BYTES = 256 << 20
MAX_CALL_INLINE_READ_BYTES = 32 << 20
MAX_CALL_WRITE_BYTES = 256 << 20


class StorageIoError(Exception):
    """A batch could not be done: a request the nodes refuse outright (bad input, permissions)."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, kw_only=True)
class ChunkWrite:
    """Write ``data`` at ``offset`` of chunk ``chunk_index`` of ``inode_id`` (on chain ``chain_id``)."""

    chain_id: int
    inode_id: int
    chunk_index: int
    data: bytes | bytearray | memoryview
    chunk_size: int
    offset: int = 0
    capability: bytes = b""  # the file's IoCapability from meta (user tokens need it)


@dataclass(frozen=True, kw_only=True)
class ChunkRead:
    """Read ``length`` bytes at ``offset`` of a chunk.

    ``buffer`` (optional, writable, at least ``length`` bytes): the bytes land there and the outcome's
    ``data`` is a view of it. Reusing buffers from read to read (3FS's registered I/O buffers) spares an
    allocation per chunk; without one, each read gets a new buffer.
    """

    chain_id: int
    inode_id: int
    chunk_index: int
    length: int
    offset: int = 0
    relaxed: bool = False
    capability: bytes = b""
    buffer: bytearray | memoryview | None = None


@dataclass
class WriteOutcome:
    """The answer for one chunk write: its status (``ok``), and the chunk's committed version, length and checksum."""

    status: int = spb.CHUNK_IO_STATUS_UNSPECIFIED
    message: str = ""
    committed_version: int = 0
    chunk_length: int = 0
    chunk_checksum: int = 0

    @property
    def ok(self) -> bool:
        """True when the write committed."""
        return self.status == OK


@dataclass
class ReadOutcome:
    """The answer for one chunk read: its status (``ok``), the bytes, their version and the target that served them.

    ``is_pending``: the bytes are a write not yet committed along the chain (a relaxed read may return them).
    """

    status: int = spb.CHUNK_IO_STATUS_UNSPECIFIED
    message: str = ""
    data: bytes | memoryview = b""
    version: int = 0
    is_pending: bool = False
    target_id: int = 0

    @property
    def ok(self) -> bool:
        """True when the read succeeded (``data`` holds the bytes)."""
        return self.status == OK


class RequestToSend:
    """The reader's side of 3FS request-to-send: at most ``limit`` senders at once (a semaphore)."""

    def __init__(self, limit: int = DEFAULT_MAX_CONCURRENT_TRANSFERS) -> None:
        if limit < 1:
            raise ValueError("max_concurrent_transfers must be at least 1")
        self.limit = limit
        self._sem = asyncio.Semaphore(limit)
        self.current = 0
        self.peak = 0

    async def __aenter__(self) -> RequestToSend:
        await self._sem.acquire()
        self.current += 1
        self.peak = max(self.peak, self.current)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.current -= 1
        self._sem.release()


@dataclass
class _ReadState:
    excluded: set[int] = field(default_factory=set)
    pending_rounds: int = 0


@dataclass
class _ReadPart:
    """One batch_read's reads for one node, waiting to go in a BatchRead shared with other callers."""

    view: RoutingView
    ios: Sequence[ChunkRead]
    members: list[tuple[int, int]]
    relaxed: set[int]
    outcomes: list[ReadOutcome]
    done: asyncio.Future[None]


@dataclass
class _NodeReads:
    """BatchReads to one node: ``active`` calls in flight, and the parts that wait for the next one."""

    active: int = 0
    waiting: list[_ReadPart] = field(default_factory=list)


class StorageClient:
    """Chunk I/O against the storage nodes of one cluster."""

    def __init__(
        self,
        mgmtd: MgmtdClient,
        token: str,
        *,
        max_concurrent_transfers: int = DEFAULT_MAX_CONCURRENT_TRANSFERS,
        timeout_s: float = 20.0,
        retry_deadline_s: float = 30.0,
        bulk: bool = True,
        pending_retries: int = 20,
        read_calls_per_node: int = DEFAULT_READ_CALLS_PER_NODE,
        shm: bool = True,
        host_id: str | None = None,
        read_streams: bool = True,
    ) -> None:
        """A client of the storage nodes mgmtd routes to; the options that need a word are for reads.

        ``shm``: pull reads into ``alloc_buffer`` buffers through shared memory from nodes on this host;
        ``host_id``: this host's identity for that (default: the kernel's boot id; tests set another);
        ``read_streams``: send BatchReads on one ReadStream per node (False: one unary call each).
        """
        self.routing = RoutingCache(mgmtd)
        self._mgmtd = mgmtd
        self._rpc = RpcClient(token=token, timeout_s=timeout_s, retry=NO_RETRY)
        self._timeout_s = timeout_s
        self._read_streams = read_streams
        self._streams: dict[str, ReadStream] = {}
        self._clients = ClientPool(StorageServiceClient, self._rpc)  # one channel per address
        self._data = DataConnectionPool(token, host=host_id, shm=shm)
        self.rts = RequestToSend(max_concurrent_transfers)
        self._retry_deadline_s = retry_deadline_s
        self._bulk = bulk
        self._pending_retries = pending_retries
        if read_calls_per_node < 1:
            raise ValueError("read_calls_per_node must be at least 1")
        self._read_calls_per_node = read_calls_per_node
        self._node_reads: dict[int, _NodeReads] = defaultdict(_NodeReads)
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self.client_id = uuid.uuid4().bytes  # with a per-client request id, each write's update id
        self._request_ids = itertools.count(1)
        self.read_calls = 0  # BatchReads sent (fewer than batch_read calls when reads to a node merge)

    async def close(self) -> None:
        """Stops the batching tasks, closes the read streams, the data-path connections and the gRPC channels."""
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for stream in self._streams.values():
            await stream.close()
        self._streams.clear()
        self._data.close()
        await self._clients.close()

    def alloc_buffer(self, nbytes: int) -> memoryview:
        """A read buffer in shared memory (3FS's registered iov), which a node on this host writes reads into itself.

        Reads into it (``ChunkRead.buffer``, or slices of it) are written there by the node, off the socket. Freed
        by ``close``; fine for any node (elsewhere the bytes come over TCP into it).
        """
        return self._data.alloc(nbytes)

    @property
    def data_stats(self) -> dict[str, int]:
        """Pulls (and reads) done over TCP and through shared memory so far, and writes sent as data-path calls."""
        return dict(self._data.stats)

    def client(self, address: str) -> StorageServiceClient:
        """The typed client of the storage node at ``address`` (one channel per address, shared)."""
        return self._clients.get(address)

    # ---- write ----

    async def batch_write(self, ios: Sequence[ChunkWrite]) -> list[WriteOutcome]:
        """Write every IO through its chain; one outcome per IO, in order.

        Raises:
            StorageIoError: the nodes refused the request itself (bad input, token, permission).
        """
        outcomes = [WriteOutcome() for _ in ios]
        # one id per write, the same on every attempt: a node that committed it answers a retry with the
        # original result instead of applying it again (a retry after the head died mid-write, for one)
        ids = [spb.UpdateId(client_id=self.client_id, request_id=next(self._request_ids)) for _ in ios]
        todo = list(range(len(ios)))
        deadline = time.monotonic() + self._retry_deadline_s
        attempt = 0
        while todo:
            view = await (self.routing.refresh(force=True) if attempt else self.routing.get())
            groups: dict[int, list[int]] = defaultdict(list)
            for i in todo:
                head = view.head(ios[i].chain_id)
                node = view.node(head.node_id) if head else None
                if head is None or node is None:
                    outcomes[i] = WriteOutcome(spb.CHUNK_IO_STATUS_TARGET_NOT_SERVING, "chain has no serving head")
                    continue
                groups[head.node_id].append(i)
            calls = [
                (n, part)
                for n, idx in groups.items()
                for part in _split(idx, lambda i: len(ios[i].data), MAX_CALL_WRITE_BYTES)
            ]
            await asyncio.gather(
                *(
                    self._write_group(view, view.nodes[n], [ios[i] for i in idx], [ids[i] for i in idx], idx, outcomes)
                    for n, idx in calls
                )
            )
            todo = [i for i in todo if outcomes[i].status in RETRY_WRITE]
            if not todo or time.monotonic() > deadline:
                break
            attempt += 1
            await asyncio.sleep(min(0.5, 0.02 * 2**attempt) * random.random())
        return outcomes

    async def _write_group(
        self,
        view: RoutingView,
        node: NodeAddress,
        ios: list[ChunkWrite],
        ids: list[spb.UpdateId],
        idx: list[int],
        outcomes: list[WriteOutcome],
    ) -> None:
        requests: list[spb.WriteIO] = []
        payload = WriteBytes.for_payloads([io.data for io in ios], node.data, bulk=self._bulk)
        for io, update_id in zip(ios, ids, strict=True):
            chain = view.chain(io.chain_id)
            msg = spb.WriteIO(
                chain_id=io.chain_id,
                chain_version=chain.version if chain else 0,
                chunk_id=spb.ChunkId(inode_id=io.inode_id, chunk_index=io.chunk_index),
                chunk_size_bytes=io.chunk_size,
                offset_bytes=io.offset,
                length_bytes=len(io.data),
                checksum=spb.Checksum(type=spb.CHECKSUM_TYPE_CRC32C, value=crc32c_of(io.data)),
                io_capability=io.capability,
                update_id=update_id,
            )
            place = payload.place(io.data)
            if place is not None:
                msg.transfer.CopyFrom(spb.TransferRef(transfer_id=place.transfer_id, offset_bytes=place.offset_bytes))
            else:
                msg.inline_data = bytes(io.data)
            requests.append(msg)
        try:
            resp = await self._send_write(node, spb.BatchWriteRequest(ios=requests), payload)
        except (RpcError, DataRefused) as err:
            code = _status_code(err)
            if code in FATAL_RPC_CODES:
                details = err.details if isinstance(err, RpcError) else err.message
                raise StorageIoError(f"BatchWrite refused: {code.name}: {details}", code) from None
            for i in idx:
                outcomes[i] = WriteOutcome(spb.CHUNK_IO_STATUS_TARGET_NOT_SERVING, f"node {node.node_id}: {err}")
            return
        except (OSError, DataPathError, DecodeError) as err:
            for i in idx:
                outcomes[i] = WriteOutcome(spb.CHUNK_IO_STATUS_TARGET_NOT_SERVING, f"data path: {err}")
            return
        for i, r in zip(idx, resp.results, strict=True):
            outcomes[i] = WriteOutcome(
                r.status, r.message, r.committed_version, r.chunk_length_bytes, r.chunk_checksum.value
            )

    async def _send_write(
        self, node: NodeAddress, request: spb.BatchWriteRequest, payload: WriteBytes
    ) -> spb.BatchWriteResponse:
        """The BatchWrite as its transport says (``ff_fsprotocol.transport``): a data-path ``call``, else gRPC."""
        if payload.transport.on_data_path:
            async with asyncio.timeout(self._timeout_s):
                raw = await self._data.call(
                    node.data, "BatchWrite", request.SerializeToString(), payload.transfer_id, payload.parts
                )
            return parse_message(spb.BatchWriteResponse, raw)
        resp: spb.BatchWriteResponse = await self.client(node.grpc).batch_write(request)
        return resp

    # ---- read ----

    async def batch_read(self, ios: Sequence[ChunkRead], *, prefer_target: int = 0) -> list[ReadOutcome]:
        """Read every IO from a serving replica; one outcome per IO, in order.

        Args:
            ios: the chunk ranges to read; one with a ``buffer`` is read into it (writable, at least ``length``).
            prefer_target: read from this target when it serves the IO's chain (tests, repair checks).
        """
        for n, io in enumerate(ios):
            if io.buffer is not None and (len(io.buffer) < io.length or memoryview(io.buffer).readonly):
                raise ValueError(f"ios[{n}]: buffer must be writable and hold {io.length} bytes")
        outcomes = [ReadOutcome() for _ in ios]
        states = [_ReadState() for _ in ios]
        todo = list(range(len(ios)))
        deadline = time.monotonic() + self._retry_deadline_s
        attempt = 0
        while todo:
            view = await (self.routing.refresh(force=True) if attempt else self.routing.get())
            groups: dict[int, list[tuple[int, int]]] = defaultdict(list)
            for i in todo:
                target = self._pick(view, ios[i].chain_id, states[i].excluded, prefer_target)
                if target is None:
                    states[i].excluded.clear()
                    outcomes[i] = ReadOutcome(spb.CHUNK_IO_STATUS_TARGET_NOT_SERVING, "no serving replica")
                    continue
                groups[target[1]].append((i, target[0]))
            relaxed = {i for i in todo if states[i].pending_rounds >= self._pending_retries}
            limit = MAX_CALL_READ_BYTES if self._bulk else MAX_CALL_INLINE_READ_BYTES
            calls = [
                (n, part)
                for n, members in groups.items()
                for part in _split(members, lambda m: ios[m[0]].length, limit)
            ]
            await asyncio.gather(
                *(self._read_node(view, view.nodes[n], ios, members, relaxed, outcomes) for n, members in calls)
            )
            retry = []
            for i in todo:
                status = outcomes[i].status
                if status == spb.CHUNK_IO_STATUS_PENDING_VERSION:
                    states[i].pending_rounds += 1
                elif status in RETRY_READ and outcomes[i].target_id:
                    states[i].excluded.add(outcomes[i].target_id)
                if status in RETRY_READ:
                    retry.append(i)
            todo = retry
            if not todo or time.monotonic() > deadline:
                break
            attempt += 1
            await asyncio.sleep(min(0.2, 0.005 * 2**attempt) * random.random())
        return outcomes

    @staticmethod
    def _pick(view: RoutingView, chain_id: int, excluded: set[int], prefer: int) -> tuple[int, int] | None:
        candidates = [t for t in view.serving(chain_id) if t.target_id not in excluded]
        candidates = [t for t in candidates if (n := view.node(t.node_id)) is not None and n.alive] or candidates
        if not candidates:
            return None
        chosen = next((t for t in candidates if t.target_id == prefer), None) or random.choice(candidates)
        return chosen.target_id, chosen.node_id

    async def _read_node(
        self,
        view: RoutingView,
        node: NodeAddress,
        ios: Sequence[ChunkRead],
        members: list[tuple[int, int]],
        relaxed: set[int],
        outcomes: list[ReadOutcome],
    ) -> None:
        """Read ``members`` from ``node``, batched with other reads to it (one gRPC round trip, one data transfer).

        At once while fewer than ``read_calls_per_node`` BatchReads to it are in flight, else with whatever else
        queues meanwhile, in one call, as a 3FS client batches IOs per storage node.
        """
        queue = self._node_reads[node.node_id]
        if queue.active >= self._read_calls_per_node:
            part = _ReadPart(view, ios, members, relaxed, outcomes, asyncio.get_running_loop().create_future())
            queue.waiting.append(part)
            await part.done
            return
        queue.active += 1
        try:
            await self._read_group(view, node, ios, members, relaxed, outcomes)
        finally:
            self._next_read(node, queue)

    def _next_read(self, node: NodeAddress, queue: _NodeReads) -> None:
        """A call to ``node`` ended: send what waits (up to ``MERGED_READ_MAX_BYTES``) or free the slot."""
        if self._closed:  # nothing more goes out: whoever waits is cancelled
            for part in queue.waiting:
                part.done.cancel()
            queue.waiting.clear()
        parts: list[_ReadPart] = []
        size = count = 0
        while queue.waiting:
            part = queue.waiting[0]
            more = sum(part.ios[i].length for i, _ in part.members)
            if parts and (size + more > MERGED_READ_MAX_BYTES or count + len(part.members) > MAX_CALL_IOS):
                break
            queue.waiting.pop(0)
            if part.done.done():  # its caller was cancelled
                continue
            parts.append(part)
            size, count = size + more, count + len(part.members)
        if not parts:
            queue.active -= 1
            return
        task = asyncio.get_running_loop().create_task(self._read_merged(node, queue, parts))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _read_merged(self, node: NodeAddress, queue: _NodeReads, parts: list[_ReadPart]) -> None:
        try:
            ios, members, relaxed, slots = _merge(parts)
            outcomes = [ReadOutcome() for _ in ios]
            view = max((p.view for p in parts), key=lambda v: v.version)
            try:
                await self._read_group(view, node, ios, members, relaxed, outcomes)
            except StorageIoError:
                if len(parts) == 1:
                    raise
                for part in parts:  # a refused request: find whose (each part alone)
                    await _settle(
                        part, self._read_group(part.view, node, part.ios, part.members, part.relaxed, part.outcomes)
                    )
                return
            for (part, i), outcome in zip(slots, outcomes, strict=True):
                part.outcomes[i] = outcome
            for part in parts:
                if not part.done.done():
                    part.done.set_result(None)
        except BaseException as exc:
            for part in parts:
                if not part.done.done():
                    part.done.set_exception(exc if isinstance(exc, Exception) else asyncio.CancelledError())
            if not isinstance(exc, Exception):
                raise
        finally:
            self._next_read(node, queue)

    async def _read_group(
        self,
        view: RoutingView,
        node: NodeAddress,
        ios: Sequence[ChunkRead],
        members: list[tuple[int, int]],
        relaxed: set[int],
        outcomes: list[ReadOutcome],
    ) -> None:
        """Read ``members`` from ``node`` in one call; a range asked more than once (merged callers) goes once.

        Nodes refuse repeats; its outcome is copied to the others.
        """
        first: dict[tuple[int, int, int, int, int, bool], int] = {}
        unique: list[tuple[int, int]] = []
        copies: list[tuple[int, int]] = []
        for i, target_id in members:
            io = ios[i]
            what = (io.chain_id, io.inode_id, io.chunk_index, io.offset, io.length, io.relaxed or i in relaxed)
            if what in first:
                copies.append((i, first[what]))
                continue
            first[what] = i
            unique.append((i, target_id))
        await self._read_unique(view, node, ios, unique, relaxed, outcomes)
        for i, source in copies:
            got = outcomes[source]
            outcomes[i] = ReadOutcome(got.status, got.message, got.data, got.version, got.is_pending, got.target_id)
            buf = ios[i].buffer
            if got.ok and buf is not None:
                dest = memoryview(buf)[: len(got.data)]
                dest[:] = got.data
                outcomes[i].data = dest

    async def _read_unique(
        self,
        view: RoutingView,
        node: NodeAddress,
        ios: Sequence[ChunkRead],
        members: list[tuple[int, int]],
        relaxed: set[int],
        outcomes: list[ReadOutcome],
    ) -> None:
        requests = []
        for i, _ in members:
            io = ios[i]
            chain = view.chain(io.chain_id)
            requests.append(
                spb.ReadIO(
                    chain_id=io.chain_id,
                    chain_version=chain.version if chain else 0,
                    chunk_id=spb.ChunkId(inode_id=io.inode_id, chunk_index=io.chunk_index),
                    offset_bytes=io.offset,
                    length_bytes=io.length,
                    relaxed=io.relaxed or i in relaxed,
                    io_capability=io.capability,
                )
            )
        self.read_calls += 1
        bulk = self._bulk and bool(node.data)
        transport = spb.DATA_TRANSPORT_BULK if bulk else spb.DATA_TRANSPORT_INLINE
        request = spb.BatchReadRequest(ios=requests, transport=transport)
        crcs: dict[int, int] = {}
        try:
            if bulk:
                resp, sinks, crcs = await self._read_direct(node, request, ios, members)
            else:
                resp = await self._batch_read_call(node, request)
                sinks = self._sinks(ios, members, resp.results)
        except (RpcError, DataRefused) as err:
            code = _status_code(err)
            if code in FATAL_RPC_CODES:
                details = err.details if isinstance(err, RpcError) else err.message
                raise StorageIoError(f"BatchRead refused: {code.name}: {details}", code) from None
            self._fail(members, outcomes, f"node {node.node_id}: {err}")
            return
        except (OSError, DataPathError) as err:
            self._fail(members, outcomes, f"data path: {err}")
            return
        for (i, target_id), r in zip(members, resp.results, strict=True):
            sink = sinks.get(i, (0, None))[1]
            outcomes[i] = out = self._read_outcome(r, target_id, sink, crcs.get(i))
            buf = ios[i].buffer
            if out.ok and sink is None and buf is not None:  # inline bytes: into the caller's buffer too
                dest = memoryview(buf)[: len(out.data)]
                dest[:] = out.data
                out.data = dest

    async def _read_direct(
        self, node: NodeAddress, request: spb.BatchReadRequest, ios: Sequence[ChunkRead], members: list[tuple[int, int]]
    ) -> tuple[spb.BatchReadResponse, dict[int, tuple[int, memoryview]], dict[int, int]]:
        """The BatchRead as a ``read`` on the data path (one round trip, no gRPC call).

        Returns the response, the sinks the bytes landed in, and each sink's CRC-32C if computed while receiving
        (not through shared memory: the node wrote those).
        """
        got: list[tuple[spb.BatchReadResponse, dict[int, tuple[int, memoryview]], list[int]]] = []

        def layout(raw: bytearray) -> list[memoryview]:
            resp = parse_message(spb.BatchReadResponse, raw)
            sinks = self._sinks(ios, members, resp.results)
            order = sorted(sinks, key=lambda i: sinks[i][0])
            got.append((resp, sinks, order))
            return [sinks[i][1] for i in order]

        into = [memoryview(b)[: ios[i].length] if (b := ios[i].buffer) is not None else None for i, _ in members]
        async with self.rts:  # sending the read is the grant to send
            async with asyncio.timeout(self._timeout_s):  # the node's answer, not the wait for a grant
                _, checksums = await self._data.read(node.data, request.SerializeToString(), layout, into)
        resp, sinks, order = got[0]
        return resp, sinks, dict(zip(order, checksums, strict=True)) if checksums is not None else {}

    async def _batch_read_call(self, node: NodeAddress, request: spb.BatchReadRequest) -> spb.BatchReadResponse:
        if not self._read_streams:
            resp: spb.BatchReadResponse = await self.client(node.grpc).batch_read(request)
            return resp
        stream = self._streams.get(node.grpc)
        if stream is None or stream.broken:
            if stream is not None:
                await stream.close()
            stream = self._streams[node.grpc] = ReadStream(self.client(node.grpc))
        return await stream.read(request, self._timeout_s)

    @staticmethod
    def _sinks(
        ios: Sequence[ChunkRead], members: list[tuple[int, int]], results: Sequence[spb.ReadResult]
    ) -> dict[int, tuple[int, memoryview]]:
        """Where each bulk result's bytes go (its offset in the transfer, a view of its buffer)."""
        sinks: dict[int, tuple[int, memoryview]] = {}
        for (i, _), r in zip(members, results, strict=True):
            if r.status != OK or not r.HasField("transfer"):
                continue
            buf = ios[i].buffer
            view = memoryview(buf) if buf is not None else memoryview(bytearray(r.length_bytes))
            if len(view) < r.length_bytes:
                raise DataPathError(f"node answered {r.length_bytes} bytes for a read of {len(view)}")
            sinks[i] = (r.transfer.offset_bytes, view[: r.length_bytes])
        return sinks

    @staticmethod
    def _fail(members: list[tuple[int, int]], outcomes: list[ReadOutcome], message: str) -> None:
        for i, target_id in members:
            outcomes[i] = ReadOutcome(spb.CHUNK_IO_STATUS_TARGET_NOT_SERVING, message, target_id=target_id)

    @staticmethod
    def _read_outcome(r: spb.ReadResult, target_id: int, sink: memoryview | None, crc: int | None) -> ReadOutcome:
        """``crc``: the bytes' CRC-32C if it was computed as they arrived (else computed here)."""
        if r.status != OK:
            return ReadOutcome(r.status, r.message, target_id=target_id)
        data: bytes | memoryview
        if r.HasField("transfer"):
            if sink is None:
                return ReadOutcome(spb.CHUNK_IO_STATUS_TARGET_NOT_SERVING, "transfer missing", target_id=target_id)
            data = sink
        else:
            data = r.inline_data
        if (crc32c_of(data) if crc is None else crc) != r.checksum.value:
            return ReadOutcome(spb.CHUNK_IO_STATUS_CHECKSUM_MISMATCH, "bytes damaged in transit", target_id=target_id)
        return ReadOutcome(OK, "", data, r.version, r.is_pending, target_id)


def _split(items: list[T], size: Callable[[T], int], max_bytes: int) -> list[list[T]]:
    """``items`` in runs of at most ``MAX_CALL_IOS`` items and ``max_bytes`` (a larger item goes alone)."""
    runs: list[list[T]] = []
    total = 0
    for item in items:
        n = size(item)
        if not runs or len(runs[-1]) >= MAX_CALL_IOS or total + n > max_bytes:
            runs.append([])
            total = 0
        runs[-1].append(item)
        total += n
    return runs


def _status_code(err: RpcError | DataRefused) -> grpc.StatusCode | None:
    if isinstance(err, RpcError):
        return err.code
    return grpc.StatusCode.__members__.get(err.code)


def _merge(
    parts: list[_ReadPart],
) -> tuple[list[ChunkRead], list[tuple[int, int]], set[int], list[tuple[_ReadPart, int]]]:
    """The parts' reads as one group: ios, members, relaxed indexes, and where each read came from."""
    ios: list[ChunkRead] = []
    members: list[tuple[int, int]] = []
    relaxed: set[int] = set()
    slots: list[tuple[_ReadPart, int]] = []
    for part in parts:
        for i, target_id in part.members:
            if i in part.relaxed:
                relaxed.add(len(ios))
            members.append((len(ios), target_id))
            slots.append((part, i))
            ios.append(part.ios[i])
    return ios, members, relaxed, slots


async def _settle(part: _ReadPart, call: Awaitable[None]) -> None:
    """Run ``call`` (the part's reads) and hand its end, result or error, to the part's waiting caller."""
    try:
        await call
    except Exception as exc:
        if not part.done.done():
            part.done.set_exception(exc)
        return
    if not part.done.done():
        part.done.set_result(None)
