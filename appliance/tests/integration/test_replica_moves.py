"""Moving a chain's replica with the appliance's calls (``replicas.apply_move``, what ``join --storage`` and ``leave``
do) keeps the chain's data: where the moved replica is the chain's only serving copy (a chain of one replica), the
new one joins and syncs from it before it leaves. Real mgmtd and storage processes."""

from __future__ import annotations

from pathlib import Path

from ff_appliance import replicas
from ff_testing.cluster import start_cluster
from ff_testing.process import CLUSTER_TOKEN
from fireflyer.mgmtd.v1 import mgmtd_pb2 as mpb
from hf3fs import ChunkRead, ChunkWrite, StorageClient

INODE = 7070
DATA = b"the only copy " * 300


async def test_moving_a_chain_s_only_replica_keeps_its_data(tmp_path: Path) -> None:
    cluster = await start_cluster(tmp_path / "cluster", num_nodes=2, targets_per_disk=1, replication=1)
    mgmtd = cluster.client()
    storage = StorageClient(cluster.client(), CLUSTER_TOKEN, retry_deadline_s=30.0, timeout_s=5.0)
    try:
        chains = replicas.chain_nodes(await replicas.routing(mgmtd))
        chain_id = next(c for c, nodes in sorted(chains.items()) if nodes == [101])
        write = ChunkWrite(chain_id=chain_id, inode_id=INODE, chunk_index=0, data=DATA, chunk_size=1 << 16)
        assert (await storage.batch_write([write]))[0].ok
        move = replicas.Move(chain_id=chain_id, from_node=101, to_node=102)
        new_target = await replicas.apply_move(mgmtd, CLUSTER_TOKEN, move, sync_timeout_s=60.0)
        info = await replicas.routing(mgmtd)
        [chain] = [c for c in info.chains if c.chain_id == chain_id]
        assert [(t.target_id, t.node_id) for t in chain.targets] == [(new_target, 102)]
        assert chain.targets[0].public_state == mpb.PUBLIC_TARGET_STATE_SERVING
        [got] = await storage.batch_read(
            [ChunkRead(chain_id=chain_id, inode_id=INODE, chunk_index=0, length=len(DATA))]
        )
        assert got.ok and bytes(got.data) == DATA, got
    finally:
        await storage.close()
        await mgmtd.close()
        cluster.stop()
