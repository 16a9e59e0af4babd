"""The data path's receive side: bytes checksummed piece by piece as they land, a short stream refused."""

from __future__ import annotations

import asyncio
import os
import socket

import pytest

from ff_fsprotocol.checksum import crc32c_of
from ff_fsprotocol.datapath import CRC_PIECE_BYTES, DataPathError, recv_checksummed


async def test_the_checksum_taken_while_receiving_is_the_whole_buffers() -> None:
    data = os.urandom(3 * CRC_PIECE_BYTES + 12345)  # several pieces, the last one partial
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        view = memoryview(bytearray(len(data)))
        sending = loop.create_task(loop.sock_sendall(a, data))
        crc = await recv_checksummed(b, view, "peer")
        await sending
        assert view == data and crc == crc32c_of(data)
        assert crc != crc32c_of(data[:-1] + bytes([data[-1] ^ 1]))  # one flipped bit shows
    finally:
        a.close()
        b.close()


async def test_a_peer_that_closes_early_is_an_error() -> None:
    a, b = socket.socketpair()
    b.setblocking(False)
    try:
        a.sendall(b"x" * 100)
        a.close()
        with pytest.raises(DataPathError, match="closed the connection"):
            await recv_checksummed(b, memoryview(bytearray(200)), "peer")
    finally:
        b.close()
