"""Chain updates happen once under retries (update ids), and a partial write to a chunk with a damaged copy
succeeds and repairs it; real processes, chains of 3."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ff_rpc import RpcClient, open_channel
from ff_storage.core.linearizability import READ, WRITE, Operation, check_history
from ff_testing.cluster import CLUSTER_TOKEN, StorageCluster, start_cluster, tail_logs
from fireflyer.mgmtd.v1 import mgmtd_pb2 as mpb
from fireflyer.storage.v1 import storage_pb2 as spb
from fireflyer.storage.v1 import storage_pb2_grpc
from hf3fs import ChunkRead, ChunkWrite, StorageClient, crc32c_of

from .conftest import chunk_file, damage

CHUNK = 64 * 1024


def _address(info: mpb.RoutingInfo, node_id: int) -> str:
    return next(e.address for n in info.nodes if n.node_id == node_id for e in n.endpoints if e.name == "grpc")


async def _write_raw(
    info: mpb.RoutingInfo, chain: mpb.Chain, data: bytes, update_id: spb.UpdateId, inode: int = 41
) -> spb.UpdateResult:
    """One BatchWrite straight to the chain's head, with the given update id (what a retry sends)."""
    io = spb.WriteIO(
        chain_id=chain.chain_id,
        chain_version=chain.version,
        chunk_id=spb.ChunkId(inode_id=inode, chunk_index=0),
        chunk_size_bytes=CHUNK,
        length_bytes=len(data),
        checksum=spb.Checksum(type=1, value=crc32c_of(data)),
        inline_data=data,
        update_id=update_id,
    )
    channel = open_channel(_address(info, chain.targets[0].node_id))
    try:
        stub = storage_pb2_grpc.StorageServiceStub(channel)
        resp = await RpcClient(token=CLUSTER_TOKEN).unary(stub.BatchWrite, spb.BatchWriteRequest(ios=[io]))
        result: spb.UpdateResult = resp.results[0]
        return result
    finally:
        await channel.close()


async def _read(client: StorageClient, chain_id: int, inode: int = 41, target: int = 0) -> tuple[bytes, int, int]:
    got = (
        await client.batch_read(
            [ChunkRead(chain_id=chain_id, inode_id=inode, chunk_index=0, length=CHUNK)], prefer_target=target
        )
    )[0]
    assert got.ok, (got.status, got.message)
    return bytes(got.data), got.version, got.target_id


async def _new_head(cluster: StorageCluster, chain_id: int, old_node: int) -> tuple[mpb.RoutingInfo, mpb.Chain]:
    deadline = time.monotonic() + 30
    while True:
        info = await cluster.routing()
        chain = next(c for c in info.chains if c.chain_id == chain_id)
        head = chain.targets[0]
        if head.node_id != old_node and head.public_state == mpb.PUBLIC_TARGET_STATE_SERVING:
            return info, chain
        assert time.monotonic() < deadline, "no new head\n" + tail_logs(cluster.folder)
        await asyncio.sleep(0.1)


async def _write_to_new_head(
    cluster: StorageCluster, chain_id: int, old_node: int, data: bytes, update_id: spb.UpdateId
) -> spb.UpdateResult:
    """``_write_raw`` to the chain's new head, again with fresh routing while it answers STALE_CHAIN_VERSION.

    mgmtd may publish the chain's next version before the new head has it, or move the chain again (the dead
    node's target taken out); a write refused so was not applied (what StorageClient does with it too).
    """
    deadline = time.monotonic() + 30
    while True:
        info, chain = await _new_head(cluster, chain_id, old_node)
        result = await _write_raw(info, chain, data, update_id)
        if result.status != spb.CHUNK_IO_STATUS_STALE_CHAIN_VERSION or time.monotonic() > deadline:
            return result
        await asyncio.sleep(0.1)


async def test_a_retry_to_the_same_head_gets_the_original_result(
    cluster: StorageCluster, client: StorageClient
) -> None:
    info = await cluster.routing()
    chain = info.chains[0]
    first = spb.UpdateId(client_id=b"writer-a", request_id=1)
    a = await _write_raw(info, chain, b"A" * 100, first)
    b = await _write_raw(info, chain, b"B" * 200, spb.UpdateId(client_id=b"writer-b", request_id=1))
    assert (a.status, a.committed_version, b.status, b.committed_version) == (1, 1, 1, 2)
    again = await _write_raw(info, chain, b"A" * 100, first)
    assert again.status == spb.CHUNK_IO_STATUS_OK and again.committed_version == 1
    assert (again.chunk_length_bytes, again.chunk_checksum.value) == (100, crc32c_of(b"A" * 100))
    for target in chain.targets:  # B's write stays the last one everywhere
        data, version, _ = await _read(client, chain.chain_id, target=target.target_id)
        assert (data, version) == (b"B" * 200, 2)


async def test_an_update_id_reused_for_other_data_is_a_new_write(
    cluster: StorageCluster, client: StorageClient
) -> None:
    """A write that reuses an update id with other bytes is no retry: it is applied (not answered with the first
    write's result while its bytes are dropped); a true retry of either write still gets its own result."""
    info = await cluster.routing()
    chain = info.chains[0]
    reused = spb.UpdateId(client_id=b"writer-a", request_id=1)
    a = await _write_raw(info, chain, b"A" * 100, reused)
    z = await _write_raw(info, chain, b"Z" * 300, reused)
    assert (a.status, a.committed_version, z.status, z.committed_version) == (1, 1, 1, 2), (a, z)
    assert (z.chunk_length_bytes, z.chunk_checksum.value) == (300, crc32c_of(b"Z" * 300))
    z_again = await _write_raw(info, chain, b"Z" * 300, reused)
    a_again = await _write_raw(info, chain, b"A" * 100, reused)
    assert (z_again.committed_version, a_again.committed_version) == (2, 1)
    for target in chain.targets:  # Z's bytes everywhere, applied once
        data, version, _ = await _read(client, chain.chain_id, target=target.target_id)
        assert (data, version) == (b"Z" * 300, 2)


@pytest.fixture(params=[True, False], ids=["ids", "no-ids"])
async def id_cluster(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[StorageCluster, bool]]:
    on = bool(request.param)
    c = await start_cluster(tmp_path / "cluster", extra={"update-ids": str(on).lower()})
    try:
        yield c, on
    finally:
        c.stop()


async def test_a_retry_after_the_head_died_is_not_applied_again(id_cluster: tuple[StorageCluster, bool]) -> None:
    """The write reached every replica, the head died before answering; the client's retry goes to the new
    head. With update ids it gets the original result; without them (the setting off) it is a new write that
    lands after another writer's acknowledged one, which readers see as X -> Y -> X."""
    cluster, ids_on = id_cluster
    mg = cluster.client()
    client = StorageClient(mg, CLUSTER_TOKEN, retry_deadline_s=30.0)
    history: list[Operation] = []

    async def read(chain: mpb.Chain) -> bytes:
        start = time.monotonic()
        data, _, _ = await _read(client, chain.chain_id)
        history.append(Operation(key=0, kind=READ, value=data[:1], start=start, end=time.monotonic()))
        return data

    try:
        info = await cluster.routing()
        chain = info.chains[0]
        x = spb.UpdateId(client_id=b"writer-x", request_id=7)
        x_start = time.monotonic()  # the writer's call: its first attempt to the retry's answer
        assert (await _write_raw(info, chain, b"X" * 100, x)).committed_version == 1
        assert await read(chain) == b"X" * 100
        old = chain.targets[0].node_id
        cluster.nodes[old - 101].kill()  # as if it died before answering the writer
        info, chain = await _new_head(cluster, chain.chain_id, old)
        y_start = time.monotonic()
        y = await _write_to_new_head(
            cluster, chain.chain_id, old, b"Y" * 100, spb.UpdateId(client_id=b"writer-y", request_id=1)
        )
        history.append(Operation(key=0, kind=WRITE, value=b"Y", start=y_start, end=time.monotonic()))
        assert (y.status, y.committed_version) == (1, 2)
        assert await read(chain) == b"Y" * 100
        retry = await _write_to_new_head(cluster, chain.chain_id, old, b"X" * 100, x)
        history.append(Operation(key=0, kind=WRITE, value=b"X", start=x_start, end=time.monotonic()))
        data = await read(chain)
        _, version, _ = await _read(client, chain.chain_id)
        if ids_on:
            assert (retry.status, retry.committed_version) == (1, 1)
            assert (data, version) == (b"Y" * 100, 2)
            assert check_history(history).ok
        else:
            assert (retry.status, retry.committed_version) == (1, 3)
            assert (data, version) == (b"X" * 100, 3)
            assert not check_history(history).ok  # X -> Y -> X, as the checker sees it
    finally:
        await client.close()
        await mg.close()


def _damage(cluster: StorageCluster, node_id: int, target_id: int, inode: int) -> None:
    damage(chunk_file(cluster, node_id, target_id, inode, 0))


@pytest.mark.parametrize("position", [0, 1, 2], ids=["head", "middle", "tail"])
async def test_a_partial_write_to_a_chunk_with_a_damaged_copy_succeeds_and_repairs_it(
    cluster: StorageCluster, client: StorageClient, position: int
) -> None:
    info = await cluster.routing()
    chain = info.chains[1]
    inode = 50 + position
    base = os.urandom(CHUNK)
    write = ChunkWrite(chain_id=chain.chain_id, inode_id=inode, chunk_index=0, data=base, chunk_size=CHUNK)
    assert (await client.batch_write([write]))[0].ok
    bad = chain.targets[position]
    _damage(cluster, bad.node_id, bad.target_id, inode)
    patch = ChunkWrite(
        chain_id=chain.chain_id, inode_id=inode, chunk_index=0, data=b"patch", offset=1000, chunk_size=CHUNK
    )
    got = (await client.batch_write([patch]))[0]
    assert got.ok, f"{got.status} {got.message}\n" + tail_logs(cluster.folder)
    expected = base[:1000] + b"patch" + base[1005:]
    assert got.chunk_checksum == crc32c_of(expected)
    for target in chain.targets:  # every copy, the damaged one too, holds the patched chunk
        data, version, served_by = await _read(client, chain.chain_id, inode, target=target.target_id)
        assert served_by == target.target_id and data == expected and version == got.committed_version


async def test_a_recovered_replica_knows_the_updates_it_was_not_there_for(
    cluster: StorageCluster, client: StorageClient
) -> None:
    """The tail is down while X is written; it comes back through recovery (full-chunk replaces carry the
    chunk's update ids), then the other two die and it alone serves the chain: X's retry there gets the original
    result, not a second application."""
    info = await cluster.routing()
    chain = info.chains[0]
    tail = chain.targets[2].node_id
    cluster.nodes[tail - 101].kill()
    deadline = time.monotonic() + 30
    while True:  # X is written by the other two only
        info = await cluster.routing()
        chain = next(c for c in info.chains if c.chain_id == chain.chain_id)
        serving = [t.node_id for t in chain.targets if t.public_state == mpb.PUBLIC_TARGET_STATE_SERVING]
        if tail not in serving:
            break
        assert time.monotonic() < deadline, "the tail was not taken out of service"
        await asyncio.sleep(0.1)
    x = spb.UpdateId(client_id=b"writer-x", request_id=3)
    assert (await _write_raw(info, chain, b"X" * 100, x, inode=43)).committed_version == 1
    cluster.nodes[tail - 101].start()
    await cluster.nodes[tail - 101].ready()
    await cluster.wait_all_serving()
    for node_id in {101, 102, 103} - {tail}:
        cluster.nodes[node_id - 101].kill()
    deadline = time.monotonic() + 30
    while True:  # the recovered tail heads the chain alone
        info = await cluster.routing()
        chain = next(c for c in info.chains if c.chain_id == chain.chain_id)
        head = chain.targets[0]
        if head.node_id == tail and head.public_state == mpb.PUBLIC_TARGET_STATE_SERVING:
            break
        assert time.monotonic() < deadline, "the recovered tail did not become the head\n" + tail_logs(cluster.folder)
        await asyncio.sleep(0.1)
    retry = await _write_raw(info, chain, b"X" * 100, x, inode=43)
    assert (retry.status, retry.committed_version) == (spb.CHUNK_IO_STATUS_OK, 1), retry
    data, version, _ = await _read(client, chain.chain_id, inode=43)
    assert (data, version) == (b"X" * 100, 1)


async def _write_batch(
    info: mpb.RoutingInfo, chain: mpb.Chain, ios: list[tuple[int, bytes, spb.UpdateId]], inode: int
) -> list[spb.UpdateResult]:
    """One BatchWrite of ``(offset, data, update id)`` writes into chunk 0 of ``inode``, straight to the head."""
    return await _write_chunks(info, chain, [(inode, offset, data, update_id) for offset, data, update_id in ios])


async def _write_chunks(
    info: mpb.RoutingInfo, chain: mpb.Chain, ios: list[tuple[int, int, bytes, spb.UpdateId]]
) -> list[spb.UpdateResult]:
    """One BatchWrite of ``(inode, offset, data, update id)`` writes into chunk 0 of each inode, to the head."""
    pbs = [
        spb.WriteIO(
            chain_id=chain.chain_id,
            chain_version=chain.version,
            chunk_id=spb.ChunkId(inode_id=inode, chunk_index=0),
            chunk_size_bytes=CHUNK,
            offset_bytes=offset,
            length_bytes=len(data),
            checksum=spb.Checksum(type=1, value=crc32c_of(data)),
            inline_data=data,
            update_id=update_id,
        )
        for inode, offset, data, update_id in ios
    ]
    channel = open_channel(_address(info, chain.targets[0].node_id))
    try:
        stub = storage_pb2_grpc.StorageServiceStub(channel)
        resp = await RpcClient(token=CLUSTER_TOKEN).unary(stub.BatchWrite, spb.BatchWriteRequest(ios=pbs))
        return list(resp.results)
    finally:
        await channel.close()


async def test_writes_to_one_chunk_in_one_batch_are_one_version_and_each_retry_is_known_everywhere(
    cluster: StorageCluster, client: StorageClient
) -> None:
    """A batch's writes to one chunk (a database's pages here and there) apply at the head as one version, one trip
    down the chain (each took a durable chain write in turn), in order (the later over the earlier), and every
    replica remembers each write's id: a retry of the batch, or of one write at a new head after the old one died,
    gets its first result and applies nothing again (a later write stays)."""
    info = await cluster.routing()
    chain = info.chains[0]
    inode = 44
    ios = [
        (0, b"a" * 100, spb.UpdateId(client_id=b"db", request_id=1)),
        (1000, b"b" * 50, spb.UpdateId(client_id=b"db", request_id=2)),
        (50, b"c" * 100, spb.UpdateId(client_id=b"db", request_id=3)),  # over the end of the first
    ]
    expected = b"a" * 50 + b"c" * 100 + bytes(850) + b"b" * 50
    first = await _write_batch(info, chain, ios, inode)
    assert [(r.status, r.committed_version) for r in first] == [(spb.CHUNK_IO_STATUS_OK, 1)] * 3, first
    assert {(r.chunk_length_bytes, r.chunk_checksum.value) for r in first} == {(1050, crc32c_of(expected))}
    again = await _write_batch(info, chain, ios, inode)  # the client's retry of the whole batch
    assert [(r.status, r.committed_version) for r in again] == [(spb.CHUNK_IO_STATUS_OK, 1)] * 3, again
    for target in chain.targets:
        data, version, served_by = await _read(client, chain.chain_id, inode, target=target.target_id)
        assert (served_by, data[:1050], version) == (target.target_id, expected, 1)

    old = chain.targets[0].node_id
    cluster.nodes[old - 101].kill()

    async def at_new_head(io: tuple[int, bytes, spb.UpdateId]) -> spb.UpdateResult:
        deadline = time.monotonic() + 30
        while True:  # fresh routing while the new head answers STALE_CHAIN_VERSION (as _write_to_new_head)
            info, chain = await _new_head(cluster, chain_id, old)
            [result] = await _write_batch(info, chain, [io], inode)
            if result.status != spb.CHUNK_IO_STATUS_STALE_CHAIN_VERSION or time.monotonic() > deadline:
                return result
            await asyncio.sleep(0.1)

    chain_id = chain.chain_id
    later = await at_new_head((1000, b"L" * 50, spb.UpdateId(client_id=b"other", request_id=1)))
    assert (later.status, later.committed_version) == (spb.CHUNK_IO_STATUS_OK, 2), later
    retry = await at_new_head(ios[1])  # "b" at 1000 again: already committed, not applied
    assert (retry.status, retry.committed_version) == (spb.CHUNK_IO_STATUS_OK, 1), retry
    data, version, _ = await _read(client, chain.chain_id, inode)
    assert (data[:1050], version) == (expected[:1000] + b"L" * 50, 2)


async def test_a_batch_whose_merged_chunks_outweigh_one_call_still_goes_down_the_chain(tmp_path: Path) -> None:
    """Two small writes to each of many chunks: each chunk's pair goes down the chain as one full-chunk replace, so
    what the head forwards (whole chunks) can be far more than what the client sent (a few pages). The successor
    takes at most ``max_batch_bytes`` in one call: what the head forwards goes in calls within it, and every write
    lands on every replica (one call of whole chunks was refused as too costly, and the batch failed)."""
    cluster = await start_cluster(tmp_path / "cluster", extra={"max_batch_bytes": 4 * CHUNK, "forward_timeout_s": 3})
    try:
        info = await cluster.routing()
        chain = info.chains[0]
        inodes = range(60, 72)  # 12 whole chunks to forward: 3 calls' worth
        ios = [
            (inode, offset, bytes([inode]) * 100, spb.UpdateId(client_id=b"spread", request_id=2 * inode + n))
            for inode in inodes
            for n, offset in enumerate((0, CHUNK - 100))
        ]
        results = await _write_chunks(info, chain, ios)
        got = [(r.status, r.committed_version) for r in results]
        assert got == [(spb.CHUNK_IO_STATUS_OK, 1)] * len(ios), [r.message for r in results][:2]
        async with cluster.storage_client(retry_deadline_s=10.0) as client:
            for target in chain.targets:
                for inode in inodes:
                    data, version, served_by = await _read(client, chain.chain_id, inode, target=target.target_id)
                    expected = bytes([inode]) * 100 + bytes(CHUNK - 200) + bytes([inode]) * 100
                    assert (served_by, data, version) == (target.target_id, expected, 1)
    finally:
        cluster.stop()
