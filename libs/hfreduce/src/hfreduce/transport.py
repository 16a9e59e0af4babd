"""Point-to-point links: TCP between nodes, AF_UNIX inside a node.

Blocking sockets with kernel timeouts, memoryview sends and ``recv_into`` receives (nothing is pickled or copied
into bytes), and the same calls as non-blocking steps for the event loop (``send_steps``, ``recv_steps``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import socket
import struct
from collections.abc import Generator, Sequence

_TIMEOUT_ERRNOS = (errno.EAGAIN, errno.EWOULDBLOCK, errno.ETIMEDOUT)


class LinkError(Exception):
    """A link to ``peer`` (a global rank) broke (``kind="closed"``) or timed out (``kind="timeout"``)."""

    def __init__(self, peer: int, kind: str, detail: str = "") -> None:
        super().__init__(f"link to rank {peer} {kind}{': ' + detail if detail else ''}")
        self.peer = peer
        self.kind = kind


def set_kernel_timeouts(sock: socket.socket, timeout_s: float) -> None:
    """Blocking socket whose every send/recv gives up after ``timeout_s`` (SO_SNDTIMEO/SO_RCVTIMEO)."""
    sock.settimeout(None)
    sec = int(timeout_s)
    tv = struct.pack("ll", sec, int((timeout_s - sec) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


@dataclasses.dataclass(frozen=True)
class Wait:
    """What a cooperative send or receive waits for: ``link``'s socket writable (``write``) or readable."""

    link: Link
    write: bool


def _bytes(view: memoryview) -> memoryview:
    """``view`` as flat bytes (a numpy-backed view may be typed or multi-dimensional)."""
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


class Link:
    """One connected stream socket to the peer with global rank ``peer``."""

    def __init__(self, sock: socket.socket, peer: int, timeout_s: float) -> None:
        self.sock = sock
        self.peer = peer
        self.timeout_s = timeout_s
        set_kernel_timeouts(sock, timeout_s)

    def send(self, data: memoryview | bytes) -> None:
        """Send all of ``data``, blocking (each wait bounded by the kernel timeout).

        Raises:
            LinkError: the peer closed the link or did not take the bytes within the timeout.
        """
        try:
            self.sock.sendall(data)
        except OSError as exc:
            raise self._error(exc) from exc

    def send_parts(self, parts: Sequence[memoryview | bytes]) -> None:
        """Scatter-gather send of several buffers (header + payload) without concatenating them."""
        try:
            total = sum(len(p) for p in parts)
            sent = self.sock.sendmsg(parts)
            if sent < total:  # rare: finish the remainder with plain sends
                joined = [memoryview(p).cast("B") for p in parts]
                for view in joined:
                    if sent >= len(view):
                        sent -= len(view)
                        continue
                    self.sock.sendall(view[sent:])
                    sent = 0
        except OSError as exc:
            raise self._error(exc) from exc

    def recv_into(self, buf: memoryview) -> None:
        """Fill ``buf`` exactly; a silent peer for ``timeout_s`` raises LinkError(kind="timeout")."""
        view = _bytes(buf)
        got, total = 0, len(view)
        while got < total:  # each recv waits at most timeout_s for progress (SO_RCVTIMEO)
            try:
                n = self.sock.recv_into(view[got:], total - got, socket.MSG_WAITALL)
            except OSError as exc:
                raise self._error(exc) from exc
            if n == 0:
                raise LinkError(self.peer, "closed", "connection closed by peer")
            got += n

    def send_nowait(self, data: memoryview) -> int:
        """Send what the socket buffer takes of ``data`` now, without blocking; return the number of bytes sent."""
        try:
            return self.sock.send(_bytes(data), socket.MSG_DONTWAIT)
        except BlockingIOError:
            return 0
        except OSError as exc:
            raise self._error(exc) from exc

    def send_steps(self, data: memoryview) -> Generator[Wait, None, None]:
        """``send`` for an event loop: non-blocking sends, yielding a Wait whenever the socket buffer is full."""
        view = _bytes(data)
        sent, total = 0, len(view)
        while sent < total:
            try:
                sent += self.sock.send(view[sent:], socket.MSG_DONTWAIT)
            except BlockingIOError:
                yield Wait(self, write=True)
            except OSError as exc:
                raise self._error(exc) from exc

    def recv_steps(self, buf: memoryview) -> Generator[Wait, None, None]:
        """``recv_into`` for an event loop: non-blocking receives, yielding a Wait whenever nothing is queued."""
        view = _bytes(buf)
        got, total = 0, len(view)
        while got < total:
            try:
                n = self.sock.recv_into(view[got:], total - got, socket.MSG_DONTWAIT)
            except BlockingIOError:
                yield Wait(self, write=False)
                continue
            except OSError as exc:
                raise self._error(exc) from exc
            if n == 0:
                raise LinkError(self.peer, "closed", "connection closed by peer")
            got += n

    def _error(self, exc: OSError) -> LinkError:
        if exc.errno in _TIMEOUT_ERRNOS or isinstance(exc, TimeoutError):
            return LinkError(self.peer, "timeout", f"no progress for {self.timeout_s:g} s")
        return LinkError(self.peer, "closed", str(exc))

    def abort(self) -> None:
        """Wake any thread blocked on this link (its call fails), used to tear a failed group down."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Close the socket; the peer's next receive sees the link closed."""
        self.sock.close()


def tune_tcp(sock: socket.socket, buffer_bytes: int) -> None:
    """Set up a TCP link: no Nagle delay; ``buffer_bytes`` > 0 fixes both socket buffers, 0 leaves them autotuned."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if buffer_bytes:  # an explicit size disables autotuning, which was slower here
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer_bytes)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer_bytes)


def recv_exact(sock: socket.socket, nbytes: int) -> bytes:
    """Small control reads (headers); raises ConnectionError on EOF."""
    buf = bytearray(nbytes)
    view = memoryview(buf)
    got = 0
    while got < nbytes:
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("connection closed")
        got += n
    return bytes(buf)
