"""Writes as one ``call`` on the data path (BatchWrite and ForwardUpdates with their bytes, no push and no
gRPC call): the RPCs' own checks and access rules with the connection's caller, refusals that leave the
connection open, and a peer of another data path version refused with both versions named."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import time
from collections.abc import Mapping

import grpc
import pytest

from ff_fsprotocol.capability import capability_key, make_capability
from ff_fsprotocol.datapath import (
    DATA_PATH_VERSION,
    DataConnection,
    DataConnectionPool,
    DataPathError,
    DataRefused,
    encode_header,
    recv_header,
    send_parts,
)
from ff_fsprotocol.routing import RoutingView
from ff_rpc.auth import CLUSTER_PRINCIPAL
from ff_storage.dataserver import DataServer, SendAnswer, TransferBoxes
from ff_testing.cluster import CLUSTER_TOKEN, StorageCluster
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2
from fireflyer.storage.v1 import storage_pb2 as spb
from hf3fs import ChunkRead, ChunkWrite, StorageClient, StorageIoError, crc32c_of

from .conftest import layout_on

CHUNK = 512 * 1024
INODE = 21


def _write_request(chain: object, index: int, data: bytes, transfer_id: str, capability: bytes = b"") -> bytes:
    return spb.BatchWriteRequest(
        ios=[
            spb.WriteIO(
                chain_id=chain.chain_id,
                chain_version=chain.version,  # type: ignore[attr-defined]
                chunk_id=spb.ChunkId(inode_id=INODE, chunk_index=index),
                chunk_size_bytes=CHUNK,
                offset_bytes=0,
                length_bytes=len(data),
                checksum=spb.Checksum(type=spb.CHECKSUM_TYPE_CRC32C, value=crc32c_of(data)),
                transfer=spb.TransferRef(transfer_id=transfer_id, offset_bytes=0),
                io_capability=capability,
            )
        ]
    ).SerializeToString()


async def _read(client: StorageClient, chain_id: int, index: int) -> bytes | None:
    [got] = await client.batch_read([ChunkRead(chain_id=chain_id, inode_id=INODE, chunk_index=index, length=CHUNK)])
    return bytes(got.data) if got.ok else None


def _data_address(info: mgmtd_pb2.RoutingInfo, node_id: int) -> str:
    node = RoutingView(info).node(node_id)
    assert node is not None and node.data
    return node.data


async def _user_token(cluster: StorageCluster, name: str) -> str:
    admin = cluster.client()
    try:
        await admin.identity.create_user(mgmtd_pb2.CreateUserRequest(name=name, role=common_pb2.ROLE_USER))
        return (await admin.identity.issue_token(mgmtd_pb2.IssueTokenRequest(user_name=name))).token
    finally:
        await admin.close()


async def test_writes_are_one_call_on_the_data_path_and_a_refusal_keeps_the_connection(
    cluster: StorageCluster, client: StorageClient
) -> None:
    info = await cluster.routing()
    chain = info.chains[0]
    blocks = [os.urandom(CHUNK) for _ in range(3)]
    ios = [
        ChunkWrite(chain_id=chain.chain_id, inode_id=INODE, chunk_index=i, data=b, chunk_size=CHUNK)
        for i, b in enumerate(blocks)
    ]
    assert all(r.ok for r in await client.batch_write(ios))
    assert client.data_stats["calls"] >= 1, "bulk writes go as data-path calls"
    for i, b in enumerate(blocks):
        assert await _read(client, chain.chain_id, i) == b  # every replica took them (reads pick any)

    head = _data_address(info, chain.targets[0].node_id)
    conn = DataConnection(head, CLUSTER_TOKEN)
    try:
        new = os.urandom(CHUNK)
        with pytest.raises(DataRefused) as err:
            await conn.call("BatchWrite", b"\xff\xff not a request", "t1", [new])
        assert err.value.code == "INVALID_ARGUMENT"
        with pytest.raises(DataRefused) as err:
            await conn.call("DeleteEverything", _write_request(chain, 0, new, "t2"), "t2", [new])
        assert err.value.code == "UNIMPLEMENTED"
        # bytes that do not match the request's checksum: answered per IO, as BatchWrite does
        bad = _write_request(chain, 0, new, "t3")
        resp = spb.BatchWriteResponse.FromString(await conn.call("BatchWrite", bad, "t3", [new[:-1] + b"x"]))
        assert resp.results[0].status == spb.CHUNK_IO_STATUS_CHECKSUM_MISMATCH
        with pytest.raises(DataRefused) as err:  # an IO larger than the limit: BatchWrite's own check
            huge = spb.BatchWriteRequest.FromString(_write_request(chain, 0, new, "t4"))
            huge.ios[0].length_bytes = 1 << 40
            await conn.call("BatchWrite", huge.SerializeToString(), "t4", [new])
        assert err.value.code == "INVALID_ARGUMENT"
        assert await _read(client, chain.chain_id, 0) == blocks[0], "nothing refused was written"
        sock = conn._sock
        resp = spb.BatchWriteResponse.FromString(
            await conn.call("BatchWrite", _write_request(chain, 0, new, "t5"), "t5", [new])
        )
        assert resp.results[0].status == spb.CHUNK_IO_STATUS_OK and conn._sock is sock, "same connection"
        assert await _read(client, chain.chain_id, 0) == new
    finally:
        conn.close()
    conn = DataConnection(head, CLUSTER_TOKEN)
    try:  # a malformed header closes the connection: the stream cannot be trusted to be in step
        sock = await conn._connect()
        await send_parts(sock, [encode_header({"op": "call", "method": "BatchWrite", "request": 0, "length": 0})])
        with pytest.raises(DataPathError):
            await conn._read_header()
    finally:
        conn.close()


async def test_data_path_calls_keep_the_rpcs_access_rules(cluster: StorageCluster, client: StorageClient) -> None:
    info = await cluster.routing()
    chain = info.chains[0]
    old = os.urandom(CHUNK)
    assert (
        await client.batch_write(
            [ChunkWrite(chain_id=chain.chain_id, inode_id=INODE, chunk_index=0, data=old, chunk_size=CHUNK)]
        )
    )[0].ok
    token = await _user_token(cluster, "writer")
    head = _data_address(info, chain.targets[0].node_id)
    middle = _data_address(info, chain.targets[1].node_id)
    new = os.urandom(CHUNK)
    key = capability_key(CLUSTER_TOKEN)
    expiry = time.time_ns() + 60 * 10**9
    here, elsewhere = layout_on(info, chain.chain_id, CHUNK), layout_on(info, info.chains[1].chain_id, CHUNK)
    conn = DataConnection(head, token)
    try:
        for capability in (
            b"",
            make_capability(key, INODE, False, expiry, here),
            make_capability(key, INODE + 1, True, expiry, here),
            # the file's own, but its layout puts chunk 0 on another chain, or its chunks are of another size: such
            # chunks would be found by neither its length nor its removal
            make_capability(key, INODE, True, expiry, elsewhere),
            make_capability(key, INODE, True, expiry, dataclasses.replace(here, chunk_size=CHUNK * 2)),
        ):
            with pytest.raises(DataRefused) as err:  # no IoCapability, a read-only one, another file's, misplaced
                await conn.call("BatchWrite", _write_request(chain, 0, new, "u1", capability), "u1", [new])
            assert err.value.code == "PERMISSION_DENIED"
    finally:
        conn.close()
    conn = DataConnection(middle, token)
    try:  # a user may not pose as a predecessor in the chain
        update = spb.ForwardUpdatesRequest(
            from_target_id=chain.targets[0].target_id,
            updates=[
                spb.ChunkUpdate(
                    chain_id=chain.chain_id,
                    chain_version=chain.version,
                    chunk_id=spb.ChunkId(inode_id=INODE, chunk_index=0),
                    update_type=spb.UPDATE_TYPE_WRITE,
                    update_version=99,
                    chunk_size_bytes=CHUNK,
                    length_bytes=CHUNK,
                    checksum=spb.Checksum(type=spb.CHECKSUM_TYPE_CRC32C, value=crc32c_of(new)),
                    full_chunk_replace=True,
                    transfer=spb.TransferRef(transfer_id="u2", offset_bytes=0),
                )
            ],
        )
        with pytest.raises(DataRefused) as err:
            await conn.call("ForwardUpdates", update.SerializeToString(), "u2", [new])
        assert err.value.code == "PERMISSION_DENIED"
    finally:
        conn.close()
    for target in chain.targets:
        got = await client.batch_read(
            [ChunkRead(chain_id=chain.chain_id, inode_id=INODE, chunk_index=0, length=CHUNK)],
            prefer_target=target.target_id,
        )
        assert got[0].ok and bytes(got[0].data) == old, "nothing was written on any replica"
    user_mg = cluster.client(token)
    user = StorageClient(user_mg, token, retry_deadline_s=2.0)
    try:  # the user's own client: refused as over gRPC, with the same status
        with pytest.raises(StorageIoError) as refused:
            await user.batch_write(
                [ChunkWrite(chain_id=chain.chain_id, inode_id=INODE, chunk_index=0, data=new, chunk_size=CHUNK)]
            )
        assert refused.value.code is grpc.StatusCode.PERMISSION_DENIED
        good = make_capability(key, INODE, True, expiry, here)
        assert (
            await user.batch_write(
                [
                    ChunkWrite(
                        chain_id=chain.chain_id,
                        inode_id=INODE,
                        chunk_index=0,
                        data=new,
                        chunk_size=CHUNK,
                        capability=good,
                    )
                ]
            )
        )[0].ok
        assert user.data_stats["calls"] == 1
    finally:
        await user.close()
        await user_mg.close()
    assert await _read(client, chain.chain_id, 0) == new


async def test_a_client_of_another_data_path_version_is_refused_naming_both() -> None:
    server = DataServer(TransferBoxes(), CLUSTER_TOKEN, None, read=_no_read, calls={})
    await server.start("127.0.0.1:0", shm=False)
    loop = asyncio.get_running_loop()
    try:
        for hello, named in (
            ({"op": "auth", "token": CLUSTER_TOKEN, "version": DATA_PATH_VERSION - 1}, f"{DATA_PATH_VERSION - 1}"),
            ({"op": "auth", "token": CLUSTER_TOKEN}, "no version (an older release)"),
        ):
            sock = socket.socket()
            sock.setblocking(False)
            try:
                await loop.sock_connect(sock, ("127.0.0.1", server.port))
                await loop.sock_sendall(sock, encode_header(hello))
                answer = await recv_header(sock, "node")
                assert answer["ok"] is False and answer["code"] == "FAILED_PRECONDITION", answer
                assert named in answer["error"] and f"version {DATA_PATH_VERSION}" in answer["error"], answer
                assert await loop.sock_recv(sock, 1) == b"", "the node closes the connection"
            finally:
                sock.close()
    finally:
        await server.stop()


async def _no_read(
    request: memoryview, send: SendAnswer | None
) -> tuple[bytes, list[bytes | None], list[memoryview] | None]:
    raise AssertionError("no read expected")


async def test_a_call_whose_caller_gives_up_is_cancelled_on_the_node() -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def slow(request: memoryview, attached: Mapping[str, bytearray]) -> bytes:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return b""

    server = DataServer(TransferBoxes(), CLUSTER_TOKEN, None, read=_no_read, calls={"BatchWrite": slow})
    await server.start("127.0.0.1:0", shm=False)
    conn = DataConnection(f"127.0.0.1:{server.port}", CLUSTER_TOKEN)
    try:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5):
                await conn.call("BatchWrite", b"request", "", [])
        assert started.is_set()
        await asyncio.wait_for(cancelled.wait(), 5)  # as gRPC cancels a handler whose deadline passed
    finally:
        conn.close()
        await server.stop()


async def _old_node(port: int, version: int) -> asyncio.Server:
    """A node of another release on ``port``: it takes any token and names ``version`` at the handshake."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        size = int.from_bytes(await reader.readexactly(4), "big")
        await reader.readexactly(size)
        writer.write(encode_header({"ok": True, "host": "", "version": version}))
        await writer.drain()
        writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", port)


async def test_a_node_that_comes_back_speaking_another_version_gets_no_call() -> None:
    calls: list[bytes] = []

    async def echo(request: memoryview, attached: Mapping[str, bytearray]) -> bytes:
        calls.append(bytes(request))
        return b"answer to " + request

    new = DataServer(TransferBoxes(), CLUSTER_TOKEN, None, read=_no_read, calls={"BatchWrite": echo})
    await new.start("127.0.0.1:0", shm=False)
    address = f"127.0.0.1:{new.port}"
    pool = DataConnectionPool(CLUSTER_TOKEN, host="")
    old: asyncio.Server | None = None
    try:
        assert await pool.call(address, "BatchWrite", b"x", "", []) == b"answer to x"
        await new.stop()
        old = await _old_node(new.port, DATA_PATH_VERSION - 1)
        with pytest.raises((OSError, DataPathError)):  # the connection to the stopped node is gone
            await pool.call(address, "BatchWrite", b"y", "", [])
        with pytest.raises(DataRefused) as refused:  # a new connection: refused at its handshake, nothing sent
            await pool.call(address, "BatchWrite", b"z", "", [])
        assert refused.value.code == "FAILED_PRECONDITION"
        assert f"data path version {DATA_PATH_VERSION - 1}" in refused.value.message
        assert f"this end speaks version {DATA_PATH_VERSION}" in refused.value.message
        assert calls == [b"x"]
    finally:
        pool.close()
        if old is not None:
            old.close()
            await old.wait_closed()
        await new.stop()


async def test_calls_of_one_size_reuse_a_buffer_and_each_gets_its_own_bytes() -> None:
    """The node receives a call's bytes into a buffer an earlier call gave back (no new 4 MiB each time), yet
    every call sees exactly its own bytes; bytes a handler still holds a view of are never received over."""
    seen: list[bytes] = []
    held: list[memoryview] = []

    async def take(request: memoryview, attached: Mapping[str, bytearray]) -> bytes:
        (blob,) = attached.values()
        seen.append(bytes(blob))
        if request == b"hold":
            held.append(memoryview(blob)[:16])  # work that outlives the call
        return b"ok"

    server = DataServer(TransferBoxes(), CLUSTER_TOKEN, None, read=_no_read, calls={"BatchWrite": take})
    await server.start("127.0.0.1:0", shm=False)
    conn = DataConnection(f"127.0.0.1:{server.port}", CLUSTER_TOKEN)
    size = 1 << 20
    payloads = [os.urandom(size) for _ in range(4)]
    try:
        assert await conn.call("BatchWrite", b"first", "t0", [payloads[0]]) == b"ok"
        assert server.payloads.held_bytes == size  # given back after the call
        assert await conn.call("BatchWrite", b"hold", "t1", [payloads[1]]) == b"ok"
        assert server.payloads.held_bytes == 0  # taken again, and kept out now: the handler holds a view
        for n in (2, 3):
            assert await conn.call("BatchWrite", b"next", f"t{n}", [payloads[n]]) == b"ok"
            assert server.payloads.held_bytes == size
        assert seen == payloads
        assert bytes(held[0]) == payloads[1][:16]  # never overwritten by the later calls
    finally:
        conn.close()
        await server.stop()


async def test_bytes_over_a_callers_inbox_limit_are_refused_before_they_are_received() -> None:
    async def take(request: memoryview, attached: Mapping[str, bytearray]) -> bytes:
        return bytes(request)

    boxes = TransferBoxes(max_owner_bytes=1 << 20)
    server = DataServer(boxes, CLUSTER_TOKEN, None, read=_no_read, calls={"BatchWrite": take})
    await server.start("127.0.0.1:0", shm=False)
    address = f"127.0.0.1:{server.port}"
    conn = DataConnection(address, CLUSTER_TOKEN)
    try:
        with pytest.raises((OSError, DataPathError)) as err:
            await conn.push("big", [os.urandom(2 << 20)])
        if isinstance(err.value, DataPathError):
            assert "RESOURCE_EXHAUSTED" in str(err.value)
        with pytest.raises((OSError, DataPathError)):
            await conn.call("BatchWrite", b"request", "big-call", [os.urandom(2 << 20)])
        assert boxes.reserve(CLUSTER_PRINCIPAL.name, 1 << 20)  # nothing of either was kept
        boxes.release(CLUSTER_PRINCIPAL.name, 1 << 20)
        await conn.push("small", [b"x" * (512 << 10)])  # within the limit: taken as usual (a new connection)
        assert await conn.call("BatchWrite", b"request", "small-call", [b"y" * (512 << 10)]) == b"request"
        waiting = 1 << 19  # "small" waits for its write
        assert not boxes.reserve(CLUSTER_PRINCIPAL.name, (1 << 20) - waiting + 1)
        assert boxes.reserve(CLUSTER_PRINCIPAL.name, (1 << 20) - waiting)
    finally:
        conn.close()
        await server.stop()
