"""The data path: same-host reads through shared memory (used on one host, TCP otherwise, authenticated,
nothing left over) and BatchReads on a ReadStream."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import grpc
import pytest

from ff_fsprotocol.datapath import DATA_PATH_VERSION, DataConnection, DataPathError, encode_header, recv_header
from ff_fsprotocol.shm import ShmRegion, host_id, send_fd
from ff_testing.cluster import CLUSTER_TOKEN, StorageCluster
from hf3fs import ChunkRead, ChunkWrite, StorageClient, StorageIoError

CHUNK = 256 * 1024
COUNT = 6


def dev_shm() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


async def write_chunks(client: StorageClient, chain_id: int) -> list[bytes]:
    blocks = [os.urandom(CHUNK) for _ in range(COUNT)]
    ios = [
        ChunkWrite(chain_id=chain_id, inode_id=7, chunk_index=i, data=b, chunk_size=CHUNK) for i, b in enumerate(blocks)
    ]
    assert all(r.ok for r in await client.batch_write(ios))
    return blocks


async def read_into(client: StorageClient, chain_id: int, buffers: list[memoryview]) -> list[bytes]:
    ios = [
        ChunkRead(chain_id=chain_id, inode_id=7, chunk_index=i, length=CHUNK, buffer=buffers[i]) for i in range(COUNT)
    ]
    outcomes = await client.batch_read(ios)
    assert all(o.ok for o in outcomes), [o.message for o in outcomes]
    return [bytes(o.data) for o in outcomes]


async def test_same_host_reads_go_through_shared_memory_and_leave_nothing(
    cluster: StorageCluster, client: StorageClient
) -> None:
    before = dev_shm()
    chain_id = (await cluster.routing()).chains[0].chain_id
    blocks = await write_chunks(client, chain_id)
    area = client.alloc_buffer(CHUNK * COUNT)
    buffers = [area[i * CHUNK : (i + 1) * CHUNK] for i in range(COUNT)]
    for _ in range(2):  # the second round reuses the mapped region
        assert await read_into(client, chain_id, buffers) == blocks
    stats = client.data_stats
    assert stats["shm_pulls"] >= 1 and stats["tcp_pulls"] == 0, stats
    # An endpoint that cannot be reached (say, another network namespace on this host): TCP, same bytes.
    endpoints = client._data._unix  # fault injection
    for address in endpoints:
        endpoints[address] = "ff-storage-data-nowhere"
    assert await read_into(client, chain_id, buffers) == blocks
    assert client.data_stats["tcp_pulls"] >= 1 and None in endpoints.values()
    endpoints.clear()  # learn them again from a handshake
    shm_before = client.data_stats["shm_pulls"]
    assert await read_into(client, chain_id, buffers) == blocks
    assert client.data_stats["shm_pulls"] > shm_before
    # A plain buffer (not in a shared region) still reads, over TCP.
    plain = [memoryview(bytearray(CHUNK)) for _ in range(COUNT)]
    assert await read_into(client, chain_id, plain) == blocks
    assert client.data_stats["tcp_pulls"] >= 1
    del buffers, area
    await client.close()
    assert dev_shm() - before == set(), "memfd regions must never appear in /dev/shm"


async def test_another_host_falls_back_to_tcp(cluster: StorageCluster) -> None:
    mg = cluster.client()
    other = StorageClient(mg, CLUSTER_TOKEN, host_id="some-other-host")
    try:
        chain_id = (await cluster.routing()).chains[0].chain_id
        blocks = await write_chunks(other, chain_id)
        area = other.alloc_buffer(CHUNK * COUNT)
        assert await read_into(other, chain_id, [area[i * CHUNK : (i + 1) * CHUNK] for i in range(COUNT)]) == blocks
        assert other.data_stats["shm_pulls"] == 0 and other.data_stats["tcp_pulls"] >= 1
    finally:
        await other.close()
        await mg.close()


async def test_shared_memory_endpoint_needs_the_token_and_a_mapped_region(
    cluster: StorageCluster, tmp_path: Path
) -> None:
    data = str(cluster.nodes[0].info["data"])
    tcp = DataConnection(data, CLUSTER_TOKEN, host_id())
    try:
        unix = (await tcp.handshake()).get("unix")
    finally:
        tcp.close()
    assert unix, "a same-host client is told the node's AF_UNIX endpoint"
    stranger = DataConnection(data, CLUSTER_TOKEN, "some-other-host")
    try:
        assert "unix" not in await stranger.handshake()
    finally:
        stranger.close()

    bad = DataConnection(f"unix:{unix}", "wrong-token", host_id())
    with pytest.raises(DataPathError, match="refused the token"):
        await bad.handshake()
    bad.close()

    # Authenticated, but pulling into a region never mapped, or past a mapped one's end, is refused.
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    region = ShmRegion(4096, 1)
    try:
        await loop.sock_connect(sock, "\0" + unix)
        await loop.sock_sendall(
            sock, encode_header({"op": "auth", "token": CLUSTER_TOKEN, "host": host_id(), "version": DATA_PATH_VERSION})
        )
        assert (await recv_header(sock, "node"))["ok"]
        await loop.sock_sendall(sock, encode_header({"op": "pull_shm", "transfer_id": "x", "places": [[1, 0, 10]]}))
        assert "not mapped" in (await recv_header(sock, "node"))["error"]
        await loop.sock_sendall(sock, encode_header({"op": "map", "region": 1, "size": 4096}))
        await send_fd(sock, region.fd)
        assert (await recv_header(sock, "node"))["ok"]
        await loop.sock_sendall(sock, encode_header({"op": "pull_shm", "transfer_id": "x", "places": [[1, 4000, 200]]}))
        assert "outside" in (await recv_header(sock, "node"))["error"]
        await loop.sock_sendall(sock, encode_header({"op": "pull_shm", "transfer_id": "x", "places": [[1, 0, 10]]}))
        assert "NOT_FOUND" in (await recv_header(sock, "node"))["error"]
    finally:
        sock.close()
        region.close()


async def test_read_stream_answers_each_request_and_outlives_a_refused_one(
    cluster: StorageCluster, client: StorageClient
) -> None:
    chain_id = (await cluster.routing()).chains[0].chain_id
    blocks = await write_chunks(client, chain_id)
    mg = cluster.client()
    inline = StorageClient(mg, CLUSTER_TOKEN, bulk=False)  # bulk reads go on the data path, not the stream
    stranger = StorageClient(mg, "not-a-token", retry_deadline_s=2.0, bulk=False)
    try:
        with pytest.raises(StorageIoError) as err:  # refused by BatchRead's checks, on the open stream
            await inline.batch_read([ChunkRead(chain_id=chain_id, inode_id=7, chunk_index=0, length=1 << 40)])
        assert err.value.code is grpc.StatusCode.INVALID_ARGUMENT
        many = await asyncio.gather(
            *(
                inline.batch_read([ChunkRead(chain_id=chain_id, inode_id=7, chunk_index=i, length=CHUNK)])
                for i in range(COUNT)
            )
        )
        assert [bytes(got[0].data) for got in many] == blocks
        assert len(inline._streams) >= 1 and inline.data_stats["tcp_pulls"] == 0
        with pytest.raises(StorageIoError) as err:
            await stranger.batch_read([ChunkRead(chain_id=chain_id, inode_id=7, chunk_index=0, length=CHUNK)])
        assert err.value.code is grpc.StatusCode.UNAUTHENTICATED
    finally:
        await inline.close()
        await stranger.close()
        await mg.close()
