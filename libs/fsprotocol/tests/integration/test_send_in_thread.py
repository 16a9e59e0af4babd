"""``send_parts_in_thread``: a worker thread sends on the event loop's non-blocking socket, and leaves to the loop
whatever a receiver that stalls does not take in time."""

from __future__ import annotations

import asyncio
import os
import socket

import pytest

from ff_fsprotocol.datapath import send_parts, send_parts_in_thread


def _pair(buffer_bytes: int) -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    for sock in (a, b):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer_bytes)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer_bytes)
        sock.setblocking(False)
    return a, b


async def _drain(sock: socket.socket, want: int) -> bytes:
    loop = asyncio.get_running_loop()
    got = bytearray()
    while len(got) < want:
        chunk = await loop.sock_recv(sock, want - len(got))
        assert chunk, "the sender closed early"
        got += chunk
    return bytes(got)


async def test_parts_taken_at_once_are_all_sent_from_the_thread() -> None:
    sender, receiver = _pair(1 << 20)
    parts = [b"head", memoryview(os.urandom(100_000)), b"", bytearray(os.urandom(3))]
    try:
        left = await asyncio.to_thread(send_parts_in_thread, sender, parts, 1.0)
        assert left == []
        assert await _drain(receiver, 100_007) == b"".join(bytes(p) for p in parts)
    finally:
        sender.close()
        receiver.close()


async def test_a_stalled_receiver_leaves_the_rest_to_the_loop_and_every_byte_arrives_in_order() -> None:
    sender, receiver = _pair(64 * 1024)
    payload = os.urandom(8 << 20)  # far more than both socket buffers hold
    parts = [b"header", memoryview(payload)[: 3 << 20], memoryview(payload)[3 << 20 :]]
    try:
        left = await asyncio.to_thread(send_parts_in_thread, sender, parts, 0.05)  # nobody reads meanwhile
        unsent = sum(len(v) for v in left)
        assert 0 < unsent < len(payload)
        assert b"".join(bytes(v) for v in left) == (b"header" + payload)[-unsent:]
        got, _ = await asyncio.gather(_drain(receiver, 6 + len(payload)), send_parts(sender, left))
        assert got == b"header" + payload
    finally:
        sender.close()
        receiver.close()


async def test_a_receiver_that_closed_makes_the_send_fail() -> None:
    sender, receiver = _pair(64 * 1024)
    receiver.close()
    try:
        with pytest.raises(OSError):
            await asyncio.to_thread(send_parts_in_thread, sender, [os.urandom(1 << 20)], 1.0)
    finally:
        sender.close()
