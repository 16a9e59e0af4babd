"""Bulk reads as one ``read`` on the data path: no gRPC call, BatchRead's checks (input, token, the file's
IoCapability) with the connection's caller, refusals that leave the connection open, and same-host reads
written into the reader's mapped places."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

import grpc
import pytest

from ff_fsprotocol.capability import capability_key, make_capability
from ff_fsprotocol.datapath import DataConnection, DataRefused
from ff_fsprotocol.routing import RoutingView
from ff_fsprotocol.shm import ShmRegion, host_id
from ff_rpc import RpcError
from ff_testing.cluster import CLUSTER_TOKEN, StorageCluster
from ff_testing.waiting import eventually
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2
from fireflyer.storage.v1 import storage_pb2 as spb
from hf3fs import ChunkRead, ChunkWrite, StorageClient, StorageIoError, crc32c_of

from .conftest import chunk_file, damage, layout_on

CHUNK = 512 * 1024
INODE = 11


async def write_chunks(client: StorageClient, chain_id: int, count: int) -> list[bytes]:
    blocks = [os.urandom(CHUNK) for _ in range(count)]
    ios = [
        ChunkWrite(chain_id=chain_id, inode_id=INODE, chunk_index=i, data=b, chunk_size=CHUNK)
        for i, b in enumerate(blocks)
    ]
    assert all(r.ok for r in await client.batch_write(ios))
    return blocks


def reads(chain_id: int, count: int, **kw: object) -> list[ChunkRead]:
    return [
        ChunkRead(chain_id=chain_id, inode_id=INODE, chunk_index=i, length=CHUNK, **kw)  # type: ignore[arg-type]
        for i in range(count)
    ]


async def test_reads_take_one_round_trip_on_the_data_path_and_a_refusal_keeps_the_connection(
    cluster: StorageCluster, client: StorageClient
) -> None:
    chain_id = (await cluster.routing()).chains[0].chain_id
    blocks = await write_chunks(client, chain_id, 4)
    buffers = [memoryview(bytearray(CHUNK)) for _ in blocks]
    got = await client.batch_read(
        [ChunkRead(chain_id=chain_id, inode_id=INODE, chunk_index=i, length=CHUNK, buffer=buffers[i]) for i in range(4)]
    )
    assert [bytes(o.data) for o in got] == blocks
    assert all(o.data.obj is buffers[i].obj for i, o in enumerate(got) if isinstance(o.data, memoryview))
    assert client._streams == {}, "no gRPC ReadStream is opened for bulk reads"  # white box: which path
    assert client.data_stats["tcp_pulls"] >= 1
    target = (await cluster.routing()).chains[0].targets[0].target_id
    await client.batch_read(reads(chain_id, 1), prefer_target=target)
    conns = {a: [(c, c._sock) for c in cs] for a, cs in client._data._conns.items()}
    with pytest.raises(StorageIoError) as err:  # refused by BatchRead's checks, answered on the data path
        await client.batch_read(
            [ChunkRead(chain_id=chain_id, inode_id=INODE, chunk_index=0, length=1 << 40)], prefer_target=target
        )
    assert err.value.code is grpc.StatusCode.INVALID_ARGUMENT and "ios[0]" in str(err.value)
    assert [bytes(o.data) for o in await client.batch_read(reads(chain_id, 4), prefer_target=target)] == blocks
    after = {a: [(c, c._sock) for c in cs] for a, cs in client._data._conns.items()}
    assert after == conns, "the refusal neither closed nor replaced a connection"


async def test_a_read_answered_from_its_thread_has_the_chunks_bytes_and_checksums(
    cluster: StorageCluster, client: StorageClient
) -> None:
    """The node sends a read's answer from the thread that read it: whole chunks, ranges at offsets, a short chunk
    (less data than its size) and a range past its end come with their own bytes and their CRC-32C, back to back."""
    chain = (await cluster.routing()).chains[0]
    blocks = await write_chunks(client, chain.chain_id, 2)
    short = os.urandom(1000)
    ok = await client.batch_write(
        [ChunkWrite(chain_id=chain.chain_id, inode_id=INODE, chunk_index=2, data=short, chunk_size=CHUNK)]
    )
    assert all(r.ok for r in ok)
    asks = [(0, 0, CHUNK), (1, 1234, 5000), (2, 0, 1000), (2, 900, 4096), (1, CHUNK - 1, 1)]
    expect = [blocks[0], blocks[1][1234:6234], short, short[900:], blocks[1][-1:]]
    ios = [
        spb.ReadIO(
            chain_id=chain.chain_id,
            chain_version=chain.version,
            chunk_id=spb.ChunkId(inode_id=INODE, chunk_index=i),
            offset_bytes=off,
            length_bytes=n,
        )
        for i, off, n in asks
    ]
    request = spb.BatchReadRequest(ios=ios, transport=spb.DATA_TRANSPORT_BULK).SerializeToString()
    view = RoutingView(await cluster.routing())
    for target in chain.targets:  # every replica answers the same
        node = view.node(target.node_id)
        assert node is not None and node.data
        conn = DataConnection(node.data, CLUSTER_TOKEN)
        try:
            sinks = [memoryview(bytearray(len(e))) for e in expect]
            raw, crcs = await conn.read(request, _into(sinks))
        finally:
            conn.close()
        results = spb.BatchReadResponse.FromString(bytes(raw)).results
        assert [r.status for r in results] == [spb.CHUNK_IO_STATUS_OK] * len(asks)
        assert [r.length_bytes for r in results] == [len(e) for e in expect]
        assert [bytes(s) for s in sinks] == expect
        assert [r.checksum.value for r in results] == [crc32c_of(e) for e in expect] == crcs


def _damage(cluster: StorageCluster, target: mgmtd_pb2.Target, index: int) -> None:
    """Overwrite a few bytes of chunk ``index``'s file on ``target`` (the file its meta.sqlite row names)."""
    damage(chunk_file(cluster, target.node_id, target.target_id, INODE, index))


async def test_a_chunk_damaged_on_disk_is_refused_on_the_data_path_and_repaired(
    cluster: StorageCluster, client: StorageClient
) -> None:
    """A ``read`` of a chunk whose file was damaged on disk: the node checks the whole chunk against its stored CRC
    before it sends anything, answers CHECKSUM_MISMATCH (no bytes), for a whole chunk and for a range of it alike,
    and has the copy repaired from the head; StorageClient, sent there first, gets the bytes from another replica."""
    chain = (await cluster.routing()).chains[0]
    blocks = await write_chunks(client, chain.chain_id, 2)
    bad = chain.targets[1]
    node = RoutingView(await cluster.routing()).node(bad.node_id)
    assert node is not None and node.data

    async def read_from_bad(index: int, offset: int, length: int) -> tuple[spb.ReadResult, bytes, int | None]:
        io = spb.ReadIO(chain_id=chain.chain_id, chain_version=chain.version, offset_bytes=offset, length_bytes=length,
                        chunk_id=spb.ChunkId(inode_id=INODE, chunk_index=index))  # fmt: skip
        request = spb.BatchReadRequest(ios=[io], transport=spb.DATA_TRANSPORT_BULK).SerializeToString()
        sink = memoryview(bytearray(length))
        conn = DataConnection(node.data, CLUSTER_TOKEN)
        try:
            raw, crcs = await conn.read(request, lambda raw: [sink] if _ok(raw) else [])
        finally:
            conn.close()
        return spb.BatchReadResponse.FromString(bytes(raw)).results[0], bytes(sink), (crcs or [None])[0]

    for index, offset, length in ((0, 0, CHUNK), (1, 4096, 1000)):
        _damage(cluster, bad, index)
        result, _, crc = await read_from_bad(index, offset, length)
        assert result.status == spb.CHUNK_IO_STATUS_CHECKSUM_MISMATCH and crc is None
        assert "do not match the checksum" in result.message

        async def repaired(index: int = index, offset: int = offset, length: int = length) -> bool:
            result, data, crc = await read_from_bad(index, offset, length)
            want = blocks[index][offset : offset + length]
            return result.status == spb.CHUNK_IO_STATUS_OK and data == want and crc == result.checksum.value

        await eventually(repaired, timeout_s=20, what=f"chunk {index}'s damaged copy repaired")

    _damage(cluster, bad, 0)
    got = (await client.batch_read(reads(chain.chain_id, 1), prefer_target=bad.target_id))[0]
    assert got.ok and got.target_id != bad.target_id and bytes(got.data) == blocks[0]


def _ok(raw: bytearray) -> bool:
    return spb.BatchReadResponse.FromString(bytes(raw)).results[0].status == spb.CHUNK_IO_STATUS_OK


def _into(sinks: list[memoryview]) -> Callable[[bytearray], list[memoryview]]:
    """A ``read`` layout that puts the answer's bytes into ``sinks``, whatever the response."""
    return lambda raw: sinks


async def _read_capabilities(cluster: StorageCluster, chain_id: int, expiry: int) -> list[bytes]:
    """A good read capability for INODE's chunks on ``chain_id``, then bad ones: none, another file's, an expired
    one, and the file's for chunks on another chain."""
    key = capability_key(CLUSTER_TOKEN)
    info = await cluster.routing()
    here = layout_on(info, chain_id, CHUNK)
    elsewhere = layout_on(info, next(c.chain_id for c in info.chains if c.chain_id != chain_id), CHUNK)
    return [
        make_capability(key, INODE, False, expiry, here),
        b"",
        make_capability(key, INODE + 1, False, expiry, here),
        make_capability(key, INODE, False, 1, here),
        make_capability(key, INODE, False, expiry, elsewhere),
    ]


async def test_user_reads_on_the_data_path_need_the_files_io_capability(
    cluster: StorageCluster, client: StorageClient
) -> None:
    chain_id = (await cluster.routing()).chains[0].chain_id
    blocks = await write_chunks(client, chain_id, 2)
    admin = cluster.client()
    try:
        await admin.identity.create_user(mgmtd_pb2.CreateUserRequest(name="reader", role=common_pb2.ROLE_USER))
        issued = await admin.identity.issue_token(mgmtd_pb2.IssueTokenRequest(user_name="reader"))
        token = issued.token
    finally:
        await admin.close()
    expiry = time.time_ns() + 60 * 10**9
    mg = cluster.client(token)
    user = StorageClient(mg, token, retry_deadline_s=2.0)
    try:
        good, *bad = await _read_capabilities(cluster, chain_id, expiry)
        for capability in bad:
            with pytest.raises(StorageIoError) as err:
                await user.batch_read(reads(chain_id, 2, capability=capability))
            assert err.value.code is grpc.StatusCode.PERMISSION_DENIED
        assert [bytes(o.data) for o in await user.batch_read(reads(chain_id, 2, capability=good))] == blocks
        assert user._streams == {} and user.data_stats["tcp_pulls"] >= 1
        # Revoked while its data-path connections stay open: each read checks the token again (the nodes cache
        # mgmtd's answer for at most 5 s), so the open connections stop serving it.
        admin = cluster.client()
        try:
            await admin.identity.revoke_token(mgmtd_pb2.RevokeTokenRequest(token_id=issued.token_info.token_id))
        finally:
            await admin.close()
        deadline = time.monotonic() + 20
        while True:
            try:
                await user.batch_read(reads(chain_id, 2, capability=good))
            except (StorageIoError, RpcError) as refused:  # (RpcError: mgmtd's, when the routing view was due)
                assert refused.code is grpc.StatusCode.UNAUTHENTICATED
                break
            assert time.monotonic() < deadline, "a revoked token still reads on its open connections"
            await asyncio.sleep(0.5)
    finally:
        await user.close()
    await mg.close()
    routing = cluster.client()  # the reader's token is revoked: routing through the cluster's
    stranger = StorageClient(routing, "not-a-token", retry_deadline_s=2.0)
    try:
        with pytest.raises(StorageIoError) as err:  # the data path's handshake refuses the token
            await stranger.batch_read(reads(chain_id, 1, capability=good))
        assert err.value.code is grpc.StatusCode.UNAUTHENTICATED
    finally:
        await stranger.close()
        await routing.close()


async def test_a_same_host_read_needs_one_mapped_place_per_io(cluster: StorageCluster, client: StorageClient) -> None:
    info = await cluster.routing()
    chain = info.chains[0]
    blocks = await write_chunks(client, chain.chain_id, 2)
    node = next(n for n in cluster.nodes if n.info["node_id"] == chain.targets[0].node_id)
    tcp = DataConnection(str(node.info["data"]), CLUSTER_TOKEN, host_id())
    try:
        unix = str((await tcp.handshake())["unix"])
    finally:
        tcp.close()
    request = spb.BatchReadRequest(
        transport=spb.DATA_TRANSPORT_BULK,
        ios=[
            spb.ReadIO(
                chain_id=chain.chain_id,
                chain_version=chain.version,
                chunk_id=spb.ChunkId(inode_id=INODE, chunk_index=i),
                length_bytes=CHUNK,
            )
            for i in range(2)
        ],
    ).SerializeToString()
    region = ShmRegion(2 * CHUNK, 1)
    conn = DataConnection(f"unix:{unix}", CLUSTER_TOKEN, host_id())
    try:
        bad_places = ([(1, 0, CHUNK)], [(1, CHUNK + 1, CHUNK), (1, 0, CHUNK)], [(1, 0, CHUNK), (1, CHUNK, CHUNK - 1)])
        for places in bad_places:  # one place for two reads, one past the region's end, one too small
            with pytest.raises(DataRefused) as err:
                await conn.read(request, lambda raw: [], ([(p[0], p[1], p[2]) for p in places], [region]))
            assert err.value.code == "INVALID_ARGUMENT", err.value
        assert bytes(region.view) == bytes(2 * CHUNK), "a refused read writes nothing"
        raw, checksums = await conn.read(request, lambda raw: [], ([(1, 0, CHUNK), (1, CHUNK, CHUNK)], [region]))
        results = spb.BatchReadResponse.FromString(raw).results
        assert checksums is None and [r.status for r in results] == [spb.CHUNK_IO_STATUS_OK] * 2
        assert [bytes(region.view[i * CHUNK : (i + 1) * CHUNK]) for i in range(2)] == blocks
    finally:
        conn.close()
        region.close()
