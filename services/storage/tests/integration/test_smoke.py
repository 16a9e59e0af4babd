"""Write and read back through chains of 3 real storage processes."""

from __future__ import annotations

import os

import pytest

from ff_testing.cluster import StorageCluster
from hf3fs import ChunkRead, ChunkWrite, StorageClient, storage_client

CHUNK = 256 * 1024


async def test_write_then_read_every_replica(cluster: StorageCluster, client: StorageClient) -> None:
    info = await cluster.routing()
    assert len(info.chains) == 2 and all(len(c.targets) == 3 for c in info.chains)
    data = [os.urandom(CHUNK) for _ in range(8)]
    ios = [
        ChunkWrite(chain_id=info.chains[i % 2].chain_id, inode_id=7, chunk_index=i, data=d, chunk_size=CHUNK)
        for i, d in enumerate(data)
    ]
    results = await client.batch_write(ios)
    assert [r.status for r in results] == [1] * 8, results
    for chain in info.chains:
        for target in chain.targets:
            reads = [
                ChunkRead(chain_id=io.chain_id, inode_id=7, chunk_index=io.chunk_index, length=CHUNK)
                for io in ios
                if io.chain_id == chain.chain_id
            ]
            got = await client.batch_read(reads, prefer_target=target.target_id)
            assert all(g.ok and g.target_id == target.target_id for g in got), got
            assert [bytes(g.data) for g in got] == [data[r.chunk_index] for r in reads]
    partial = await client.batch_write(
        [ChunkWrite(chain_id=ios[0].chain_id, inode_id=7, chunk_index=0, data=b"xyz", offset=10, chunk_size=CHUNK)]
    )
    assert partial[0].ok and partial[0].committed_version == 2
    got = await client.batch_read([ChunkRead(chain_id=ios[0].chain_id, inode_id=7, chunk_index=0, length=20)])
    assert bytes(got[0].data) == data[0][:10] + b"xyz" + data[0][13:20]


async def test_the_client_reads_a_repeated_range_once_and_splits_large_batches(
    cluster: StorageCluster, client: StorageClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nodes refuse a range asked twice in one call and calls over their limits; the client sends the range
    once (both reads get it, each in its own buffer) and a node's IOs in calls within the limits."""
    chain = (await cluster.routing()).chains[0]
    data = os.urandom(CHUNK)
    ios = [
        ChunkWrite(chain_id=chain.chain_id, inode_id=8, chunk_index=i, data=data, chunk_size=CHUNK) for i in range(6)
    ]
    assert all(r.ok for r in await client.batch_write(ios))
    buffers = [bytearray(100), bytearray(100)]
    same = [
        ChunkRead(chain_id=chain.chain_id, inode_id=8, chunk_index=0, offset=7, length=100, buffer=b) for b in buffers
    ]
    got = await client.batch_read([*same, same[0]])
    assert all(g.ok and bytes(g.data) == data[7:107] for g in got), got
    assert buffers[0] == buffers[1] == data[7:107]
    monkeypatch.setattr(storage_client, "MAX_CALL_IOS", 4)  # as if the nodes took 4 IOs per call
    calls_before = client.read_calls
    reads = [ChunkRead(chain_id=chain.chain_id, inode_id=8, chunk_index=i, length=CHUNK) for i in range(6)]
    got = await client.batch_read(reads, prefer_target=chain.targets[0].target_id)
    assert all(g.ok and bytes(g.data) == data for g in got)
    assert client.read_calls - calls_before == 2
