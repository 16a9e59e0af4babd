"""Shared memory between a client and a storage node on the same host (3FS's USRBIO iov, in spirit).

A client allocates its I/O buffers in ``ShmRegion``s: anonymous memory files (``memfd_create``), never
named in /dev/shm, so nothing is left behind whatever happens to the client. On a same-host data
connection it hands the region's file descriptor to the node over AF_UNIX (SCM_RIGHTS, which proves the
client holds it); the node maps it and writes read chunk bytes straight into it: one copy from the
page cache, nothing on a socket. Same host means the same kernel boot (``host_id``), not the same IP.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import ctypes
import mmap
import os
import socket
from functools import cache

_BOOT_ID = "/proc/sys/kernel/random/boot_id"
_FD_BYTES = array.array("i", [0]).itemsize


@cache
def host_id() -> str:
    """This kernel's boot id: equal for every process of one host (and one boot), different elsewhere."""
    try:
        with open(_BOOT_ID) as f:
            return f.read().strip()
    except OSError:
        return ""  # no boot id: never claim to share a host


def address_of(view: memoryview) -> int:
    """The address of a writable buffer's first byte."""
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


class ShmRegion:
    """An anonymous shared-memory file, mapped here; ``view`` is the caller's buffer space."""

    def __init__(self, nbytes: int, region_id: int) -> None:
        if nbytes <= 0:
            raise ValueError("a shared-memory region needs at least one byte")
        self.region_id = region_id
        self.size = nbytes
        self.fd = os.memfd_create(f"hf3fs-io-{region_id}", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, nbytes)
            self._map = mmap.mmap(self.fd, nbytes)
        except BaseException:
            os.close(self.fd)
            raise
        self.view = memoryview(self._map)
        self._base = address_of(self.view)

    def offset_of(self, view: memoryview) -> int | None:
        """Where ``view`` starts in this region, or None if it is not wholly inside it."""
        if view.readonly or not view.contiguous or not len(view):
            return None
        offset = address_of(view) - self._base
        return offset if offset >= 0 and offset + view.nbytes <= self.size else None

    def close(self) -> None:
        """Unmap and close (views still handed out keep the memory alive until they are released)."""
        self.view.release()
        with contextlib.suppress(BufferError):  # a caller still holds a view: the mapping goes with the last
            self._map.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


async def send_fd(sock: socket.socket, fd: int) -> None:
    """One byte carrying ``fd`` (SCM_RIGHTS) on a non-blocking AF_UNIX socket."""
    loop = asyncio.get_running_loop()
    fds = array.array("i", [fd])
    while True:
        try:
            sock.sendmsg([b"F"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
            return
        except (BlockingIOError, InterruptedError):
            await _ready(loop, sock, write=True)


async def recv_fd(sock: socket.socket) -> int:
    """The descriptor a peer sent with ``send_fd`` (ConnectionError if none came)."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            data, ancdata, _, _ = sock.recvmsg(1, socket.CMSG_SPACE(_FD_BYTES))
            break
        except (BlockingIOError, InterruptedError):
            await _ready(loop, sock, write=False)
    fds = array.array("i")
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % _FD_BYTES])
    if not data or len(fds) != 1:
        for extra in fds:
            os.close(extra)
        raise ConnectionError("expected exactly one file descriptor")
    return fds[0]


async def _ready(loop: asyncio.AbstractEventLoop, sock: socket.socket, *, write: bool) -> None:
    fut: asyncio.Future[None] = loop.create_future()
    fd = sock.fileno()

    def wake() -> None:
        if not fut.done():
            fut.set_result(None)

    (loop.add_writer if write else loop.add_reader)(fd, wake)
    try:
        await fut
    finally:
        (loop.remove_writer if write else loop.remove_reader)(fd)
