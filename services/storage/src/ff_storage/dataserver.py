"""The node's bulk data endpoint (wire format in hf3fs.datapath): pushed bytes in, staged read bytes out."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from ff_rpc import Principal, TokenValidator, Unauthenticated
from ff_rpc.auth import CLUSTER_PRINCIPAL, is_cluster_token
from hf3fs.datapath import SOCKET_BUFFER_BYTES, DataPathError, encode_header, read_header

logger = logging.getLogger(__name__)

Buffer = bytes | bytearray | memoryview
MAX_PUSH_BYTES = 1 << 30


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
    _inbox: dict[str, tuple[str, bytes]] = field(default_factory=dict)
    _waiters: dict[str, asyncio.Future[None]] = field(default_factory=dict)
    _outbox: dict[str, _Staged] = field(default_factory=dict)

    def deposit(self, transfer_id: str, owner: str, data: bytes) -> None:
        self._inbox[transfer_id] = (owner, data)
        waiter = self._waiters.pop(transfer_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        self._expire()

    async def take(self, transfer_id: str, owner: str, timeout_s: float) -> bytes | None:
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
    """asyncio TCP server of the data path; every connection authenticates first."""

    def __init__(self, boxes: TransferBoxes, cluster_token: str, validator: TokenValidator | None) -> None:
        self._boxes = boxes
        self._cluster_token = cluster_token
        self._validator = validator
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self._server = await asyncio.start_server(self._serve, host, int(port), limit=1 << 20)
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
            self._server = None

    async def _authenticate(self, token: str) -> Principal:
        if is_cluster_token(token, self._cluster_token):
            return CLUSTER_PRINCIPAL
        if self._validator is None:
            raise Unauthenticated("this node accepts only the cluster token")
        return await self._validator.validate(token)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                import socket

                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            hello = await read_header(reader)
            try:
                if hello.get("op") != "auth":
                    raise Unauthenticated("the first frame must authenticate")
                principal = await self._authenticate(str(hello.get("token", "")))
            except Exception as exc:
                writer.write(encode_header({"ok": False, "error": f"UNAUTHENTICATED: {exc}"}))
                await writer.drain()
                return
            writer.write(encode_header({"ok": True}))
            while True:
                header = await read_header(reader)
                await self._one(header, principal, reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError, DataPathError):
            pass
        except Exception:
            logger.exception("data path connection failed")
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _one(
        self, header: dict[str, object], principal: Principal, reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:  # fmt: skip
        op, tid = header.get("op"), str(header.get("transfer_id", ""))
        if op == "push":
            length = int(str(header.get("length", 0)))
            if not tid or not 0 <= length <= MAX_PUSH_BYTES:
                raise DataPathError("bad push header")
            data = await reader.readexactly(length)
            self._boxes.deposit(tid, principal.name, data)
            writer.write(encode_header({"ok": True}))
        elif op == "pull":
            staged = self._boxes.claim(tid, principal.name)
            if staged is None:
                writer.write(encode_header({"ok": False, "error": f"NOT_FOUND: transfer {tid}"}))
            else:
                writer.writelines([encode_header({"ok": True, "length": staged.length}), *staged.parts])
        else:
            writer.write(encode_header({"ok": False, "error": f"unknown op {op!r}"}))
        await writer.drain()
