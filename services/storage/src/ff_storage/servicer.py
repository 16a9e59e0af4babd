"""Thin gRPC adapters: protobuf in, converted by ``wire`` to the node's types, StorageNode calls, protobuf out.

Errors map in ff_storage.errors.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message

from ff_fsprotocol.capability import CapLayout, ChunkAt, capability_key, check_capability
from ff_fsprotocol.datapath import DataRefused, parse_message
from ff_fsprotocol.layout import file_chains
from ff_rpc import PermissionDenied, current_principal
from ff_rpc.auth import authorize, method_access
from ff_storage.core.errors import InvalidRequest, TargetNotFound
from ff_storage.core.requests import ReadResult
from ff_storage.dataserver import Buffer, CallHandler, SendAnswer
from ff_storage.errors import STATUS_TABLE
from ff_storage.node import StorageNode, Target
from ff_storage.store.disk_space import disk_space
from ff_storage.wire import (
    chunk_meta_pb,
    chunk_updates_from_pb,
    last_chunk_query_from_pb,
    last_chunk_result_pb,
    read_ios_from_pb,
    read_response_pb,
    remove_from_pb,
    repair_from_pb,
    truncate_io_from_pb,
    update_results_pb,
    write_io_from_pb,
)
from fireflyer.mgmtd.v1 import mgmtd_pb2 as mpb
from fireflyer.storage.v1 import storage_pb2 as pb
from fireflyer.storage.v1 import storage_pb2_grpc

# What grpc.aio hands each RPC; the request and response types are the RPC's own, hence Any here.
Context = grpc.aio.ServicerContext[Any, Any]
logger = logging.getLogger(__name__)
DUMP_BATCH = 1000
GRANT_PIECE_BYTES = 1 << 20
READ_STREAM_IN_FLIGHT = 16
READ_STREAM_BYTES = 32 << 20  # bytes one ReadStream may have asked for and not yet had sent (one larger read alone)


def _owner() -> str:
    return current_principal().name


def _read_response(results: list[ReadResult], parts: Sequence[Buffer | None]) -> bytes:
    """A data-path read's serialized BatchReadResponse (its bytes follow it)."""
    total = sum(len(p) for p in parts if p is not None)
    return read_response_pb(results, transfer_length=total).SerializeToString()


class FileChains:
    """A file's chain ids for its capability's layout, over the chain tables of this node's routing.

    Kept per table version: they are the same for every IO of the file.
    """

    def __init__(self, node: StorageNode) -> None:
        self._node = node
        self._kept: dict[tuple[int, int, int, int, int], tuple[int, ...]] = {}

    def __call__(self, layout: CapLayout) -> Sequence[int] | None:
        view = self._node.state.view
        table = view.table(layout.chain_table_id) if view is not None else None
        if table is None or not 1 <= layout.stripe_size <= len(table.chain_ids):
            return None
        key = (table.table_id, table.version, layout.stripe_size, layout.chain_begin, layout.shuffle_seed)
        chains = self._kept.get(key)
        if chains is None:
            if len(self._kept) >= MAX_KEPT_LAYOUTS:
                self._kept.clear()
            chains = self._kept[key] = tuple(
                file_chains(table.chain_ids, layout.chain_begin, layout.stripe_size, layout.shuffle_seed)
            )
        return chains


MAX_KEPT_LAYOUTS = 4096


def _check_capabilities(
    key: bytes, ios: Iterable[pb.WriteIO | pb.ReadIO], *, write: bool, chains_of: FileChains
) -> None:
    """User calls must carry meta's IoCapability for each IO's file; the cluster token and admins need none.

    The chunk must be where the capability's layout puts it, and a write below its limit (``ff_fsprotocol.capability``).
    GrantTransfer needs no check of its own: it hands out only what a checked BatchRead staged for the same
    caller.
    """
    principal = current_principal()
    if principal.is_admin:
        return
    now = time.time_ns()
    for n, io in enumerate(ios):
        index = io.chunk_id.chunk_index
        if isinstance(io, pb.WriteIO):
            chunk = ChunkAt(io.chain_id, index, io.chunk_size_bytes, io.offset_bytes + io.length_bytes)
        else:
            chunk = ChunkAt(io.chain_id, index)
        reason = check_capability(
            key, io.io_capability, io.chunk_id.inode_id, write=write, now_ns=now, chunk=chunk, chains_of=chains_of
        )
        if reason is not None:
            raise PermissionDenied(f"ios[{n}]: {reason}")


def _status_of(exc: Exception, what: str) -> grpc.StatusCode:
    """The status ``exc`` maps to; INTERNAL (logged with its traceback) when it is not a known error."""
    code = STATUS_TABLE.code_for(exc)
    if code is None:
        logger.exception("internal error in %s", what)
        return grpc.StatusCode.INTERNAL
    return code


def _refusal(exc: Exception, what: str) -> DataRefused:
    """The data path's answer for ``exc``: its status, and its message unless it is an internal error.

    An internal error is logged with its traceback; the caller learns no more than a gRPC caller would.
    """
    code = _status_of(exc, what)
    if code is grpc.StatusCode.INTERNAL:
        return DataRefused(code.name, f"internal error in {what}")
    return DataRefused(code.name, str(exc) or type(exc).__name__)


def _target_info(node: StorageNode, t: Target) -> pb.TargetInfo:
    num, used = t.engine.usage()
    space = disk_space(t.record.path)
    return pb.TargetInfo(
        target_id=t.target_id,
        chain_id=t.record.chain_id,
        disk_index=t.record.disk_index,
        path=t.record.path,
        local_state=mpb.LocalTargetState.ValueType(int(t.role.report())),
        public_state=mpb.PublicTargetState.ValueType(int(t.role.public)),
        chain_version=t.role.chain_version,
        used_bytes=used,
        num_chunks=num,
        capacity_bytes=space.capacity_bytes,
        free_bytes=space.free_bytes,
        filesystem_id=space.filesystem_id,
    )


class _StreamBudget:
    """At most ``count`` requests and ``max_bytes`` asked-for bytes held at once.

    A request larger than ``max_bytes`` goes alone (when nothing else is held).
    """

    def __init__(self, count: int, max_bytes: int) -> None:
        self._count, self._max_bytes = count, max_bytes
        self._held, self._bytes = 0, 0
        self._changed = asyncio.Event()

    def _fits(self, cost: int) -> bool:
        return self._held == 0 or (self._held < self._count and self._bytes + cost <= self._max_bytes)

    async def acquire(self, cost: int) -> None:
        while not self._fits(cost):  # one waiter: the stream's pump
            self._changed.clear()
            await self._changed.wait()
        self._held, self._bytes = self._held + 1, self._bytes + cost

    def release(self, cost: int) -> None:
        self._held, self._bytes = self._held - 1, self._bytes - cost
        self._changed.set()


class StorageServicer(storage_pb2_grpc.StorageServiceServicer):
    """StorageService over one ``StorageNode``; also the handlers of the data path's ``read`` and ``call`` ops."""

    def __init__(self, node: StorageNode) -> None:
        self._n = node
        self._cap_key = capability_key(node.state.config.cluster_token)
        self._chains_of = FileChains(node)

    async def BatchWrite(self, request: pb.BatchWriteRequest, context: Context) -> pb.BatchWriteResponse:
        return await self._batch_write(request, {})

    async def _batch_write(
        self, request: pb.BatchWriteRequest, attached: Mapping[str, bytearray]
    ) -> pb.BatchWriteResponse:
        _check_capabilities(self._cap_key, request.ios, write=True, chains_of=self._chains_of)
        ios = [write_io_from_pb(io) for io in request.ios]
        return pb.BatchWriteResponse(
            results=update_results_pb(await self._n.writer.batch_write(ios, _owner(), attached))
        )

    async def BatchRead(self, request: pb.BatchReadRequest, context: Context) -> pb.BatchReadResponse:
        if request.transport not in (pb.DATA_TRANSPORT_UNSPECIFIED, pb.DATA_TRANSPORT_INLINE, pb.DATA_TRANSPORT_BULK):
            raise InvalidRequest(f"transport {request.transport} is unknown")
        _check_capabilities(self._cap_key, request.ios, write=False, chains_of=self._chains_of)
        bulk = request.transport == pb.DATA_TRANSPORT_BULK
        results, tid, length = await self._n.reader.batch_read(read_ios_from_pb(request.ios), bulk=bulk, owner=_owner())
        return read_response_pb(
            results, transfer_id=tid, transfer_length=length, transfer_ttl_s=self._n.state.boxes.ttl_s
        )

    async def read_on_data_path(
        self, request_bytes: memoryview, send: SendAnswer | None = None
    ) -> tuple[bytes, Sequence[Buffer | None], list[memoryview] | None]:
        """A bulk BatchRead sent on the data path (``dataserver.ReadHandler``), with the same checks as BatchRead.

        Returns its response serialized, and each IO's bytes (None unless OK) to deliver after it (nothing
        staged). With ``send``, the worker thread that read the bytes sends both itself; then the response is
        b"" and the third item is what the socket did not take (None: nothing was sent).

        Raises:
            DataRefused: whatever BatchRead would answer with an error status, with that status's name.
            ConnectionError: sending the answer from the read's thread failed (the connection is broken).
        """
        outcome: list[list[memoryview] | OSError] = []

        def deliver(results: list[ReadResult], parts: list[bytes | memoryview | None]) -> None:
            assert send is not None
            try:
                outcome.append(send(_read_response(results, parts), [p for p in parts if p is not None]))
            except OSError as exc:  # after part of the answer went out, or none of it: either way the stream is gone
                outcome.append(exc)

        try:
            try:
                request = parse_message(pb.BatchReadRequest, request_bytes)
            except DecodeError as exc:
                raise InvalidRequest(f"read request does not parse: {exc}") from None
            _check_capabilities(self._cap_key, request.ios, write=False, chains_of=self._chains_of)
            results, parts = await self._n.reader.read_parts(
                read_ios_from_pb(request.ios), bulk=True, deliver=deliver if send is not None else None
            )
        except Exception as exc:
            raise _refusal(exc, "a data-path read") from exc
        if not outcome:
            return _read_response(results, parts), parts, None
        if isinstance(outcome[0], OSError):
            raise ConnectionError(f"sending a read's answer failed: {outcome[0]}") from outcome[0]
        return b"", parts, outcome[0]

    def data_path_calls(self) -> dict[str, CallHandler]:
        """The RPCs the data path's ``call`` op carries (``dataserver.CallHandler``s), by method name.

        The same methods as over gRPC, behind the access their proto declares, refusals with the status gRPC
        would answer; the bytes that came with the call are handed to the method (``attached``), not staged.
        """
        return {
            "BatchWrite": self._data_path_call("BatchWrite", pb.BatchWriteRequest, self._batch_write),
            "ForwardUpdates": self._data_path_call("ForwardUpdates", pb.ForwardUpdatesRequest, self._forward_updates),
        }

    def _data_path_call(
        self,
        name: str,
        request_type: type[Any],
        method: Callable[[Any, Mapping[str, bytearray]], Awaitable[Message]],
    ) -> CallHandler:
        access = method_access(f"/{pb.DESCRIPTOR.services_by_name['StorageService'].full_name}/{name}")

        async def call(request_bytes: memoryview, attached: Mapping[str, bytearray]) -> bytes:
            try:
                if access is not None:
                    authorize(access, current_principal())
                try:
                    request = parse_message(request_type, request_bytes)
                except DecodeError as exc:
                    raise InvalidRequest(f"{name} request does not parse: {exc}") from None
                response = await method(request, attached)
            except Exception as exc:
                raise _refusal(exc, f"a data-path {name}") from exc
            return response.SerializeToString()

        return call

    async def ReadStream(
        self, request_iterator: AsyncIterator[pb.ReadStreamRequest], context: Context
    ) -> AsyncIterator[pb.ReadStreamResponse]:
        """Each request served as BatchRead (the very same checks), concurrently, answered as it is done.

        A request holds its share of the stream's budget (``_StreamBudget``) until its answer is sent, so a caller
        that takes no answer makes the node read ahead a bounded amount, not everything it asked for.
        """
        answers: asyncio.Queue[tuple[pb.ReadStreamResponse, int] | None] = asyncio.Queue()
        tasks: set[asyncio.Task[None]] = set()
        budget = _StreamBudget(READ_STREAM_IN_FLIGHT, READ_STREAM_BYTES)

        async def one(req: pb.ReadStreamRequest, cost: int) -> None:
            try:
                read = await self.BatchRead(req.read, context)
                answer = pb.ReadStreamResponse(request_id=req.request_id, read=read)
            except Exception as exc:
                code = _status_of(exc, "a ReadStream request")
                answer = pb.ReadStreamResponse(
                    request_id=req.request_id, error_code=code.value[0], error_message=str(exc) or type(exc).__name__
                )
            answers.put_nowait((answer, cost))

        async def pump() -> None:
            async for req in request_iterator:
                cost = sum(io.length_bytes for io in req.read.ios)
                await budget.acquire(cost)  # back pressure: the request waits for answers to be taken
                task = asyncio.create_task(one(req, cost))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            await asyncio.gather(*tasks)
            answers.put_nowait(None)

        pumping = asyncio.create_task(pump())
        try:
            while (item := await answers.get()) is not None:
                yield item[0]  # resumes once the answer is sent, so the caller's pace sets the release
                budget.release(item[1])
        finally:
            for task in (pumping, *tasks):
                task.cancel()

    async def GrantTransfer(
        self, request: pb.GrantTransferRequest, context: Context
    ) -> AsyncIterator[pb.GrantTransferResponse]:
        staged = self._n.state.boxes.claim(request.transfer_id, _owner())
        if staged is None:
            raise TargetNotFound(f"transfer {request.transfer_id} is not staged here (or expired)")
        offset = 0
        for part in staged.parts:
            view = memoryview(part)
            for i in range(0, len(view), GRANT_PIECE_BYTES):
                piece = bytes(view[i : i + GRANT_PIECE_BYTES])
                yield pb.GrantTransferResponse(offset_bytes=offset, data=piece)
                offset += len(piece)

    async def TruncateChunks(self, request: pb.TruncateChunksRequest, context: Context) -> pb.TruncateChunksResponse:
        results = await self._n.writer.truncate([truncate_io_from_pb(io) for io in request.ios])
        return pb.TruncateChunksResponse(results=update_results_pb(results))

    async def RemoveChunks(self, request: pb.RemoveChunksRequest, context: Context) -> pb.RemoveChunksResponse:
        removed, more = await self._n.writer.remove(remove_from_pb(request))
        return pb.RemoveChunksResponse(num_removed=removed, has_more=more)

    async def QueryLastChunk(self, request: pb.QueryLastChunkRequest, context: Context) -> pb.QueryLastChunkResponse:
        results = self._n.reader.query_last_all([last_chunk_query_from_pb(q) for q in request.queries])
        return pb.QueryLastChunkResponse(results=[last_chunk_result_pb(r) for r in results])

    async def ForwardUpdates(self, request: pb.ForwardUpdatesRequest, context: Context) -> pb.ForwardUpdatesResponse:
        return await self._forward_updates(request, {})

    async def _forward_updates(
        self, request: pb.ForwardUpdatesRequest, attached: Mapping[str, bytearray]
    ) -> pb.ForwardUpdatesResponse:
        updates = chunk_updates_from_pb(request)
        results = await self._n.writer.forward_updates(updates, _owner(), attached, request.from_target_id)
        return pb.ForwardUpdatesResponse(results=update_results_pb(results))

    async def DumpChunkMeta(
        self, request: pb.DumpChunkMetaRequest, context: Context
    ) -> AsyncIterator[pb.DumpChunkMetaResponse]:
        metas = self._n.recovery.dump_chunk_meta(request.target_id)
        for i in range(0, max(1, len(metas)), DUMP_BATCH):
            yield pb.DumpChunkMetaResponse(chunks=[chunk_meta_pb(m) for m in metas[i : i + DUMP_BATCH]])

    async def CompleteSync(self, request: pb.CompleteSyncRequest, context: Context) -> pb.CompleteSyncResponse:
        self._n.recovery.complete_sync(request.target_id, request.chain_version)
        return pb.CompleteSyncResponse()

    async def RepairChunks(self, request: pb.RepairChunksRequest, context: Context) -> pb.RepairChunksResponse:
        return pb.RepairChunksResponse(
            results=update_results_pb(await self._n.recovery.repair(repair_from_pb(request)))
        )

    async def CreateTarget(self, request: pb.CreateTargetRequest, context: Context) -> pb.CreateTargetResponse:
        target = self._n.state.create_target(request.target_id, request.chain_id, request.disk_index)
        return pb.CreateTargetResponse(target=_target_info(self._n, target))

    async def OfflineTarget(self, request: pb.OfflineTargetRequest, context: Context) -> pb.OfflineTargetResponse:
        return pb.OfflineTargetResponse(target=_target_info(self._n, self._n.state.offline_target(request.target_id)))

    async def ListTargets(self, request: pb.ListTargetsRequest, context: Context) -> pb.ListTargetsResponse:
        return pb.ListTargetsResponse(targets=[_target_info(self._n, t) for t in self._n.state.targets.values()])


_ = grpc
