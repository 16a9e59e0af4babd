"""The bulk data path of a storage node: chunk bytes beside gRPC, as 3FS keeps RPC and RDMA apart.

Wire format (one connection carries one operation at a time):

    frame   = u32 big-endian header length, header (JSON object), then ``header["length"]`` raw bytes
    auth    -> {"op": "auth", "token": ..., "host": boot id, "version": DATA_PATH_VERSION}
            <- {"ok": true, "host": boot id, "version": DATA_PATH_VERSION[, "unix": name]}
             | {"ok": false, "code": gRPC status name, "error": ...}
    push    -> {"op": "push", "transfer_id": ..., "length": n} + n bytes   <- {"ok": true}
    pull    -> {"op": "pull", "transfer_id": ...}            <- {"ok": true, "length": n} + n bytes
    read    -> {"op": "read", "length": k} + k bytes (a serialized BatchReadRequest, bulk)
            <- {"ok": true, "response": r, "length": n} + r bytes (the BatchReadResponse) + n bytes (the OK
               results' bytes, back to back at their ``transfer.offset_bytes``)
             | {"ok": false, "code": gRPC status name, "error": ...} (refused as BatchRead would be)
    call    -> {"op": "call", "method": M, "request": k, "transfer_id": t, "length": n} + k bytes (a serialized
               request of the storage RPC M: BatchWrite or ForwardUpdates) + n bytes (its bulk data, which the
               request's TransferRefs name under t)
            <- {"ok": true, "response": r} + r bytes (M's serialized response)
             | {"ok": false, "code": gRPC status name, "error": ...} (refused as the gRPC call would be)
  on the node's AF_UNIX endpoint only (same host):
    map     -> {"op": "map", "region": id, "size": n} + one byte carrying a memfd (SCM_RIGHTS)  <- {"ok": true}
    pull_shm-> {"op": "pull_shm", "transfer_id": ..., "places": [[region, offset, length], ...]}
            <- {"ok": true, "length": n}, the bytes having been written into the mapped regions
    read    -> as above with "places": one [region, offset, length] per IO
            <- {"ok": true, "response": r, "length": 0} + r bytes, each OK IO's bytes having been written
               at the start of its place

The first frame of a connection must authenticate (cluster or user token); the node closes the
connection otherwise. Both ends name their ``version`` of this protocol (``DATA_PATH_VERSION``) and speak
only their own: every node and client of a release ship together, so a peer of another version is refused
at the handshake (FAILED_PRECONDITION, naming both versions), by the node or by the client, whichever
learns it first. When the client's host id (``ff_fsprotocol.shm.host_id``, the kernel's boot id) is the
node's, the node names its abstract AF_UNIX endpoint in the answer; a client whose read buffers lie in its
shared-memory regions then reads through it (authenticated the same way) and the chunk bytes never touch a
socket. Otherwise, or if that endpoint cannot be reached
(another network namespace), TCP.

A ``read`` is a BatchRead and its bytes in one round trip (no gRPC call, nothing staged): sending it is the
reader's permission to send (request-to-send), and the connection's token is the caller's. A ``call`` is a
write-side RPC and its bytes in one round trip: the node checks the method's declared access and the same
things the gRPC call does, with the connection's token as the caller (checked again on every call), and
hands the call's bytes straight to it. The client (``hf3fs.StorageClient``, a node's forwards) uses these two;
``push`` (bytes a later gRPC write names by transfer id), ``pull`` and ``pull_shm`` (bytes a gRPC bulk
BatchRead staged) serve the gRPC API's bulk transfers, which the storage contract still offers.
Both ends use non-blocking sockets on the event loop (no stream buffers): senders send straight from their
buffers, receivers receive straight into one buffer of the frame's length (no per-piece copies).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import select
import socket
import struct
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar, cast

from google.protobuf.message import Message

from ff_fsprotocol.checksum import crc32c_of
from ff_fsprotocol.shm import ShmRegion, host_id, send_fd

_LEN = struct.Struct(">I")
MAX_HEADER_BYTES = 64 * 1024
SOCKET_BUFFER_BYTES = 4 * 1024 * 1024
_IOV_MAX = 512
# The protocol spoken here; a peer speaking another is refused (every node and client of a release ship together).
# History: 1 push and pull; 2 adds ``read``; 3 adds ``call``; 4 both ends name their version at the handshake.
DATA_PATH_VERSION = 4
MAX_READ_REQUEST_BYTES = 4 * 1024 * 1024  # the serialized request of a ``read`` or a ``call``
CALL_METHODS = frozenset({"BatchWrite", "ForwardUpdates"})  # the storage RPCs a ``call`` may carry
# Refusals after which the node closes the connection (the token failed its check again; an op it does not
# know, whose body it did not read): the client closes its side too instead of reusing it.
CONNECTION_ENDING_CODES = frozenset({"UNAUTHENTICATED", "UNAVAILABLE", "UNKNOWN"})
# Received bytes are checksummed piece by piece, each piece right after it lands (still in the CPU's cache).
CRC_PIECE_BYTES = 512 * 1024
UNIX_PREFIX = "unix:"
Place = tuple[int, int, int]  # region id, offset, length


M = TypeVar("M", bound=Message)


def parse_message(kind: type[M], raw: bytes | bytearray | memoryview) -> M:
    """A ``kind`` parsed straight from the receive buffer ``raw`` (no copy into bytes first).

    protobuf parses any buffer; its type stubs say bytes.
    """
    return kind.FromString(cast(bytes, raw))


class DataPathError(Exception):
    """The data endpoint refused an operation or the connection broke."""


class DataRefused(DataPathError):
    """The node refused the token (at the handshake) or a ``read``; ``code``: a gRPC status name.

    At the handshake the connection is closed; a refused ``read`` is refused as the BatchRead would be, and the
    connection stays usable.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def version_refusal(ours: int, theirs: object, peer: str) -> str | None:
    """Why a peer of data path version ``theirs`` (absent: None) is refused by one of ``ours``; None when equal."""
    if theirs == ours:
        return None
    named = "no version (an older release)" if theirs is None else f"data path version {theirs}"
    return (
        f"{peer} speaks {named}, this end speaks version {ours}: every node and client of a release ship "
        "together (upgrade the older side)"
    )


class ShmUnavailable(DataPathError):
    """The shared-memory path could not be set up (before any transfer was asked for): use TCP."""


def encode_header(header: dict[str, Any]) -> bytes:
    """A frame's header: its JSON (compact), after its length as the wire grammar above gives it."""
    body = json.dumps(header, separators=(",", ":")).encode()
    return _LEN.pack(len(body)) + body


def tune_socket(sock: socket.socket) -> None:
    """Large buffers (4 MiB frames), no Nagle delay: both ends of a data-path connection."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER_BYTES)


async def send_parts(sock: socket.socket, parts: Sequence[bytes | bytearray | memoryview]) -> None:
    """Send ``parts`` back to back on a non-blocking socket, without joining them.

    One ``sendmsg`` (scatter-gather) while the kernel takes everything, the event loop's ``sock_sendall`` for
    whatever is left.
    """
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    while views:
        sent = _send_some(sock, views)
        if views and not sent:  # the socket buffer is full: let the loop wait for room, piece by piece
            loop = asyncio.get_running_loop()
            for view in views:
                await loop.sock_sendall(sock, view)
            return


def send_parts_in_thread(
    sock: socket.socket, parts: Sequence[bytes | bytearray | memoryview], stall_s: float
) -> list[memoryview]:
    """Send ``parts`` back to back on a non-blocking socket from a worker thread (not the event loop's).

    Waits for room with ``poll`` (no event loop wake-up per partial send), at most ``stall_s`` at a time: a
    receiver that takes nothing for that long is left to the event loop, which holds no thread while it waits.
    Returns what was not sent (empty: all of it), for ``send_parts`` on the loop. The loop must not use the
    socket meanwhile.
    """
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLOUT)
    while views:
        if not _send_some(sock, views) and not poller.poll(int(stall_s * 1000)):
            break
    return views


def _send_some(sock: socket.socket, views: list[memoryview]) -> int:
    """One ``sendmsg`` of ``views`` on a non-blocking socket; what was sent leaves ``views``. Bytes sent (0: full)."""
    try:
        sent = sock.sendmsg(views[:_IOV_MAX])
    except (BlockingIOError, InterruptedError):
        return 0
    left = sent
    while views and left >= len(views[0]):
        left -= len(views[0])
        views.pop(0)
    if views and left:
        views[0] = views[0][left:]
    return sent


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


async def recv_checksummed(sock: socket.socket, view: memoryview, peer: str) -> int:
    """Fill ``view`` like ``recv_exactly`` and return the CRC-32C of its bytes, computed on each piece as it lands.

    So there is no second pass over the buffer once it is out of the cache.
    """
    loop = asyncio.get_running_loop()
    got, crc = 0, 0
    while got < len(view):
        n = await loop.sock_recv_into(sock, view[got : got + CRC_PIECE_BYTES])
        if n == 0:
            raise DataPathError(f"{peer} closed the connection")
        crc = crc32c_of(view[got : got + n], crc)
        got += n
    return crc


async def recv_header(sock: socket.socket, peer: str) -> dict[str, Any]:
    """One frame header from a non-blocking socket."""
    size_buf = bytearray(_LEN.size)
    await recv_exactly(sock, memoryview(size_buf), peer)
    (size,) = _LEN.unpack(size_buf)
    if size > MAX_HEADER_BYTES:
        raise DataPathError(f"header of {size} bytes is too large")
    body = bytearray(size)
    await recv_exactly(sock, memoryview(body), peer)
    try:
        header = json.loads(body)
    except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, nested too deep: a bad header
        raise DataPathError(f"header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise DataPathError("header is not a JSON object")
    return header


class DataConnection:
    """Client side of one data-path connection (asyncio, non-blocking socket, zero-copy sends).

    ``address`` is ``host:port`` (TCP) or ``unix:NAME`` (the node's abstract AF_UNIX endpoint).
    """

    def __init__(self, address: str, token: str, host: str = "") -> None:
        self.address = address
        self._token = token
        self._host = host
        self._sock: socket.socket | None = None
        self._mapped: set[int] = set()
        self.peer: dict[str, Any] = {}  # the node's answer to the handshake
        self.lock = asyncio.Lock()

    async def _connect(self) -> socket.socket:
        if self._sock is not None:
            return self._sock
        loop = asyncio.get_running_loop()
        if self.address.startswith(UNIX_PREFIX):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            target: Any = "\0" + self.address[len(UNIX_PREFIX) :]
        else:
            host, port = self.address.rsplit(":", 1)
            sock, target = socket.socket(socket.AF_INET, socket.SOCK_STREAM), (host, int(port))
            tune_socket(sock)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, target)
            hello = {"op": "auth", "token": self._token, "host": self._host, "version": DATA_PATH_VERSION}
            await loop.sock_sendall(sock, encode_header(hello))
            self._sock = sock
            answer = await self._read_header()
        except BaseException:
            sock.close()
            self._sock = None
            raise
        if not answer.get("ok"):
            self.close()
            code = str(answer.get("code", "UNAUTHENTICATED"))
            what = "the connection" if code == "FAILED_PRECONDITION" else "the token"
            raise DataRefused(code, f"data endpoint {self.address} refused {what}: {answer.get('error', '')}")
        mismatch = version_refusal(DATA_PATH_VERSION, answer.get("version"), f"data endpoint {self.address}")
        if mismatch is not None:
            self.close()
            raise DataRefused("FAILED_PRECONDITION", mismatch)
        self.peer = answer
        return sock

    async def handshake(self) -> dict[str, Any]:
        """Connect (if not yet) and return the node's handshake answer."""
        async with self.lock:
            try:
                await self._connect()
            except (OSError, DataPathError, asyncio.CancelledError):
                self.close()
                raise
        return self.peer

    def close(self) -> None:
        """Closes the connection (the next call connects again) and forgets the regions mapped on the node."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            self._mapped.clear()

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

    async def call(
        self, method: str, request: bytes, transfer_id: str, parts: Sequence[bytes | bytearray | memoryview]
    ) -> bytearray:
        """One ``call``: the storage RPC ``method`` and the bytes its TransferRefs name, in one round trip.

        The request is serialized; the bytes are ``parts``, concatenated, under ``transfer_id``. Returns the
        serialized response.

        Raises:
            DataRefused: the node refused the call as the gRPC call would be (the connection stays open).
            DataPathError: the connection broke (closed).
        """
        header = {
            "op": "call",
            "method": method,
            "request": len(request),
            "transfer_id": transfer_id,
            "length": sum(len(p) for p in parts),
        }
        async with self.lock:
            with self._closed_on_failure():
                try:
                    sock = await self._connect()
                    _, response = await self._answered(sock, [encode_header(header), request, *parts])
                except (DataPathError, OSError, asyncio.CancelledError):
                    raise
                except Exception as exc:  # an answer that does not parse: the stream is out of step
                    raise DataPathError(f"bad call answer from {self.address}: {exc}") from exc
                return response  # parsed from this buffer by the caller: no copy

    @contextlib.contextmanager
    def _closed_on_failure(self) -> Iterator[None]:
        """Close the connection when an operation breaks it, or when the node's refusal ends it."""
        try:
            yield
        except DataRefused as exc:
            if exc.code in CONNECTION_ENDING_CODES:
                self.close()
            raise
        except (OSError, DataPathError, asyncio.CancelledError):
            self.close()
            raise

    async def _answered(
        self, sock: socket.socket, parts: Sequence[bytes | bytearray | memoryview]
    ) -> tuple[dict[str, Any], bytearray]:
        """Send ``parts``; the answer's header and the serialized response after it (DataRefused: refused)."""
        await send_parts(sock, parts)
        answer = await self._read_header()
        if not answer.get("ok"):
            raise DataRefused(str(answer.get("code", "UNKNOWN")), str(answer.get("error", "")))
        response = bytearray(int(answer["response"]))
        await self._recv_into(memoryview(response))
        return answer, response

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

    async def read(
        self,
        request: bytes,
        layout: Callable[[bytearray], Sequence[memoryview]],
        shm: tuple[Sequence[Place], Sequence[ShmRegion]] | None = None,
    ) -> tuple[bytearray, list[int] | None]:
        """One ``read``: send a serialized bulk BatchReadRequest, get its response and the bytes that follow.

        The bytes are received straight into ``layout(response)`` (views in transfer order). Returns the response
        and the CRC-32C of each view's bytes, computed as they landed; or, with ``shm`` (one place per IO in the
        mapped ``regions``: AF_UNIX only), the node writes each IO's bytes at its place, nothing follows the
        response, and None stands for the checksums.

        Raises:
            DataRefused: the node refused the request (the connection stays open).
            ShmUnavailable: the regions could not be mapped (nothing was read).
            DataPathError: the connection broke, or the answer does not fit ``layout`` (closed).
        """
        peer = f"data endpoint {self.address}"
        header: dict[str, Any] = {"op": "read", "length": len(request)}
        async with self.lock:
            with self._closed_on_failure():
                sock = await self._connect_mapped(shm[1]) if shm else await self._connect()
                if shm:
                    header["places"] = [list(p) for p in shm[0]]
                answer, response = await self._answered(sock, [encode_header(header), request])
                try:
                    views = layout(response)
                except DataPathError:
                    raise
                except Exception as exc:  # a response that does not parse or fit: the stream is out of step
                    raise DataPathError(f"bad read response from {self.address}: {exc}") from exc
                if shm:
                    return response, None
                if sum(len(v) for v in views) != int(answer["length"]):
                    raise DataPathError(f"read sends {answer['length']} bytes, the results hold another amount")
                return response, [await recv_checksummed(sock, view, peer) for view in views]

    async def _connect_mapped(self, regions: Sequence[ShmRegion]) -> socket.socket:
        try:
            sock = await self._connect()
            await self._map(sock, regions)
            return sock
        except DataRefused:  # the token (or its check) failed: not a reason to give shared memory up
            raise
        except (OSError, DataPathError) as exc:
            raise ShmUnavailable(f"shared memory with {self.address}: {exc}") from exc

    async def _map(self, sock: socket.socket, regions: Sequence[ShmRegion]) -> None:
        for region in regions:
            if region.region_id in self._mapped:
                continue
            await send_parts(sock, [encode_header({"op": "map", "region": region.region_id, "size": region.size})])
            await send_fd(sock, region.fd)
            answer = await self._read_header()
            if not answer.get("ok"):
                raise DataPathError(f"map refused: {answer.get('error', '')}")
            self._mapped.add(region.region_id)


class DataConnectionPool:
    """A few connections per node address, so concurrent transfers to one node do not queue.

    Also the client's shared-memory regions (``alloc``): a ``read`` whose buffers all lie in them goes
    through the node's AF_UNIX endpoint when the node is on this host (``stats`` counts which way).
    """

    def __init__(self, token: str, per_address: int = 16, *, host: str | None = None, shm: bool = True) -> None:
        self._token = token
        self._per_address = per_address
        self._host = host_id() if host is None else host
        self._shm = shm
        self._conns: dict[str, list[DataConnection]] = {}
        self._next: dict[str, int] = {}
        self._unix: dict[str, str | None] = {}  # node address -> its AF_UNIX endpoint, when on this host
        self.regions: list[ShmRegion] = []
        self.stats = {"tcp_pulls": 0, "shm_pulls": 0, "calls": 0}

    def alloc(self, nbytes: int) -> memoryview:
        """A buffer of ``nbytes`` in a new shared-memory region (freed when the pool closes)."""
        region = ShmRegion(nbytes, len(self.regions) + 1)
        self.regions.append(region)
        return region.view

    async def call(
        self,
        address: str,
        method: str,
        request: bytes,
        transfer_id: str,
        parts: Sequence[bytes | bytearray | memoryview],
    ) -> bytearray:
        """``DataConnection.call`` on a connection to ``address``."""
        response = await self.get(address).call(method, request, transfer_id, parts)
        self.stats["calls"] += 1
        return response

    async def read(
        self,
        address: str,
        request: bytes,
        layout: Callable[[bytearray], Sequence[memoryview]],
        into: Sequence[memoryview | None],
    ) -> tuple[bytearray, list[int] | None]:
        """``DataConnection.read`` on a connection to ``address``, or through shared memory when it can.

        Shared memory when the node is on this host and every IO's buffer ``into`` is in this pool's regions (one
        place per IO).
        """
        if self._shm and self.regions and all(v is not None for v in into):
            places = self._places([v for v in into if v is not None])
            unix = await self._unix_endpoint(address) if places is not None else None
            if places is not None and unix is not None:
                try:
                    regions = [r for r in self.regions if any(p[0] == r.region_id for p in places)]
                    got = await self.get(UNIX_PREFIX + unix).read(request, layout, (places, regions))
                    self.stats["shm_pulls"] += 1
                    return got
                except ShmUnavailable:  # unreachable (another network namespace), refused: TCP from now on
                    self._unix[address] = None
        got = await self.get(address).read(request, layout)
        self.stats["tcp_pulls"] += 1
        return got

    def _places(self, into: Sequence[memoryview]) -> list[Place] | None:
        places: list[Place] = []
        for view in into:
            for region in self.regions:
                offset = region.offset_of(view)
                if offset is not None:
                    places.append((region.region_id, offset, len(view)))
                    break
            else:
                return None
        return places

    async def _unix_endpoint(self, address: str) -> str | None:
        if address not in self._unix:
            peer = await self.get(address).handshake()
            same = bool(self._host) and peer.get("host") == self._host
            self._unix[address] = str(peer["unix"]) if same and peer.get("unix") else None
        return self._unix[address]

    def get(self, address: str) -> DataConnection:
        """A connection to ``address``: an idle one, else a new one up to the limit per address, else the next one."""
        conns = self._conns.setdefault(address, [])
        for conn in conns:
            if not conn.lock.locked():
                return conn
        if len(conns) < self._per_address:
            conn = DataConnection(address, self._token, self._host)
            conns.append(conn)
            return conn
        i = self._next.get(address, 0)
        self._next[address] = i + 1
        return conns[i % len(conns)]

    def close(self) -> None:
        """Closes every connection and shared-memory region of the pool."""
        for conns in self._conns.values():
            for conn in conns:
                conn.close()
        self._conns.clear()
        for region in self.regions:
            region.close()
        self.regions.clear()
