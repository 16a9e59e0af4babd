"""The node's bulk data endpoint (wire format in ff_fsprotocol.datapath): pushed bytes in, staged read bytes out.

Reads are served in one round trip (``read``: BatchRead and its bytes, no gRPC call), and writes too
(``call``: BatchWrite or ForwardUpdates with their bytes, no push and no gRPC call). A request and a call's
bytes are handed to the handler as they were received (a view of the receive buffer; no copy, no inbox).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import mmap
import os
import socket
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from ff_fsprotocol.datapath import (
    CALL_METHODS,
    DATA_PATH_VERSION,
    MAX_READ_REQUEST_BYTES,
    DataPathError,
    DataRefused,
    encode_header,
    recv_exactly,
    recv_header,
    send_parts,
    send_parts_in_thread,
    tune_socket,
    version_refusal,
)
from ff_fsprotocol.shm import host_id, recv_fd
from ff_rpc import Principal, TokenValidator, Unauthenticated
from ff_rpc.auth import CLUSTER_PRINCIPAL, is_cluster_token, set_current_principal

logger = logging.getLogger(__name__)

Buffer = bytes | bytearray | memoryview
MAX_PUSH_BYTES = 1 << 30
# A push allocates at most this much ahead of the bytes that have arrived (a header alone cannot make
# the node allocate a gigabyte); larger pushes grow their buffer as the bytes come.
PUSH_PREALLOC_BYTES = 64 << 20
PEER = "data client"
# Buffers of calls' bulk bytes kept for the next calls (``PayloadBuffers``): a few chunks' worth per node.
PAYLOAD_BUFFERS_BYTES = 64 << 20
MAX_SHARED_REGIONS = 64
# Sends a read's answer (its serialized response, then its bytes) on the connection from the worker thread that
# read the bytes; returns what the socket did not take in time (the event loop sends it). Raises OSError.
SendAnswer = Callable[[bytes, Sequence[Buffer]], list[memoryview]]
# Serves a ``read`` op: a serialized BatchReadRequest in (a view of the receive buffer), the serialized
# response and each IO's bytes (None unless OK) out. Given a ``SendAnswer``, it may send them itself from the
# thread that read the bytes: it then returns what is left to send (else None). Runs with the connection's
# principal as ``ff_rpc.current_principal()``; raises ``DataRefused`` for a request the node refuses, and
# ConnectionError when sending failed.
ReadHandler = Callable[
    [memoryview, SendAnswer | None], Awaitable[tuple[bytes, Sequence[Buffer | None], list[memoryview] | None]]
]
# How long a read's thread waits for a reader to make room for its bytes before leaving the rest to the loop.
SEND_STALL_S = 0.05
# Serves a ``call`` of one storage RPC: its serialized request in (a view of the receive buffer) and the
# call's bulk bytes by transfer id (empty without any: the request's TransferRefs name them), its serialized
# response out. Runs with the connection's principal as ``ff_rpc.current_principal()``; raises
# ``DataRefused`` for a refused call.
CallHandler = Callable[[memoryview, Mapping[str, bytearray]], Awaitable[bytes]]


@dataclass
class _Staged:
    owner: str
    parts: Sequence[Buffer]
    length: int
    expires_at: float


@dataclass
class TransferBoxes:
    """Inbox (bytes pushed for a coming write) and outbox (bytes a read staged for its reader).

    What nobody takes or claims within ``ttl_s`` (a write refused before it looked for its bytes, bytes that came after
    the write gave up waiting, a reader that went away) is dropped at the next deposit or stage. The inbox
    holds at most ``max_owner_bytes`` for one caller, counting bytes still being received (``reserve`` before
    receiving, ``release`` after): more is refused before it is received.
    """

    ttl_s: float = 30.0
    clock: Callable[[], float] = time.monotonic
    max_owner_bytes: int = 1 << 30
    _inbox: dict[str, tuple[str, bytearray, float]] = field(default_factory=dict)
    _held: dict[str, int] = field(default_factory=dict)  # inbox bytes per owner
    _waiters: dict[str, asyncio.Future[None]] = field(default_factory=dict)
    _outbox: dict[str, _Staged] = field(default_factory=dict)

    def reserve(self, owner: str, length: int) -> bool:
        """Hold room for ``length`` bytes of ``owner`` about to be received.

        Returns False (nothing held) if that would take it over ``max_owner_bytes``.
        """
        self._expire()
        if self._held.get(owner, 0) + length > self.max_owner_bytes:
            return False
        self._held[owner] = self._held.get(owner, 0) + length
        return True

    def release(self, owner: str, length: int) -> None:
        """Give back a ``reserve`` (the bytes arrived and are deposited now, or never came)."""
        left = self._held.get(owner, 0) - length
        if left > 0:
            self._held[owner] = left
        else:
            self._held.pop(owner, None)

    def deposit(self, transfer_id: str, owner: str, data: bytearray) -> None:
        """Put bytes ``owner`` pushed under ``transfer_id`` (replacing any there) and wake a write waiting for them."""
        self._pop(transfer_id)
        self._inbox[transfer_id] = (owner, data, self.clock() + self.ttl_s)
        self._held[owner] = self._held.get(owner, 0) + len(data)
        waiter = self._waiters.pop(transfer_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        self._expire()

    async def take(self, transfer_id: str, owner: str, timeout_s: float) -> bytearray | None:
        """The pushed bytes (waiting for them up to ``timeout_s``), or None if they did not come."""
        if transfer_id not in self._inbox:
            waiter = self._waiters.setdefault(transfer_id, asyncio.get_running_loop().create_future())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(waiter), timeout_s)
            self._waiters.pop(transfer_id, None)
        item = self._pop(transfer_id)
        if item is None:
            return None
        if owner not in (item[0], CLUSTER_PRINCIPAL.name):
            return None
        return item[1]

    def discard(self, transfer_id: str) -> None:
        """Drop pushed bytes nobody took."""
        self._pop(transfer_id)

    def _pop(self, transfer_id: str) -> tuple[str, bytearray, float] | None:
        item = self._inbox.pop(transfer_id, None)
        if item is not None:
            self.release(item[0], len(item[1]))
        return item

    def stage(self, transfer_id: str, owner: str, parts: Sequence[Buffer]) -> int:
        """Hold a read's bytes for ``owner`` to pull under ``transfer_id``; returns their length."""
        length = sum(len(p) for p in parts)
        self._outbox[transfer_id] = _Staged(owner, parts, length, self.clock() + self.ttl_s)
        self._expire()
        return length

    def claim(self, transfer_id: str, owner: str) -> _Staged | None:
        """Take staged bytes out; None when there are none or they are another caller's (the cluster may take any)."""
        staged = self._outbox.get(transfer_id)
        if staged is None or owner not in (staged.owner, CLUSTER_PRINCIPAL.name):
            return None
        return self._outbox.pop(transfer_id)

    def _expire(self) -> None:
        now = self.clock()
        for tid in [t for t, s in self._outbox.items() if s.expires_at < now]:
            del self._outbox[tid]
        for tid in [t for t, (_owner, _data, expires_at) in self._inbox.items() if expires_at < now]:
            self._pop(tid)


class DataServer:
    """TCP server of the data path on non-blocking sockets; every connection authenticates first.

    Pushed bytes are received straight into one buffer of the announced length and staged bytes are sent
    straight from the chunk buffers (asyncio streams would copy each 4 MiB frame several times).
    """

    def __init__(
        self,
        boxes: TransferBoxes,
        cluster_token: str,
        validator: TokenValidator | None,
        read: ReadHandler,
        calls: Mapping[str, CallHandler],
    ) -> None:
        """Serve the data path: ``read`` serves the ``read`` op, ``calls`` (by method) the ``call`` op."""
        self._boxes = boxes
        self._read = read
        self._calls = dict(calls)
        if set(self._calls) - CALL_METHODS:
            raise ValueError(f"no call op for {sorted(set(self._calls) - CALL_METHODS)}")
        self._cluster_token = cluster_token
        self._validator = validator
        self.payloads = PayloadBuffers()
        self._listeners: list[socket.socket] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0
        # The same-host endpoint: an abstract AF_UNIX name (no file to clean up), told to same-host clients.
        self.unix_name = f"ff-storage-data-{uuid.uuid4().hex}"
        self.host = host_id()

    async def start(self, address: str, *, shm: bool = True) -> None:
        """Listen on ``address`` (``host:port``, port 0: any) and, with ``shm``, on a same-host AF_UNIX name.

        The bound port is ``port`` afterwards; ``unix_name`` is "" when there is no same-host endpoint.
        """
        host, port = address.rsplit(":", 1)
        listener = socket.create_server((host, int(port)), backlog=128)
        listener.setblocking(False)
        self._listeners.append(listener)
        self.port = listener.getsockname()[1]
        self._spawn(self._accept(listener, local=False))
        if shm and self.host:
            local = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            local.bind("\0" + self.unix_name)
            local.listen(128)
            local.setblocking(False)
            self._listeners.append(local)
            self._spawn(self._accept(local, local=True))
        else:
            self.unix_name = ""

    async def stop(self) -> None:
        """Close every connection and the listeners; calls in flight are cancelled."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for listener in self._listeners:
            listener.close()
        self._listeners.clear()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, listener: socket.socket, *, local: bool) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, _ = await loop.sock_accept(listener)
            except OSError as exc:  # out of file descriptors and the like: keep serving the others
                logger.warning("data path accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            sock.setblocking(False)
            if not local:
                with contextlib.suppress(OSError):
                    tune_socket(sock)
            self._spawn(self._serve(sock, local))

    async def _caller(self, token: str, sock: socket.socket) -> Principal | None:
        """The token's principal, made this connection task's caller.

        None after sending the refusal (the connection then closes).
        """
        try:
            principal = await self._authenticate(token)
        except Exception as exc:
            await _refuse(sock, exc)
            return None
        set_current_principal(principal)  # this connection's task only: the read handler's caller
        return principal

    async def _authenticate(self, token: str) -> Principal:
        if is_cluster_token(token, self._cluster_token):
            return CLUSTER_PRINCIPAL
        if self._validator is None:
            raise Unauthenticated("this node accepts only the cluster token")
        return await self._validator.validate(token)

    async def _handshake(self, sock: socket.socket, local: bool) -> tuple[Principal, str] | None:
        """Read the first frame (the caller and its token) and answer it; None once refused.

        The answer is this node's version and, to a client on this host, the AF_UNIX endpoint. A client of
        another data path version is refused (FAILED_PRECONDITION, naming both versions) before its token is
        looked at.
        """
        hello = await recv_header(sock, PEER)
        token = str(hello.get("token", ""))
        if hello.get("op") != "auth":
            await _refuse(sock, Unauthenticated("the first frame must authenticate"))
            return None
        mismatch = version_refusal(DATA_PATH_VERSION, hello.get("version"), "the client")
        if mismatch is not None:
            await asyncio.get_running_loop().sock_sendall(
                sock, encode_header({"ok": False, "code": "FAILED_PRECONDITION", "error": mismatch})
            )
            return None
        principal = await self._caller(token, sock)
        if principal is None:
            return None
        answer: dict[str, object] = {"ok": True, "host": self.host, "version": DATA_PATH_VERSION}
        if not local and self.unix_name and hello.get("host") == self.host:
            answer["unix"] = self.unix_name
        await asyncio.get_running_loop().sock_sendall(sock, encode_header(answer))
        return principal, token

    async def _serve(self, sock: socket.socket, local: bool) -> None:
        regions = SharedRegions() if local else None
        try:
            caller = await self._handshake(sock, local)
            if caller is None:
                return
            principal, token = caller
            while True:
                header = await recv_header(sock, PEER)
                if header.get("op") in ("read", "call"):
                    # A read or call is authorized here alone (no gRPC call before it): the token is checked
                    # again (cached by the validator), so a revoked or demoted token stops at once.
                    again = await self._caller(token, sock)
                    if again is None:
                        return
                    principal = again
                if regions is not None and header.get("op") in ("map", "pull_shm"):
                    await self._shm_op(header, principal, sock, regions)
                elif regions is not None and header.get("op") == "read" and "places" in header:
                    await self._serve_read(sock, header, regions)
                else:
                    await self._one(header, principal, sock)
        except (ConnectionError, DataPathError):
            pass
        except Exception:
            logger.exception("data path connection failed")
        finally:
            sock.close()
            if regions is not None:
                regions.close()

    async def _shm_op(
        self, header: dict[str, object], principal: Principal, sock: socket.socket, regions: SharedRegions
    ) -> None:
        """``map`` a client's region, or ``pull_shm``: write a staged transfer into mapped regions."""
        if header.get("op") == "map":
            fd = await recv_fd(sock)
            error = regions.add(fd, header.get("region"), header.get("size"))
            await send_parts(sock, [encode_header({"ok": not error, "error": error})])
            return
        tid = str(header.get("transfer_id", ""))
        dests, error = regions.places(header.get("places"))
        staged = self._boxes.claim(tid, principal.name) if not error else None
        if staged is None and not error:
            error = f"NOT_FOUND: transfer {tid}"
        elif staged is not None and staged.length != sum(len(d) for d in dests):
            error = f"INVALID_ARGUMENT: transfer has {staged.length} bytes, places hold {sum(len(d) for d in dests)}"
        if error or staged is None:
            await send_parts(sock, [encode_header({"ok": False, "error": error})])
            return
        scatter(staged.parts, dests)
        del dests
        await send_parts(sock, [encode_header({"ok": True, "length": staged.length})])

    async def _one(self, header: dict[str, object], principal: Principal, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        op, tid = header.get("op"), str(header.get("transfer_id", ""))
        if op == "push":
            length = _int_field(header, "length")
            if not tid or not 0 <= length <= MAX_PUSH_BYTES:
                raise DataPathError("bad push header")
            await self._make_room(sock, principal, length)
            try:
                data = await _receive_payload(sock, length)
            finally:
                self._boxes.release(principal.name, length)
            self._boxes.deposit(tid, principal.name, data)
            await loop.sock_sendall(sock, encode_header({"ok": True}))
        elif op == "pull":
            staged = self._boxes.claim(tid, principal.name)
            if staged is None:
                await loop.sock_sendall(sock, encode_header({"ok": False, "error": f"NOT_FOUND: transfer {tid}"}))
                return
            await send_parts(sock, [encode_header({"ok": True, "length": staged.length}), *staged.parts])
        elif op == "read":
            await self._serve_read(sock, header)
        elif op == "call":
            await self._serve_call(sock, header, principal)
        else:
            await loop.sock_sendall(sock, encode_header({"ok": False, "error": f"unknown op {op!r}"}))

    async def _make_room(self, sock: socket.socket, principal: Principal, length: int) -> None:
        """Hold room for bytes about to be received (the caller releases it), or refuse them.

        They are refused (RESOURCE_EXHAUSTED) if they would take the caller's inbox over its limit; the
        connection then closes (its frame unread).
        """
        if self._boxes.reserve(principal.name, length):
            return
        held = self._boxes.max_owner_bytes
        await asyncio.get_running_loop().sock_sendall(
            sock,
            encode_header(
                {
                    "ok": False,
                    "code": "RESOURCE_EXHAUSTED",
                    "error": f"RESOURCE_EXHAUSTED: {length} more bytes would take {principal.name!r} over the "
                    f"{held} bytes a caller may have waiting on this node",
                }
            ),
        )
        raise DataPathError("inbox limit")

    async def _serve_read(
        self, sock: socket.socket, header: dict[str, object], regions: SharedRegions | None = None
    ) -> None:
        """A ``read``: its bytes follow the response, or (``places``, same host) go into the mapped regions."""
        length = _int_field(header, "length")
        if not 0 < length <= MAX_READ_REQUEST_BYTES:
            raise DataPathError("bad read header")
        request = bytearray(length)
        await recv_exactly(sock, memoryview(request), PEER)
        dests, error = regions.places(header.get("places")) if regions is not None else ([], "")
        try:
            if error:
                raise DataRefused("INVALID_ARGUMENT", error.removeprefix("INVALID_ARGUMENT: "))
            response, found, unsent = await self._read_answered(sock, request, regions is None)
            parts = [p for p in found if p is not None]
            if regions is not None:
                if _peer_gone(sock):  # it gave up (and may have reused the places): write nothing
                    raise ConnectionError("the reader closed its connection before its bytes were ready")
                _place(found, dests)
                parts = []
        except DataRefused as exc:
            await send_parts(sock, [encode_header({"ok": False, "code": exc.code, "error": exc.message})])
            return
        finally:
            del dests
        if unsent is not None:  # the read's thread sent the answer: whatever the socket did not take yet
            await send_parts(sock, unsent)
            return
        answer = {"ok": True, "response": len(response), "length": sum(len(p) for p in parts)}
        await send_parts(sock, [encode_header(answer), response, *parts])

    async def _read_answered(
        self, sock: socket.socket, request: bytearray, send_in_thread: bool
    ) -> tuple[bytes, Sequence[Buffer | None], list[memoryview] | None]:
        """Run the read handler; with ``send_in_thread``, its worker thread sends the answer.

        Cancelled meanwhile (the node stopping), the socket is shut down, which ends a send in that thread at once,
        and the handler is awaited before the cancellation goes on: the caller then closes a socket no thread uses.
        """
        send = functools.partial(_send_answer, sock) if send_in_thread else None
        work = asyncio.ensure_future(self._read(memoryview(request), send))
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            if send is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(BaseException):
                await work
            raise

    async def _serve_call(self, sock: socket.socket, header: dict[str, object], principal: Principal) -> None:
        """Serve a ``call``: the request and its bytes in, the handler's response out.

        All the bytes are read, so the stream stays in step even when the call is refused; they are handed to the
        handler under the call's transfer id (counted against the caller's inbox limit until it is done), in a buffer
        reused from call to call (``PayloadBuffers``: given back once the call is answered or refused).
        """
        size, length = _int_field(header, "request"), _int_field(header, "length")
        tid = str(header.get("transfer_id", ""))
        if not 0 < size <= MAX_READ_REQUEST_BYTES or not 0 <= length <= MAX_PUSH_BYTES or (length and not tid):
            raise DataPathError("bad call header")
        if length:
            await self._make_room(sock, principal, length)
        attached: dict[str, bytearray] = {}
        try:
            request = await _receive_payload(sock, size)
            if length:
                attached[tid] = await self.payloads.receive(sock, length)
            answer = await self._call_answer(sock, header, request, attached)
        finally:
            self._boxes.release(principal.name, length)
            if attached:
                buf = attached.pop(tid)
                self.payloads.give_back(buf)
        await send_parts(sock, answer)

    async def _call_answer(
        self, sock: socket.socket, header: dict[str, object], request: bytearray, attached: Mapping[str, bytearray]
    ) -> list[bytes]:
        """The handler's answer to a received ``call`` (or its refusal), as the parts to send."""
        handler = self._calls.get(str(header.get("method", "")))
        try:
            if handler is None:
                raise DataRefused("UNIMPLEMENTED", f"no call op for method {header.get('method')!r}")
            response = await _unless_caller_leaves(sock, handler(memoryview(request), attached))
        except DataRefused as exc:
            return [encode_header({"ok": False, "code": exc.code, "error": exc.message})]
        return [encode_header({"ok": True, "response": len(response)}), response]


async def _unless_caller_leaves(sock: socket.socket, work: Awaitable[bytes]) -> bytes:
    """Run a call's ``work`` while watching its connection, cancelling the work if the caller gives up.

    If the caller closes it (timeout, cancel) or sends anything before the answer, the work is cancelled, as
    gRPC cancels a handler whose deadline passed, and the connection closes.
    """
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(loop.sock_recv(sock, 1))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            raise ConnectionError("the caller left before its call was answered")
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError, OSError):
            await watch
        if watch.done() and not watch.cancelled() and watch.exception() is None:
            raise DataPathError("the caller sent bytes before its call was answered")
    return task.result()


async def _refuse(sock: socket.socket, exc: BaseException) -> None:
    """Tell the client why its token was not taken.

    UNAUTHENTICATED (or the validator's own status), or UNAVAILABLE when it could not be checked (mgmtd
    unreachable), which the client retries elsewhere.
    """
    status = getattr(exc, "code", None)
    code = status.name if isinstance(status, grpc.StatusCode) else "UNAVAILABLE"
    await asyncio.get_running_loop().sock_sendall(
        sock, encode_header({"ok": False, "code": code, "error": f"{code}: {exc}"})
    )


def _send_answer(sock: socket.socket, response: bytes, parts: Sequence[Buffer]) -> list[memoryview]:
    """A ``SendAnswer`` on ``sock``: the answer's header, the response and the bytes, from the calling thread."""
    answer = {"ok": True, "response": len(response), "length": sum(len(p) for p in parts)}
    return send_parts_in_thread(sock, [encode_header(answer), response, *parts], SEND_STALL_S)


def _int_field(header: dict[str, object], name: str) -> int:
    try:
        return int(str(header.get(name, 0)))
    except ValueError:
        raise DataPathError(f"bad {name} in the header") from None


def _peer_gone(sock: socket.socket) -> bool:
    """Whether the client closed its end (a reader that timed out): its shared memory must not be written."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True


def _place(found: Sequence[Buffer | None], dests: Sequence[memoryview]) -> None:
    """Copy each IO's bytes to the start of its place (one place per IO).

    Raises:
        DataRefused: the places do not match the IOs.
    """
    if len(dests) != len(found):
        raise DataRefused("INVALID_ARGUMENT", f"{len(dests)} places for {len(found)} reads")
    for n, (part, dest) in enumerate(zip(found, dests, strict=True)):
        if part is not None and len(part) > len(dest):
            raise DataRefused("INVALID_ARGUMENT", f"place {n} holds {len(dest)} bytes, the read has {len(part)}")
    for part, dest in zip(found, dests, strict=True):
        if part is not None:
            dest[: len(part)] = part


class PayloadBuffers:
    """Buffers for the bulk bytes of calls, given back after each call and reused by the next of that size.

    A new 4 MiB bytearray costs a memset of its 4 MiB and, often, page faults on fresh memory (about a tenth of a
    replica's CPU per written MiB); a stream of calls of one size reuses a few buffers instead. At most
    ``max_bytes`` wait here. A buffer is taken back only when nothing from its call still refers to it: work may
    outlive its call (a round at the head goes on after its caller left) and hold views of the bytes; a live view
    (an export: the bytearray cannot be resized then) or another reference to the bytearray keeps it out.
    """

    def __init__(self, max_bytes: int = PAYLOAD_BUFFERS_BYTES) -> None:
        self.max_bytes = max_bytes
        self._free: dict[int, list[bytearray]] = {}
        self._held = 0

    async def receive(self, sock: socket.socket, length: int) -> bytearray:
        """``length`` bytes from ``sock``, in a waiting buffer of that size if there is one."""
        if length > PUSH_PREALLOC_BYTES:
            return await _receive_payload(sock, length)
        free = self._free.get(length)
        if free:
            buf = free.pop()
            self._held -= length
        else:
            buf = bytearray(length)
        with memoryview(buf) as view:
            await recv_exactly(sock, view, PEER)
        return buf

    def give_back(self, buf: bytearray) -> None:
        """Keep ``buf`` for a later call, unless something still refers to it or enough wait already.

        The caller holds one reference (its variable) and passes it: getrefcount sees 3 (with its own argument).
        """
        if sys.getrefcount(buf) > 3 or not buf or self._held + len(buf) > self.max_bytes or _exported(buf):
            return
        self._free.setdefault(len(buf), []).append(buf)
        self._held += len(buf)

    @property
    def held_bytes(self) -> int:
        """Bytes of the buffers waiting here."""
        return self._held


def _exported(buf: bytearray) -> bool:
    """Whether a view of the (non-empty) ``buf`` is alive."""
    try:
        last = buf.pop()  # a bytearray with exports cannot shrink; without, this is a size change in place
    except BufferError:
        return True
    buf.append(last)
    return False


async def _receive_payload(sock: socket.socket, length: int) -> bytearray:
    """``length`` bytes into one buffer, allocated at most ``PUSH_PREALLOC_BYTES`` ahead of what came."""
    data = bytearray(min(length, PUSH_PREALLOC_BYTES))
    got = 0
    while True:
        with memoryview(data) as view:
            await recv_exactly(sock, view[got:], PEER)
        got = len(data)
        if got == length:
            return data
        data.extend(bytes(min(got, length - got)))  # doubling: a few copies, only for very large pushes


class SharedRegions:
    """The shared-memory regions one same-host client mapped on its AF_UNIX connection (unmapped with it)."""

    def __init__(self) -> None:
        self._maps: dict[int, mmap.mmap] = {}

    def add(self, fd: int, region: object, size: object) -> str:
        """Map the client's ``fd`` as ``region``; an error message, or "" when mapped."""
        try:
            if not isinstance(region, int) or not isinstance(size, int) or size <= 0:
                return "INVALID_ARGUMENT: map needs an integer region and a positive size"
            if region not in self._maps and len(self._maps) >= MAX_SHARED_REGIONS:
                return f"RESOURCE_EXHAUSTED: at most {MAX_SHARED_REGIONS} regions per connection"
            if os.fstat(fd).st_size < size:
                return "INVALID_ARGUMENT: the region is smaller than its size"
            old = self._maps.pop(region, None)
            if old is not None:
                old.close()
            self._maps[region] = mmap.mmap(fd, size)
            return ""
        except (OSError, ValueError) as exc:
            return f"INVALID_ARGUMENT: cannot map the region: {exc}"
        finally:
            os.close(fd)

    def places(self, raw: object) -> tuple[list[memoryview], str]:
        """Views of the mapped regions for ``[[region, offset, length], ...]``, or an error message."""
        if not isinstance(raw, list) or not raw:
            return [], "INVALID_ARGUMENT: places must be a non-empty list"
        views: list[memoryview] = []
        for place in raw:
            if not (isinstance(place, list) and len(place) == 3 and all(isinstance(x, int) for x in place)):
                return [], "INVALID_ARGUMENT: a place is [region, offset, length]"
            region, offset, length = place
            mapped = self._maps.get(region)
            if mapped is None:
                return [], f"INVALID_ARGUMENT: region {region} is not mapped"
            if offset < 0 or length < 0 or offset + length > len(mapped):
                return [], f"INVALID_ARGUMENT: place {place} is outside region {region}"
            views.append(memoryview(mapped)[offset : offset + length])
        return views, ""

    def close(self) -> None:
        """Unmap every region (one a view still points into stays mapped until the view goes)."""
        for mapped in self._maps.values():
            with contextlib.suppress(BufferError):
                mapped.close()
        self._maps.clear()


def scatter(parts: Sequence[Buffer], dests: Sequence[memoryview]) -> None:
    """Copy the concatenation of ``parts`` into the concatenation of ``dests`` (equal total lengths)."""
    di, doff = 0, 0
    for part in parts:
        src = memoryview(part).cast("B")
        while len(src):
            dest = dests[di]
            n = min(len(src), len(dest) - doff)
            dest[doff : doff + n] = src[:n]
            src, doff = src[n:], doff + n
            if doff == len(dest):
                di, doff = di + 1, 0
