"""BatchReads to one storage node over one long-lived ReadStream (a gRPC bidirectional stream).

A unary call costs both ends about as much CPU as moving a few hundred KiB on the data path; a
message on an open stream costs a fraction of that. The stream is opened with the client's token
(checked once, by the same policy as BatchRead; every request then goes through BatchRead's own
checks on the node). Requests carry an id and are answered in any order; a request the node refuses
comes back as an ``RpcError`` for that request only. A broken stream fails what waits on it and is
replaced on the next request.
"""

from __future__ import annotations

import asyncio
import contextlib

import grpc

from ff_rpc import RpcError
from fireflyer.storage.v1 import storage_pb2 as spb
from fireflyer.storage.v1.storage_client import StorageServiceClient


class ReadStream:
    """One ReadStream to one storage node; ``read`` sends a BatchRead on it and awaits its answer (see the module)."""

    def __init__(self, client: StorageServiceClient) -> None:
        self._call = client.read_stream()  # no request iterator: requests are written on the call
        self._waiting: dict[int, asyncio.Future[spb.ReadStreamResponse]] = {}
        self._next_id = 1
        self._write_lock = asyncio.Lock()
        self.broken = False
        self._reader = asyncio.get_running_loop().create_task(self._read_answers())

    async def read(self, request: spb.BatchReadRequest, timeout_s: float) -> spb.BatchReadResponse:
        """One BatchRead on the stream.

        Raises:
            RpcError: the node refused the request (its status), the stream broke, or no answer in time.
        """
        if self.broken:
            raise RpcError(grpc.StatusCode.UNAVAILABLE, "read stream closed")
        request_id = self._next_id
        self._next_id += 1
        answer: asyncio.Future[spb.ReadStreamResponse] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = answer
        try:
            async with self._write_lock:  # grpc.aio allows one write at a time
                await self._call.write(spb.ReadStreamRequest(request_id=request_id, read=request))
            got = await asyncio.wait_for(answer, timeout_s)
        except TimeoutError:
            raise RpcError(grpc.StatusCode.DEADLINE_EXCEEDED, f"no answer on the read stream in {timeout_s}s") from None
        except grpc.aio.AioRpcError as err:
            self._break()
            raise RpcError.from_grpc(err) from None
        except (grpc.aio.UsageError, asyncio.InvalidStateError) as err:
            self._break()
            raise RpcError(grpc.StatusCode.UNAVAILABLE, f"read stream closed: {err}") from None
        finally:
            self._waiting.pop(request_id, None)
        if got.error_code:
            raise RpcError(_code(got.error_code), got.error_message)
        return got.read

    async def _read_answers(self) -> None:
        failure = RpcError(grpc.StatusCode.UNAVAILABLE, "read stream ended")
        try:
            async for got in self._call:
                waiter = self._waiting.get(got.request_id)
                if waiter is not None and not waiter.done():
                    waiter.set_result(got)
        except grpc.aio.AioRpcError as err:
            failure = RpcError.from_grpc(err)
        finally:
            self.broken = True
            for waiter in self._waiting.values():
                if not waiter.done():
                    waiter.set_exception(failure)

    def _break(self) -> None:
        self.broken = True
        self._call.cancel()

    async def close(self) -> None:
        """Ends the stream; reads still waiting on it fail as on a broken stream."""
        self._break()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


def _code(value: int) -> grpc.StatusCode:
    return next((c for c in grpc.StatusCode if c.value[0] == value), grpc.StatusCode.UNKNOWN)
