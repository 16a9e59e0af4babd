"""StatFs reports the storage targets' disks (issue 16, defect 7: ``df`` showed meta's configured 1 TiB).

The figures are the sizes and free bytes of the distinct file systems the targets live on (all targets
of this test cluster share one), divided by the replication factor (3), as the proto documents.
"""

from __future__ import annotations

import asyncio
import os
from fractions import Fraction

import hf3fs
from ff_rpc.client import one_call
from ff_testing.cluster import CLUSTER_TOKEN
from fireflyer.storage.v1 import storage_pb2 as spb
from fireflyer.storage.v1.storage_client import StorageServiceClient

from .conftest import MetaCluster

# Other processes on this machine write to the same disk meanwhile (and meta keeps its figure a few seconds).
FREE_TOLERANCE_BYTES = 2 << 30


async def _target_paths(cluster: MetaCluster) -> tuple[list[str], Fraction]:
    info = await cluster.storage.routing()
    paths = []
    for node in info.nodes:
        grpc_address = next((e.address for e in node.endpoints if e.name == "grpc"), "")
        if not any(t.node_id == node.node_id for c in info.chains for t in c.targets):
            continue
        resp = await one_call(
            grpc_address, StorageServiceClient, lambda c: c.list_targets(spb.ListTargetsRequest()), token=CLUSTER_TOKEN
        )
        paths += [t.path for t in resp.targets]
    replication = Fraction(sum(len(c.targets) for c in info.chains), len(info.chains))
    return paths, replication


def _distinct_filesystems(paths: list[str]) -> dict[int, os.statvfs_result]:
    return {os.stat(p).st_dev: os.statvfs(p) for p in paths}


def test_statfs_is_the_targets_disks_counted_once(cluster: MetaCluster, fs: hf3fs.FileSystem) -> None:
    paths, replication = asyncio.run(_target_paths(cluster))
    assert len(paths) >= 6 and replication == 3
    disks = _distinct_filesystems(paths)
    s = fs.statfs()
    after = _distinct_filesystems(paths)
    capacity = sum(v.f_blocks * v.f_frsize for v in disks.values())
    free_before = sum(v.f_bavail * v.f_frsize for v in disks.values())
    free_after = sum(v.f_bavail * v.f_frsize for v in after.values())
    assert s.capacity_bytes == int(capacity / replication)
    low, high = min(free_before, free_after) - FREE_TOLERANCE_BYTES, max(free_before, free_after) + FREE_TOLERANCE_BYTES
    assert int(low / replication) <= s.free_bytes <= int(high / replication)
    assert s.free_bytes <= s.capacity_bytes


def test_df_of_a_folder_under_a_small_quota_shows_the_quota(
    fs: hf3fs.FileSystem, admin_fs: hf3fs.FileSystem, home: str
) -> None:
    admin_fs.set_quota(home, max_bytes=8 << 20)
    with fs.open(f"{home}/f", "wb") as f:
        f.write(b"q" * (3 << 20))
    s = fs.statfs(home)
    assert (s.capacity_bytes, s.used_bytes, s.free_bytes) == (8 << 20, 3 << 20, 5 << 20)
    assert fs.statfs(f"{home}/f") == s  # a file: its folder's quota
    whole = fs.statfs()
    assert whole.capacity_bytes > 8 << 20 and s.num_inodes == whole.num_inodes
    admin_fs.set_quota(home, max_bytes=1 << 60)  # more room than the cluster has: the cluster's figures
    assert fs.statfs(home).capacity_bytes == whole.capacity_bytes
