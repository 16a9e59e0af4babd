"""Unary calls beside gRPC: the same services, the same policy, over a plain framed TCP stream.

A grpc.aio unary round trip costs ~0.9 ms of two Python processes on this kind of machine, a plain asyncio stream
round trip ~0.1 ms; a metadata call does ~0.2 ms of work. 3FS keeps its RPC framework lean for the same reason.
A server started with a fast address (``ServerOptions.fast_address``) also serves every unary method of its services
there, each call through the very interceptor its gRPC calls go through (``ServicePolicyInterceptor``: request id,
token, ``ff-act-as``, the method's access, malformed requests, the status table, metrics, logs), so what a caller
may do does not depend on the transport. Clients use it where the server registered a ``fast`` endpoint
(``ChannelInvoker``'s ``fast``); streams stay on gRPC.

Wire format, one call at a time per connection, both directions the same frame::

    frame = u32 big-endian header length, u32 body length, header (JSON object), body
    call   -> {"m": "/package.Service/Method", "md": [[key, value], ...], "t": seconds or null} + request bytes
    answer <- {"c": status code name, "d": details, "md": [[key, value], ...]} + response bytes (when "c" is "OK")

What a peer may hold before any token is checked (authentication is per call) is bounded: a header over
``MAX_HEADER_BYTES`` or a body over the server's ``max_request_bytes``, or past the bytes all connections may be
receiving at once (``RECEIVE_BUDGET_BYTES``), is answered RESOURCE_EXHAUSTED and the connection closed unread; a
frame that does not parse closes it; a frame begun must arrive whole, and its answer be taken, within ``FRAME_S``;
a connection idle for ``IDLE_S`` is closed, and past ``MAX_CONNECTIONS`` new ones are. Metadata is taken as gRPC takes
it (keys lowercased, text only); a deadline is a finite number of seconds. A server that is stopping answers a call
that arrives UNAVAILABLE as not run, lets the calls in flight end within its grace, and closes idle connections.

A client that loses its connection before the call was sent raises UNAVAILABLE "failed to connect to all
addresses" (it never ran: ``ff_rpc.retry`` may send it elsewhere), after it was sent UNAVAILABLE "connection lost"
(it may have run: only an idempotent call is retried). It does not reuse a connection idle for ``CLIENT_IDLE_S``
(the server closes idle ones later), and gives a connect ``FAST_CONNECT_S`` at most.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import socket
import struct
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import grpc

from ff_rpc.errors import RpcError

logger = logging.getLogger(__name__)

_FRAME = struct.Struct(">II")
MAX_HEADER_BYTES = 64 << 10
MAX_ANSWER_BYTES = 1 << 30  # what a client takes (the server's own limit on requests is its max_request_bytes)
IDLE_PER_ADDRESS = 16  # connections a client keeps open per address between calls
# The server's bounds on what a peer may hold before any token is checked (authentication is per call):
MAX_CONNECTIONS = 256  # open connections; more are closed at once
IDLE_S = 300.0  # a connection with no call begun for this long is closed
FRAME_S = 10.0  # a frame begun must arrive whole, and an answer be taken, within this
RECEIVE_BUDGET_BYTES = 256 << 20  # request bodies being received at once, over all connections
MAX_DEADLINE_S = 24 * 3600.0
# A client does not reuse a connection idle for longer than this (well before the server's IDLE_S closes it).
CLIENT_IDLE_S = 60.0
FAST_CONNECT_S = 1.0  # a client's connect attempt (then the call goes over gRPC)
_TEXT_KEY = re.compile(r"[0-9a-z_.\-]+")  # a metadata key gRPC takes, lowercased (fullmatch)

_EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
Metadata = Sequence[tuple[str, str]]
# A handler lookup (the generic handlers' ``service``), and the policy's ``intercept_service`` over one
Lookup = Callable[[grpc.HandlerCallDetails], Awaitable[Any]]
Intercept = Callable[[Lookup, grpc.HandlerCallDetails], Awaitable[Any]]


class FrameError(Exception):
    """A frame that cannot be read: its sizes over the limits, or its header not a JSON object."""

    def __init__(self, message: str, code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT) -> None:
        super().__init__(message)
        self.code = code


def encode(header: Mapping[str, Any], body: bytes = b"") -> bytes:
    """One frame."""
    head = json.dumps(header, separators=(",", ":")).encode()
    return _FRAME.pack(len(head), len(body)) + head + body


def _status_frame(code: str, details: str, trailing: Sequence[tuple[str, str]] = (), body: bytes = b"") -> bytes:
    """A server's answer frame: its status code's name, details and trailing metadata, then the response's bytes."""
    return encode({"c": code, "d": details, "md": [list(p) for p in trailing]}, body)


async def read_frame(
    reader: asyncio.StreamReader,
    max_body: int,
    *,
    idle_s: float | None = None,
    frame_s: float | None = None,
    budget: _Budget | None = None,
) -> tuple[dict[str, Any], bytes] | None:
    """The next frame (header, body); None at a clean end of stream, or when none begins within ``idle_s``.

    Once its first byte came, the frame must arrive whole within ``frame_s``; its body is received within
    ``budget`` (refused when the bodies being received would pass it).

    Raises:
        FrameError: a size over ``MAX_HEADER_BYTES`` or ``max_body``, or over the budget (RESOURCE_EXHAUSTED), a header
            that is not a JSON object (INVALID_ARGUMENT).
        asyncio.IncompleteReadError, ConnectionError, TimeoutError: the stream ended or stalled inside a frame.
    """
    try:
        async with asyncio.timeout(idle_s):
            first = await reader.readexactly(1)
    except asyncio.IncompleteReadError:
        return None
    except TimeoutError:
        return None
    async with asyncio.timeout(frame_s):
        return await _rest_of_frame(reader, first, max_body, budget)


async def _rest_of_frame(
    reader: asyncio.StreamReader, first: bytes, max_body: int, budget: _Budget | None
) -> tuple[dict[str, Any], bytes]:
    sizes = first + await reader.readexactly(_FRAME.size - 1)
    head_len, body_len = _FRAME.unpack(sizes)
    if head_len > MAX_HEADER_BYTES:
        raise FrameError(
            f"header of {head_len} bytes: the limit is {MAX_HEADER_BYTES}", grpc.StatusCode.RESOURCE_EXHAUSTED
        )
    if body_len > max_body:
        raise FrameError(f"message of {body_len} bytes: the limit is {max_body}", _EXHAUSTED)
    head = await reader.readexactly(head_len)
    if budget is not None and not budget.take(body_len):
        raise FrameError(f"message of {body_len} bytes: the server is receiving too much at once", _EXHAUSTED)
    try:
        body = await reader.readexactly(body_len) if body_len else b""
    finally:
        if budget is not None:
            budget.give(body_len)
    try:
        header = json.loads(head, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise FrameError(f"header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise FrameError("header is not a JSON object")
    return header, body


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number here")


class _Budget:
    """Bytes of request bodies being received, over all connections."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used = limit, 0

    def take(self, n: int) -> bool:
        if self.used + n > self.limit:
            return False
        self.used += n
        return True

    def give(self, n: int) -> None:
        self.used -= n


def _metadata(value: Any) -> tuple[tuple[str, str], ...]:
    """Call metadata as gRPC takes it: keys lowercased, of [0-9a-z-_.], not binary (-bin); values printable ASCII.

    Plain loops, no generators: every call's metadata passes here (two entries took 2.3 us in a hot loop, now 1.3).
    """
    if not isinstance(value, list):
        raise FrameError("metadata must be a list of [key, value] strings")
    for p in value:  # every entry's shape first, then the keys and values
        if not (isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], str)):
            raise FrameError("metadata must be a list of [key, value] strings")
    out = []
    for k, v in value:
        key = k.lower()  # ASCII only: a non-ASCII letter may lower to an ASCII one (the Kelvin sign to "k")
        if not k.isascii() or _TEXT_KEY.fullmatch(key) is None or key.endswith("-bin"):
            raise FrameError(f"metadata key {k[:64]!r} is not a text metadata key")
        if not (v.isascii() and v.isprintable()):  # printable ASCII: " " to "~"
            raise FrameError(f"metadata {key!r}: its value is not printable ASCII")
        out.append((key, v))
    return tuple(out)


def _deadline(value: Any) -> float | None:
    """A call's deadline in seconds: None, or a finite number in (0, MAX_DEADLINE_S]."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FrameError("the timeout is a number of seconds or null")
    try:
        seconds = float(value)
    except OverflowError:
        raise FrameError("the timeout is out of range") from None
    if not 0 < seconds <= MAX_DEADLINE_S:
        raise FrameError(f"the timeout must be in (0, {MAX_DEADLINE_S:g}] seconds")
    return seconds


# ---- server ----


class _Context:
    """What the policy interceptor and the servicers use of a grpc.aio ServicerContext, for one fast call."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata
        self._code: grpc.StatusCode | None = None
        self.details = ""
        self.trailing: tuple[tuple[str, str], ...] = ()

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    async def abort(
        self, code: grpc.StatusCode, details: str = "", trailing_metadata: Sequence[tuple[str, Any]] = ()
    ) -> None:
        self._code, self.details = code, details
        self.trailing = tuple((str(k), v if isinstance(v, str) else bytes(v).decode()) for k, v in trailing_metadata)
        raise grpc.aio.AbortError()

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def set_details(self, details: str) -> None:
        self.details = details

    def set_trailing_metadata(self, metadata: Sequence[tuple[str, str]]) -> None:
        self.trailing = tuple(metadata)


class _Details(grpc.HandlerCallDetails):
    def __init__(self, method: str, metadata: tuple[tuple[str, str], ...]) -> None:
        self.method = method
        self.invocation_metadata = metadata


class _Collector:
    """Takes the generic handlers a generated ``add_..._to_server`` gives a server."""

    def __init__(self) -> None:
        self.handlers: list[grpc.GenericRpcHandler] = []

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self.handlers += handlers

    def add_registered_method_handlers(self, service: str, handlers: Mapping[str, Any]) -> None:
        self.handlers.append(grpc.method_handlers_generic_handler(service, dict(handlers)))


class FastServer:
    """Serves the unary methods of ``adders`` (generated ``add_X_to_server`` with their servicers) over the fast path.

    ``intercept``: a policy interceptor's ``intercept_service`` (its own instance: it caches the wrapped handlers
    per method and handler, and these are not gRPC's).
    """

    def __init__(
        self, adders: Sequence[tuple[Callable[[Any, Any], None], Any]], intercept: Intercept, max_request_bytes: int
    ) -> None:
        collector = _Collector()
        for add, servicer in adders:
            add(servicer, collector)
        self._handlers = collector.handlers
        self._intercept = intercept
        self._max_request = max_request_bytes
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._busy: set[asyncio.Task[None]] = set()  # connections with a call in flight
        self._budget = _Budget(RECEIVE_BUDGET_BYTES)
        self._stopping = asyncio.Event()
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: a free port); the port bound."""
        self._server = await asyncio.start_server(self._serve, host, port, limit=1 << 20)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self, grace_s: float = 0.0) -> None:
        """Stop taking calls: close idle connections, let calls in flight end within ``grace_s``, then cancel them.

        A call that arrives meanwhile is answered UNAVAILABLE as not run (its client sends it elsewhere).
        """
        self._stopping.set()
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in self._connections - self._busy:
            task.cancel()
        if self._busy and grace_s > 0:
            await asyncio.wait(set(self._busy), timeout=grace_s)
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)

    async def _lookup(self, details: grpc.HandlerCallDetails) -> Any:
        for h in self._handlers:
            handler = h.service(details)
            if handler is not None:
                return handler
        return None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._connections) >= MAX_CONNECTIONS or self._stopping.is_set():
            writer.close()
            return
        self._connections.add(task)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while not self._stopping.is_set():
                try:
                    frame = await read_frame(
                        reader, self._max_request, idle_s=IDLE_S, frame_s=FRAME_S, budget=self._budget
                    )
                except FrameError as exc:
                    await self._answer(writer, _status_frame(exc.code.name, str(exc)))
                    return
                if frame is None:
                    return
                if self._stopping.is_set():  # came while stopping: not run, the client may send it elsewhere
                    stopping = "failed to connect to all addresses (the server is stopping; the call did not run)"
                    await self._answer(writer, _status_frame("UNAVAILABLE", stopping))
                    return
                self._busy.add(task)
                # each call in its own task, so its context (principal, log fields) is its own
                answer = await asyncio.ensure_future(self._call(*frame))
                await self._answer(writer, answer)
                self._busy.discard(task)
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError, asyncio.CancelledError):
            pass
        finally:
            self._connections.discard(task)
            self._busy.discard(task)
            writer.close()

    @staticmethod
    async def _answer(writer: asyncio.StreamWriter, frame: bytes) -> None:
        writer.write(frame)
        async with asyncio.timeout(FRAME_S):  # a client that does not read its answers does not hold the task
            await writer.drain()

    async def _call(self, header: dict[str, Any], body: bytes) -> bytes:
        method = header.get("m")
        try:
            metadata = _metadata(header.get("md", []))
            timeout = _deadline(header.get("t"))
            if not isinstance(method, str):
                raise FrameError("a call names its method (a string)")
        except FrameError as exc:
            return _status_frame(exc.code.name, str(exc))
        context = _Context(metadata)
        try:
            handler = await self._intercept(self._lookup, _Details(method, metadata))
            if handler is None or handler.unary_unary is None:
                return _status_frame("UNIMPLEMENTED", f"no unary method {method} on the fast path")
            request = handler.request_deserializer(body)
            async with asyncio.timeout(timeout):  # this call's own task (see _serve): no task more per call
                response = await handler.unary_unary(request, context)
            payload = handler.response_serializer(response)
        except grpc.aio.AbortError:
            code = context.code() or grpc.StatusCode.UNKNOWN
            return _status_frame(code.name, context.details, context.trailing)
        except TimeoutError:
            return _status_frame("DEADLINE_EXCEEDED", "deadline exceeded")
        except Exception:  # the interceptor answers every error of a call; this is one outside it
            logger.exception("fast path: %s failed outside the policy", method)
            return _status_frame("UNKNOWN", "the call failed outside the service's policy")
        return _status_frame("OK", "", (), payload)


# ---- client ----


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.idle_since = time.monotonic()

    def close(self) -> None:
        self.writer.close()


class FastPool:
    """Connections to fast endpoints, a few kept open per address; one call at a time on each."""

    def __init__(self, idle_per_address: int = IDLE_PER_ADDRESS) -> None:
        self._idle: dict[str, list[_Connection]] = {}
        self._keep = idle_per_address

    async def _connect(self, address: str) -> _Connection:
        idle = self._idle.get(address, [])
        while idle:
            conn = idle.pop()
            fresh = time.monotonic() - conn.idle_since < CLIENT_IDLE_S  # the server closes idle ones after IDLE_S
            if fresh and not conn.reader.at_eof() and not conn.writer.is_closing():  # nor closed by the server
                return conn
            conn.close()
        host, port = address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host.strip("[]"), int(port), limit=1 << 20)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return _Connection(reader, writer)

    async def call(
        self, address: str, method: str, request: bytes, metadata: Metadata, timeout_s: float | None
    ) -> bytes:
        """One call's response bytes.

        Raises:
            RpcError: the server's status; UNAVAILABLE when the connection failed (see the module).
        """
        try:
            async with asyncio.timeout(FAST_CONNECT_S if timeout_s is None else min(timeout_s, FAST_CONNECT_S)):
                conn = await self._connect(address)
        except (OSError, TimeoutError) as exc:
            raise RpcError(
                grpc.StatusCode.UNAVAILABLE, f"failed to connect to all addresses (fast path {address}: {exc})"
            ) from None
        sent = False
        try:
            async with asyncio.timeout(timeout_s):
                conn.writer.write(encode({"m": method, "md": [list(p) for p in metadata], "t": timeout_s}, request))
                await conn.writer.drain()
                sent = True
                frame = await read_frame(conn.reader, MAX_ANSWER_BYTES)
        except TimeoutError:
            conn.close()
            raise RpcError(grpc.StatusCode.DEADLINE_EXCEEDED, f"deadline exceeded (fast path {address})") from None
        except (OSError, asyncio.IncompleteReadError, FrameError) as exc:
            conn.close()
            if not sent:
                raise RpcError(
                    grpc.StatusCode.UNAVAILABLE, f"failed to connect to all addresses (fast path {address}: {exc})"
                ) from None
            raise RpcError(grpc.StatusCode.UNAVAILABLE, f"connection lost (fast path {address}): {exc}") from None
        except BaseException:
            conn.close()
            raise
        if frame is None:
            conn.close()
            raise RpcError(grpc.StatusCode.UNAVAILABLE, f"connection lost (fast path {address}): closed")
        header, body = frame
        idle = self._idle.setdefault(address, [])
        if len(idle) < self._keep:
            conn.idle_since = time.monotonic()
            idle.append(conn)
        else:
            conn.close()
        code = header.get("c")
        if code == "OK":
            return body
        status = grpc.StatusCode[code] if isinstance(code, str) and code in grpc.StatusCode.__members__ else None
        md = {str(k): str(v) for k, v in header.get("md", [])}
        if status is None:
            raise RpcError(grpc.StatusCode.UNKNOWN, f"fast path {address}: unknown status {code!r}", md)
        raise RpcError(status, str(header.get("d", "")), md)

    def close(self) -> None:
        """Close every idle connection."""
        for conns in self._idle.values():
            for c in conns:
                c.close()
        self._idle.clear()
