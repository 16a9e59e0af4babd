"""The node's bulk data endpoint (wire format in hf3fs.datapath): pushed bytes in, staged read bytes out."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from ff_rpc import Principal, TokenValidator, Unauthenticated
from ff_rpc.auth import CLUSTER_PRINCIPAL, is_cluster_token
from hf3fs.datapath import DataPathError, encode_header, recv_exactly, recv_header, send_parts, tune_socket

logger = logging.getLogger(__name__)

Buffer = bytes | bytearray | memoryview
MAX_PUSH_BYTES = 1 << 30
# A push allocates at most this much ahead of the bytes that have arrived (a header alone cannot make
# the node allocate a gigabyte); larger pushes grow their buffer as the bytes come.
PUSH_PREALLOC_BYTES = 64 << 20
PEER = "data client"


@dataclass
class _Staged:
    owner: str
    parts: Sequence[Buffer]
    length: int
    expires_at: float


@dataclass
class TransferBoxes:
    """Inbox (bytes pushed for a coming write) and outbox (bytes a read staged for its reader)."""

    ttl_s: float = 30.0
    _inbox: dict[str, tuple[str, bytearray]] = field(default_factory=dict)
    _waiters: dict[str, asyncio.Future[None]] = field(default_factory=dict)
    _outbox: dict[str, _Staged] = field(default_factory=dict)

    def deposit(self, transfer_id: str, owner: str, data: bytearray) -> None:
        self._inbox[transfer_id] = (owner, data)
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
        item = self._inbox.pop(transfer_id, None)
        if item is None:
            return None
        if owner not in (item[0], CLUSTER_PRINCIPAL.name):
            return None
        return item[1]

    def stage(self, transfer_id: str, owner: str, parts: Sequence[Buffer]) -> int:
        length = sum(len(p) for p in parts)
        self._outbox[transfer_id] = _Staged(owner, parts, length, time.monotonic() + self.ttl_s)
        self._expire()
        return length

    def claim(self, transfer_id: str, owner: str) -> _Staged | None:
        staged = self._outbox.get(transfer_id)
        if staged is None or owner not in (staged.owner, CLUSTER_PRINCIPAL.name):
            return None
        return self._outbox.pop(transfer_id)

    def _expire(self) -> None:
        now = time.monotonic()
        for tid in [t for t, s in self._outbox.items() if s.expires_at < now]:
            del self._outbox[tid]


class DataServer:
    """TCP server of the data path on non-blocking sockets; every connection authenticates first.

    Pushed bytes are received straight into one buffer of the announced length and staged bytes are sent
    straight from the chunk buffers (asyncio streams would copy each 4 MiB frame several times).
    """

    def __init__(self, boxes: TransferBoxes, cluster_token: str, validator: TokenValidator | None) -> None:
        self._boxes = boxes
        self._cluster_token = cluster_token
        self._validator = validator
        self._listener: socket.socket | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    async def start(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        listener = socket.create_server((host, int(port)), backlog=128)
        listener.setblocking(False)
        self._listener = listener
        self.port = listener.getsockname()[1]
        self._spawn(self._accept(listener))

    async def stop(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, _ = await loop.sock_accept(listener)
            except OSError as exc:  # out of file descriptors and the like: keep serving the others
                logger.warning("data path accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            sock.setblocking(False)
            with contextlib.suppress(OSError):
                tune_socket(sock)
            self._spawn(self._serve(sock))

    async def _authenticate(self, token: str) -> Principal:
        if is_cluster_token(token, self._cluster_token):
            return CLUSTER_PRINCIPAL
        if self._validator is None:
            raise Unauthenticated("this node accepts only the cluster token")
        return await self._validator.validate(token)

    async def _serve(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            hello = await recv_header(sock, PEER)
            try:
                if hello.get("op") != "auth":
                    raise Unauthenticated("the first frame must authenticate")
                principal = await self._authenticate(str(hello.get("token", "")))
            except Exception as exc:
                await loop.sock_sendall(sock, encode_header({"ok": False, "error": f"UNAUTHENTICATED: {exc}"}))
                return
            await loop.sock_sendall(sock, encode_header({"ok": True}))
            while True:
                header = await recv_header(sock, PEER)
                await self._one(header, principal, sock)
        except (ConnectionError, DataPathError):
            pass
        except Exception:
            logger.exception("data path connection failed")
        finally:
            sock.close()

    async def _one(self, header: dict[str, object], principal: Principal, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        op, tid = header.get("op"), str(header.get("transfer_id", ""))
        if op == "push":
            length = int(str(header.get("length", 0)))
            if not tid or not 0 <= length <= MAX_PUSH_BYTES:
                raise DataPathError("bad push header")
            data = await _receive_payload(sock, length)
            self._boxes.deposit(tid, principal.name, data)
            await loop.sock_sendall(sock, encode_header({"ok": True}))
        elif op == "pull":
            staged = self._boxes.claim(tid, principal.name)
            if staged is None:
                await loop.sock_sendall(sock, encode_header({"ok": False, "error": f"NOT_FOUND: transfer {tid}"}))
                return
            await send_parts(sock, [encode_header({"ok": True, "length": staged.length}), *staged.parts])
        else:
            await loop.sock_sendall(sock, encode_header({"ok": False, "error": f"unknown op {op!r}"}))


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
