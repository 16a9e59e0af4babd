"""Write and read back through chains of 3 real storage processes."""

from __future__ import annotations

import os

from ff_storage.testing import StorageCluster
from hf3fs import ChunkRead, ChunkWrite, StorageClient

CHUNK = 256 * 1024


async def test_write_then_read_every_replica(cluster: StorageCluster, client: StorageClient) -> None:
    info = await cluster.routing()
    assert len(info.chains) == 2 and all(len(c.targets) == 3 for c in info.chains)
    data = [os.urandom(CHUNK) for _ in range(8)]
    ios = [ChunkWrite(chain_id=info.chains[i % 2].chain_id, inode_id=7, chunk_index=i, data=d, chunk_size=CHUNK)
           for i, d in enumerate(data)]  # fmt: skip
    results = await client.batch_write(ios)
    assert [r.status for r in results] == [1] * 8, results
    for chain in info.chains:
        for target in chain.targets:
            reads = [ChunkRead(chain_id=io.chain_id, inode_id=7, chunk_index=io.chunk_index, length=CHUNK)
                     for io in ios if io.chain_id == chain.chain_id]  # fmt: skip
            got = await client.batch_read(reads, prefer_target=target.target_id)
            assert all(g.ok and g.target_id == target.target_id for g in got), got
            assert [bytes(g.data) for g in got] == [data[r.chunk_index] for r in reads]
    partial = await client.batch_write([ChunkWrite(chain_id=ios[0].chain_id, inode_id=7, chunk_index=0, data=b"xyz",
                                                   offset=10, chunk_size=CHUNK)])  # fmt: skip
    assert partial[0].ok and partial[0].committed_version == 2
    got = await client.batch_read([ChunkRead(chain_id=ios[0].chain_id, inode_id=7, chunk_index=0, length=20)])
    assert bytes(got[0].data) == data[0][:10] + b"xyz" + data[0][13:20]
