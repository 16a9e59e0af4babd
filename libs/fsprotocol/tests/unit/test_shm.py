"""Shared-memory regions: offsets of views, descriptor passing, nothing named in /dev/shm."""

from __future__ import annotations

import asyncio
import mmap
import os
import socket
from pathlib import Path

import pytest

from ff_fsprotocol.shm import ShmRegion, host_id, recv_fd, send_fd


def test_host_id_is_this_boot() -> None:
    assert host_id() and host_id() == Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def test_views_are_located_in_their_region_only() -> None:
    before = set(os.listdir("/dev/shm"))
    a, b = ShmRegion(1 << 16, 1), ShmRegion(4096, 2)
    try:
        assert a.offset_of(a.view[100:200]) == 100
        assert b.offset_of(a.view[100:200]) is None
        assert a.offset_of(memoryview(bytearray(10))) is None
        assert a.offset_of(a.view[10:10]) is None  # empty: nowhere
        assert a.offset_of(a.view.toreadonly()[0:10]) is None  # read-only: cannot be written into
        assert set(os.listdir("/dev/shm")) == before  # memfd: never a name in /dev/shm
    finally:
        a.close()
        b.close()
    with pytest.raises(ValueError):
        ShmRegion(0, 3)


async def test_a_passed_descriptor_maps_the_same_memory() -> None:
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    left.setblocking(False)
    right.setblocking(False)
    region = ShmRegion(4096, 1)
    try:
        sender = asyncio.create_task(send_fd(left, region.fd))
        fd = await recv_fd(right)
        await sender
        with mmap.mmap(fd, 4096) as theirs:
            theirs[0:5] = b"hello"
        os.close(fd)
        assert bytes(region.view[0:5]) == b"hello"
        left.send(b"x")  # a byte without a descriptor is refused
        with pytest.raises(ConnectionError):
            await recv_fd(right)
    finally:
        left.close()
        right.close()
        region.close()
