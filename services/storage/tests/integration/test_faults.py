"""The storage plane under faults, with real processes: 3 storage services, chains of 3."""

from __future__ import annotations

import asyncio
import os
import random
import time

import grpc
import pytest

from ff_rpc import RpcClient, RpcError, open_channel
from ff_testing.cluster import CLUSTER_TOKEN, StorageCluster, tail_logs
from fireflyer.storage.v1 import storage_pb2 as spb
from fireflyer.storage.v1 import storage_pb2_grpc
from hf3fs import ChunkRead, ChunkWrite, StorageClient, crc32c_of

from .conftest import chunk_file, damage

CHUNK = 16 * 1024


def _reads(chains: dict[tuple[int, int], int], keys: list[tuple[int, int]], length: int = CHUNK) -> list[ChunkRead]:
    return [ChunkRead(chain_id=chains[k], inode_id=k[0], chunk_index=k[1], length=length) for k in keys]


async def _read_every_replica(cluster: StorageCluster, client: StorageClient, expected: dict, chains: dict) -> None:
    info = await cluster.routing()
    for chain in info.chains:
        keys = [k for k in expected if chains[k] == chain.chain_id]
        for target in chain.targets:
            for i in range(0, len(keys), 200):
                part = keys[i : i + 200]
                for _ in range(20):  # until every node has the routing the client has
                    await client.routing.refresh(force=True)
                    got = await client.batch_read(_reads(chains, part), prefer_target=target.target_id)
                    if all(g.target_id == target.target_id for g in got):
                        break
                    await asyncio.sleep(0.1)
                for k, g in zip(part, got, strict=True):
                    assert g.ok and g.target_id == target.target_id, (k, g.status, g.message)
                    assert bytes(g.data) == expected[k], f"chunk {k} differs on target {target.target_id}"


async def test_kill_a_storage_service_mid_stream(cluster: StorageCluster, client: StorageClient) -> None:
    info = await cluster.routing()
    chain_ids = [c.chain_id for c in info.chains]
    acked: dict[tuple[int, int], bytes] = {}
    chains: dict[tuple[int, int], int] = {}
    stop = asyncio.Event()
    reads_during_outage = 0

    async def writer(w: int) -> None:
        index = 0
        while not stop.is_set():
            batch = []
            for _ in range(10):
                key = (1000 + w, index)
                index += 1
                chains[key] = chain_ids[index % len(chain_ids)]
                batch.append(
                    ChunkWrite(
                        chain_id=chains[key],
                        inode_id=key[0],
                        chunk_index=key[1],
                        data=os.urandom(CHUNK),
                        chunk_size=CHUNK,
                    )
                )
            results = await client.batch_write(batch)
            for io, r in zip(batch, results, strict=True):
                if r.ok:
                    acked[(io.inode_id, io.chunk_index)] = bytes(io.data)

    writers = [asyncio.create_task(writer(w)) for w in range(3)]
    try:
        while len(acked) < 300:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        victim = cluster.nodes[1]
        victim.kill()
        killed_at, before = time.monotonic(), len(acked)
        # The outage lasts until 100 reads were checked and writes went on without the victim (mgmtd takes it
        # out of its chains after its 2 s lease): no fixed window, 60 s at most.
        while reads_during_outage < 100 or len(acked) <= before + 30:
            assert time.monotonic() - killed_at < 60, f"writes stalled: {len(acked) - before} acked since the kill"
            sample = random.sample(sorted(acked), 20)
            got = await client.batch_read(_reads(chains, sample))
            for k, g in zip(sample, got, strict=True):
                assert g.ok, f"{k}: {g.status} {g.message!r} from target {g.target_id}\n" + tail_logs(cluster.folder)
                assert bytes(g.data) == acked[k], f"{k}: other bytes from target {g.target_id}, version {g.version}"
            reads_during_outage += 20
            await asyncio.sleep(0.1)
        assert len(acked) > before, "writes did not go on while a replica was down"
        victim.start()
        await victim.ready()
        while len(acked) < max(before + 600, 1000):  # noqa: ASYNC110 (600 after the kill, 1000 in all)
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.gather(*writers)
    assert len(acked) >= 1000, len(acked)
    info = await cluster.wait_all_serving(timeout_s=60)
    assert reads_during_outage >= 100
    assert all(c.version > 1 for c in info.chains), "the chains never changed"
    await _read_every_replica(cluster, client, acked, chains)


async def test_corrupt_chunk_is_detected_served_elsewhere_and_repaired(
    cluster: StorageCluster, client: StorageClient
) -> None:
    info = await cluster.routing()
    chain = info.chains[0]
    data = os.urandom(CHUNK)
    assert (
        await client.batch_write(
            [ChunkWrite(chain_id=chain.chain_id, inode_id=5, chunk_index=3, data=data, chunk_size=CHUNK)]
        )
    )[0].ok
    bad = chain.targets[1]
    path = chunk_file(cluster, bad.node_id, bad.target_id, 5, 3)
    damage(path)
    got = (
        await client.batch_read(
            [ChunkRead(chain_id=chain.chain_id, inode_id=5, chunk_index=3, length=CHUNK)], prefer_target=bad.target_id
        )
    )[0]
    assert got.ok and got.target_id != bad.target_id and bytes(got.data) == data
    deadline = time.monotonic() + 10
    while True:
        again = (
            await client.batch_read(
                [ChunkRead(chain_id=chain.chain_id, inode_id=5, chunk_index=3, length=CHUNK)],
                prefer_target=bad.target_id,
            )
        )[0]
        if again.target_id == bad.target_id:
            break
        assert time.monotonic() < deadline, "the bad copy was not repaired\n" + tail_logs(cluster.folder)
        await asyncio.sleep(0.2)
    assert again.ok and bytes(again.data) == data


async def test_concurrent_writers_of_one_chunk_converge(cluster: StorageCluster, client: StorageClient) -> None:
    info = await cluster.routing()
    chain = info.chains[1]
    clients = [StorageClient(cluster.client(), CLUSTER_TOKEN) for _ in range(3)]

    async def write(c: StorageClient, w: int) -> None:
        for n in range(8):
            payload = bytes([w * 16 + n]) * 4096
            offset = random.randrange(0, CHUNK - 4096)
            r = await c.batch_write(
                [
                    ChunkWrite(
                        chain_id=chain.chain_id,
                        inode_id=9,
                        chunk_index=0,
                        data=payload,
                        offset=offset,
                        chunk_size=CHUNK,
                    )
                ]
            )
            assert r[0].ok, r[0].message

    try:
        await asyncio.gather(*(write(c, w) for w, c in enumerate(clients)))
    finally:
        for c in clients:
            await c.close()
    seen = set()
    for target in chain.targets:
        got = (
            await client.batch_read(
                [ChunkRead(chain_id=chain.chain_id, inode_id=9, chunk_index=0, length=CHUNK)],
                prefer_target=target.target_id,
            )
        )[0]
        assert got.ok and got.target_id == target.target_id
        seen.add((got.version, crc32c_of(got.data)))
    assert len(seen) == 1 and next(iter(seen))[0] == 24, seen


async def _raw(cluster: StorageCluster, method: str, request: object, token: str = CLUSTER_TOKEN) -> object:
    info = await cluster.routing()
    head = info.chains[0].targets[0].node_id
    address = next(e.address for n in info.nodes if n.node_id == head for e in n.endpoints if e.name == "grpc")
    channel = open_channel(address)
    try:
        return await RpcClient(token=token).unary(
            getattr(storage_pb2_grpc.StorageServiceStub(channel), method), request
        )
    finally:
        await channel.close()


def _write(chain: object, version: int, **kw: object) -> spb.BatchWriteRequest:
    data = kw.pop("data", b"abc")
    fields = {
        "chain_id": chain.chain_id,
        "chain_version": version,  # type: ignore[attr-defined]
        "chunk_id": spb.ChunkId(inode_id=77, chunk_index=0),
        "chunk_size_bytes": CHUNK,
        "offset_bytes": 0,
        "length_bytes": len(data),
        "checksum": spb.Checksum(type=1, value=crc32c_of(data)),
        "inline_data": data,
        **kw,
    }
    return spb.BatchWriteRequest(ios=[spb.WriteIO(**fields)])


async def _nothing_written(client: StorageClient, chain_id: int) -> None:
    got = await client.batch_read([ChunkRead(chain_id=chain_id, inode_id=77, chunk_index=0, length=3)])
    assert got[0].status == spb.CHUNK_IO_STATUS_CHUNK_NOT_FOUND


async def test_stale_chain_version_and_bad_input_are_refused(cluster: StorageCluster, client: StorageClient) -> None:
    chain = (await cluster.routing()).chains[0]
    stale = await _raw(cluster, "BatchWrite", _write(chain, chain.version - 1))
    assert stale.results[0].status == spb.CHUNK_IO_STATUS_STALE_CHAIN_VERSION  # type: ignore[attr-defined]
    bad_cases = {
        "past the chunk": _write(chain, chain.version, offset_bytes=CHUNK - 1),
        "inode 0": _write(chain, chain.version, chunk_id=spb.ChunkId(inode_id=0, chunk_index=0)),
        "oversized": _write(chain, chain.version, chunk_size_bytes=64 << 20, length_bytes=17 << 20, data=b""),
        "unknown chain": _write(chain, chain.version, chain_id=9999),
        "length mismatch": _write(chain, chain.version, length_bytes=10),
    }
    for name, request in bad_cases.items():
        with pytest.raises(RpcError) as err:
            await _raw(cluster, "BatchWrite", request)
        assert err.value.code is grpc.StatusCode.INVALID_ARGUMENT, name
    bad_checksum = _write(chain, chain.version, checksum=spb.Checksum(type=1, value=1))
    assert (await _raw(cluster, "BatchWrite", bad_checksum)).results[0].status == 6  # type: ignore[attr-defined]
    with pytest.raises(RpcError) as err:
        await _raw(cluster, "BatchWrite", _write(chain, chain.version), token="not-a-token")
    assert err.value.code is grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(RpcError) as err:
        await _raw(cluster, "CreateTarget", spb.CreateTargetRequest(target_id=5, chain_id=1, disk_index=7))
    assert err.value.code is grpc.StatusCode.INVALID_ARGUMENT
    await _nothing_written(client, chain.chain_id)
