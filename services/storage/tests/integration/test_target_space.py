"""ListTargets reports the disk each target lives on (capacity and free bytes from statvfs) and which file
system that is, so meta's StatFs can sum the cluster's space counting each file system once."""

from __future__ import annotations

import os

from ff_fsprotocol.shm import host_id
from ff_rpc.client import one_call
from ff_testing.cluster import CLUSTER_TOKEN, StorageCluster
from fireflyer.storage.v1 import storage_pb2 as spb
from fireflyer.storage.v1.storage_client import StorageServiceClient

# Other processes on this machine write to the same disk while the test runs.
FREE_TOLERANCE_BYTES = 1 << 30


async def _list_targets(address: str) -> list[spb.TargetInfo]:
    resp = await one_call(
        address, StorageServiceClient, lambda c: c.list_targets(spb.ListTargetsRequest()), token=CLUSTER_TOKEN
    )
    return list(resp.targets)


async def test_targets_report_their_file_system(cluster: StorageCluster) -> None:
    info = await cluster.routing()
    holders = {t.node_id for c in info.chains for t in c.targets}
    addresses = [e.address for n in info.nodes if n.node_id in holders for e in n.endpoints if e.name == "grpc"]
    targets = [t for a in addresses for t in await _list_targets(a)]
    assert len(targets) == sum(len(c.targets) for c in info.chains) == 6
    for t in targets:
        disk = os.statvfs(t.path)
        assert t.capacity_bytes == disk.f_blocks * disk.f_frsize > 0
        assert abs(t.free_bytes - disk.f_bavail * disk.f_frsize) <= FREE_TOLERANCE_BYTES
        assert t.free_bytes <= t.capacity_bytes
        assert t.filesystem_id == f"{host_id()}:{os.stat(t.path).st_dev}"
    # Every target of this cluster is under one temporary folder: one file system, one id.
    assert len({t.filesystem_id for t in targets}) == 1
