"""The bulk data path of a storage node: chunk bytes beside gRPC, as 3FS keeps RPC and RDMA apart.

Wire format (one TCP connection carries one operation at a time):

    frame   = u32 big-endian header length, header (JSON object), then ``header["length"]`` raw bytes
    auth    -> {"op": "auth", "token": ...}                  <- {"ok": true} | {"ok": false, "error": ...}
    push    -> {"op": "push", "transfer_id": ..., "length": n} + n bytes   <- {"ok": true}
    pull    -> {"op": "pull", "transfer_id": ...}            <- {"ok": true, "length": n} + n bytes

The first frame of a connection must authenticate (cluster or user token); the node closes the
connection otherwise. A push deposits bytes that a later gRPC write names by transfer id (the node
"pulls" them from its inbox); a pull fetches bytes a gRPC read staged, and pulling is the reader's
permission to send (request-to-send). Both ends use non-blocking sockets on the event loop (no stream
buffers): senders send straight from their buffers, receivers receive straight into one buffer of the
frame's length (no per-piece copies).
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from collections.abc import Sequence
from typing import Any

_LEN = struct.Struct(">I")
MAX_HEADER_BYTES = 64 * 1024
SOCKET_BUFFER_BYTES = 4 * 1024 * 1024
_IOV_MAX = 512


class DataPathError(Exception):
    """The data endpoint refused an operation or the connection broke."""


def encode_header(header: dict[str, Any]) -> bytes:
    body = json.dumps(header, separators=(",", ":")).encode()
    return _LEN.pack(len(body)) + body


def tune_socket(sock: socket.socket) -> None:
    """Large buffers (4 MiB frames), no Nagle delay: both ends of a data-path connection."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER_BYTES)


async def send_parts(sock: socket.socket, parts: Sequence[bytes | bytearray | memoryview]) -> None:
    """Send ``parts`` back to back on a non-blocking socket: one ``sendmsg`` (scatter-gather, no joining)
    while the kernel takes everything, the event loop's ``sock_sendall`` for whatever is left."""
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    while views:
        try:
            sent = sock.sendmsg(views[:_IOV_MAX])
        except (BlockingIOError, InterruptedError):
            sent = 0
        while views and sent >= len(views[0]):
            sent -= len(views[0])
            views.pop(0)
        if views and sent:
            views[0] = views[0][sent:]
        if views and not sent:  # the socket buffer is full: let the loop wait for room, piece by piece
            loop = asyncio.get_running_loop()
            for view in views:
                await loop.sock_sendall(sock, view)
            return


async def recv_exactly(sock: socket.socket, view: memoryview, peer: str) -> None:
    """Fill ``view`` from a non-blocking socket.

    Raises:
        DataPathError: the peer closed the connection first.
    """
    loop = asyncio.get_running_loop()
    got = 0
    while got < len(view):
        n = await loop.sock_recv_into(sock, view[got:])
        if n == 0:
            raise DataPathError(f"{peer} closed the connection")
        got += n


async def recv_header(sock: socket.socket, peer: str) -> dict[str, Any]:
    """One frame header from a non-blocking socket."""
    size_buf = bytearray(_LEN.size)
    await recv_exactly(sock, memoryview(size_buf), peer)
    (size,) = _LEN.unpack(size_buf)
    if size > MAX_HEADER_BYTES:
        raise DataPathError(f"header of {size} bytes is too large")
    body = bytearray(size)
    await recv_exactly(sock, memoryview(body), peer)
    header = json.loads(body)
    if not isinstance(header, dict):
        raise DataPathError("header is not a JSON object")
    return header


class DataConnection:
    """Client side of one data-path connection (asyncio, non-blocking socket, zero-copy sends)."""

    def __init__(self, address: str, token: str) -> None:
        self.address = address
        self._token = token
        self._sock: socket.socket | None = None
        self.lock = asyncio.Lock()

    async def _connect(self) -> socket.socket:
        if self._sock is not None:
            return self._sock
        host, port = self.address.rsplit(":", 1)
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        tune_socket(sock)
        try:
            await loop.sock_connect(sock, (host, int(port)))
            await loop.sock_sendall(sock, encode_header({"op": "auth", "token": self._token}))
            self._sock = sock
            answer = await self._read_header()
        except BaseException:
            sock.close()
            self._sock = None
            raise
        if not answer.get("ok"):
            self.close()
            raise DataPathError(f"data endpoint {self.address} refused the token: {answer.get('error', '')}")
        return sock

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    async def _recv_into(self, view: memoryview) -> None:
        assert self._sock is not None
        await recv_exactly(self._sock, view, f"data endpoint {self.address}")

    async def _read_header(self) -> dict[str, Any]:
        assert self._sock is not None
        return await recv_header(self._sock, f"data endpoint {self.address}")

    async def push(self, transfer_id: str, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        """Deposit ``parts`` (concatenated) at the node under ``transfer_id``."""
        length = sum(len(p) for p in parts)
        async with self.lock:
            try:
                sock = await self._connect()
                header = encode_header({"op": "push", "transfer_id": transfer_id, "length": length})
                await send_parts(sock, [header, *parts])
                answer = await self._read_header()
            except (OSError, DataPathError, asyncio.CancelledError):
                self.close()
                raise
        if not answer.get("ok"):
            raise DataPathError(f"push refused: {answer.get('error', '')}")

    async def pull(self, transfer_id: str, into: Sequence[memoryview]) -> None:
        """Fetch the bytes staged at the node under ``transfer_id`` straight into ``into``, in order.

        The views (caller buffers, reused from read to read) must add up to the transfer's length.
        """
        want = sum(len(v) for v in into)
        async with self.lock:
            try:
                sock = await self._connect()
                await asyncio.get_running_loop().sock_sendall(
                    sock, encode_header({"op": "pull", "transfer_id": transfer_id})
                )
                answer = await self._read_header()
                if not answer.get("ok"):
                    raise DataPathError(f"pull refused: {answer.get('error', '')}")
                if int(answer["length"]) != want:
                    raise DataPathError(f"transfer has {answer['length']} bytes, the read expects {want}")
                for view in into:
                    await self._recv_into(view)
            except (OSError, DataPathError, asyncio.CancelledError):
                self.close()
                raise


class DataConnectionPool:
    """A few connections per node address, so concurrent transfers to one node do not queue."""

    def __init__(self, token: str, per_address: int = 4) -> None:
        self._token = token
        self._per_address = per_address
        self._conns: dict[str, list[DataConnection]] = {}
        self._next: dict[str, int] = {}

    def get(self, address: str) -> DataConnection:
        conns = self._conns.setdefault(address, [])
        for conn in conns:
            if not conn.lock.locked():
                return conn
        if len(conns) < self._per_address:
            conn = DataConnection(address, self._token)
            conns.append(conn)
            return conn
        i = self._next.get(address, 0)
        self._next[address] = i + 1
        return conns[i % len(conns)]

    def close(self) -> None:
        for conns in self._conns.values():
            for conn in conns:
                conn.close()
        self._conns.clear()
