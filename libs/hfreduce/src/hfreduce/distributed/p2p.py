"""Point-to-point transfers for the torch backend (``send``/``recv``): one TCP connection per ordered pair of ranks.

hfreduce's own links are the trees and rings of its collectives; a pipeline's stages need tensors sent from one
rank to another at any time. Every rank listens on a port of its own, published in the torch store as
``<prefix>/<rank>`` (``{"host": hostname, "addr": address, "port": port}``); a sender connects on its first send
to that rank (loopback when both ranks share a hostname) and says who it is (8 bytes, its rank). Each message
is a header (tag, byte count; two little-endian int64) and the tensor's bytes, written and read straight from
the tensor's memory when it is a contiguous CPU tensor. A pair's messages arrive in the order they were sent;
``recv`` takes the next message from that rank and refuses it if its tag or size is not what it expects.

Sends to one rank run one at a time on a thread of their own, receives from one rank likewise, so ``isend`` and
``irecv`` never block the caller and a rank may send to and receive from its neighbours at the same time.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

import torch

from hfreduce.distributed import tensors as tx
from hfreduce.errors import PeerFailureError

_HELLO = struct.Struct("<q")
_HEADER = struct.Struct("<qq")


class PeerLinks:
    """The connections of one rank to the other ranks of its process group, made on first use.

    Args:
        store: the group's torch store (a ``PrefixStore`` of the group's own).
        rank: this rank in the group; size: the group's size.
        timeout_s: bounds connecting, and every wait for a peer's bytes (a peer that hangs is named after it).
        describe: names a rank for errors: ``(rank) -> (node, local rank)``.
        prefix: where addresses go in the store.
        route_to: a host whose route gives this rank's address for peers on other hosts (torch's
            ``MASTER_ADDR``); else the hostname resolved.
    """

    def __init__(
        self,
        store: Any,
        rank: int,
        size: int,
        *,
        timeout_s: float | None,
        describe: Callable[[int], tuple[int, int]],
        prefix: str = "hfreduce-p2p",
        route_to: str | None = None,
    ) -> None:
        self._store, self._rank, self._size = store, rank, size
        self._timeout_s = timeout_s
        self._describe = describe
        self._prefix = prefix
        self._listener = socket.create_server(("", 0), backlog=size + 8)
        host = socket.gethostname()
        record = {"host": host, "addr": _local_addr(route_to), "port": self._listener.getsockname()[1]}
        store.set(f"{prefix}/{rank}", json.dumps(record))
        self._lock = threading.Condition()
        self._outbound: dict[int, socket.socket] = {}
        self._inbound: dict[int, socket.socket] = {}
        self._threads: dict[tuple[str, int], concurrent.futures.ThreadPoolExecutor] = {}
        self._closed = False
        self._acceptor = threading.Thread(target=self._accept, name="hfreduce-p2p-accept", daemon=True)
        self._acceptor.start()

    # ----- what the backend calls -----

    def submit(self, direction: str, peer: int, job: Callable[[], None]) -> concurrent.futures.Future[None]:
        """Run ``job`` on the thread of (``direction``, ``peer``): one at a time, in submission order."""
        self._check_peer(peer)
        with self._lock:
            if self._closed:
                raise RuntimeError("hfreduce backend: the process group was shut down")
            thread = self._threads.get((direction, peer))
            if thread is None:
                thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"hfreduce-{direction}{peer}")
                self._threads[(direction, peer)] = thread
        return thread.submit(job)

    def send(self, t: torch.Tensor, dst: int, tag: int) -> None:
        """Write ``t``'s bytes to ``dst`` (blocking; on ``dst``'s send thread)."""
        raw, _ = tx.host_bytes(t)
        conn = self._connect(dst)
        try:
            conn.sendall(_HEADER.pack(tag, raw.numel()))
            if raw.numel():
                conn.sendall(_buffer(raw))
        except OSError as exc:
            raise self._failure(dst, "send to", exc) from exc

    def recv(self, t: torch.Tensor, src: int, tag: int) -> None:
        """Read the next message from ``src`` into ``t`` (blocking; on ``src``'s receive thread)."""
        flat, write_back = tx.host_bytes(t)
        conn = self._accepted(src)
        try:
            got_tag, nbytes = _HEADER.unpack(_read(conn, _HEADER.size))
            if got_tag != tag or nbytes != flat.numel():
                raise ValueError(
                    f"hfreduce backend: recv from rank {src} expected tag {tag} and {flat.numel()} bytes "
                    f"({t.dtype} {list(t.shape)}), the next message has tag {got_tag} and {nbytes} bytes"
                )
            if nbytes:
                _read_into(conn, _buffer(flat))
        except (OSError, EOFError) as exc:
            raise self._failure(src, "recv from", exc) from exc
        write_back()

    def close(self) -> None:
        """Close every connection and the listener; a transfer blocked on one fails, then its thread ends."""
        with self._lock:
            self._closed = True
            threads = list(self._threads.values())
            conns = [*self._outbound.values(), *self._inbound.values()]
            self._lock.notify_all()
        for conn in conns:
            _close(conn)  # a transfer blocked on it fails now, its thread then ends
        _close(self._listener)
        for thread in threads:
            thread.shutdown(wait=True)

    # ----- connections -----

    def _connect(self, dst: int) -> socket.socket:
        conn = self._outbound.get(dst)  # only dst's send thread touches this entry
        if conn is not None:
            return conn
        try:
            record = json.loads(self._store.get(f"{self._prefix}/{dst}"))
            addr = "127.0.0.1" if record["host"] == socket.gethostname() else str(record["addr"])
            conn = socket.create_connection((addr, int(record["port"])), timeout=self._timeout_s)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.sendall(_HELLO.pack(self._rank))
        except (OSError, RuntimeError) as exc:  # the store raises RuntimeError (DistStoreError) on its timeout
            raise self._failure(dst, "connect to", exc) from exc
        with self._lock:
            if self._closed:
                _close(conn)
                raise RuntimeError("hfreduce backend: the process group was shut down")
            self._outbound[dst] = conn
        return conn

    def _accepted(self, src: int) -> socket.socket:
        with self._lock:
            ready = self._lock.wait_for(lambda: src in self._inbound or self._closed, timeout=self._timeout_s)
            if self._closed:
                raise RuntimeError("hfreduce backend: the process group was shut down")
            if not ready:
                raise self._failure(src, "recv from", TimeoutError("it never connected"))
            return self._inbound[src]

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
                conn.settimeout(self._timeout_s)
                (src,) = _HELLO.unpack(_read(conn, _HELLO.size))
            except (OSError, EOFError):
                if self._closed:
                    return
                continue  # a connection that failed before saying who it is: its sender reports the error
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._inbound[src] = conn
                self._lock.notify_all()

    def _check_peer(self, peer: int) -> None:
        if not 0 <= peer < self._size or peer == self._rank:
            raise ValueError(f"hfreduce backend: peer rank {peer} not in [0, {self._size}) or this rank")

    def _failure(self, peer: int, what: str, exc: BaseException) -> PeerFailureError:
        node, local = self._describe(peer)
        if self._closed:
            reason = "unreachable: this process group was shut down"
        elif isinstance(exc, TimeoutError | socket.timeout):
            reason = f"did not answer within {self._timeout_s:g} s"
        else:
            reason = "died"
        return PeerFailureError(
            rank=peer, node_rank=node, local_rank=local, reason=reason, detail=f"{what} rank {peer}: {exc!r}"
        )


def _buffer(flat: torch.Tensor) -> memoryview:
    """The memory of a flat contiguous uint8 CPU tensor, for ``sendall``/``recv_into`` (no copy)."""
    array: Any = flat.numpy()
    return memoryview(array)


def _read(conn: socket.socket, nbytes: int) -> bytes:
    buf = bytearray(nbytes)
    _read_into(conn, memoryview(buf))
    return bytes(buf)


def _read_into(conn: socket.socket, view: memoryview) -> None:
    view = view.cast("B")
    got = 0
    while got < len(view):
        n = conn.recv_into(view[got:])
        if n == 0:
            raise EOFError("the connection was closed")
        got += n


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def _local_addr(route_to: str | None) -> str:
    """The address peers on other hosts reach this one on (the same rule as the control server's)."""
    if route_to and not route_to.startswith("127."):
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((route_to, 9))  # no packet is sent: this only asks the kernel for a route
                local: str = probe.getsockname()[0]
            return local
        except OSError:
            pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"
