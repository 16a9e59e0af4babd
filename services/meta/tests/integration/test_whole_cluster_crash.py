"""Whole-cluster power loss as a hostile operator makes it: every process of a real cluster (mgmtd, three storage
services, meta) SIGKILLed at once after files were written, closed, synced, renamed and removed through the
client, then all started again from their folders and databases."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from ff_testing.cluster import Cluster, running_cluster
from ff_testing.process import kill_all
from ff_testing.waiting import wait_until

from .test_meta_crash import _live_files, _stored_inodes, _tree_problems

META = {
    "session_lease_s": 3.0,
    "background_interval_s": 0.3,
    "default_chunk_size": 1 << 16,
    "writable_capability_ttl_s": 2.0,  # GC waits twice that after a file's last session
}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with running_cluster(tmp_path / "cluster", meta=META) as c:
        yield c


def _kill_everything(cluster: Cluster) -> None:
    """SIGKILL every process at once, as a power loss."""
    kill_all([cluster.storage.mgmtd, *cluster.storage.nodes, *cluster.meta])


async def _start_everything(cluster: Cluster) -> None:
    """Start every process again at once from its folder (meta on its address, as its clients know it)."""
    cluster.storage.mgmtd.start()
    for node in cluster.storage.nodes:
        node.start()
    for meta in cluster.meta:
        meta.start_again()
    for service in (cluster.storage.mgmtd, *cluster.storage.nodes, *cluster.meta):
        await service.ready(60)
    await cluster.storage.wait_all_serving(timeout_s=60)


def _content(n: int) -> bytes:
    return (f"file {n} ".encode() * 40_000)[: 1000 + 37_000 * n]


def test_power_loss_of_the_whole_cluster_keeps_every_acknowledged_file(cluster: Cluster) -> None:
    """Files closed before the power loss read back whole; renames and removes stay done; a file open for writing
    across it (synced before) keeps its synced bytes and takes more writes after the restart, under its session or
    a new one; the tree is consistent and the removed files' chunks leave storage."""
    fs = cluster.connect("alice", close_retry_s=120)
    try:
        fs.mkdir("/pl")
        for n in range(12):
            with fs.open(f"/pl/f{n}", "wb") as f:
                f.write(_content(n))
        for n in range(0, 12, 3):
            fs.rename(f"/pl/f{n}", f"/pl/renamed{n}")
        for n in range(1, 12, 3):
            fs.remove(f"/pl/f{n}")
        kept = {f"renamed{n}" if n % 3 == 0 else f"f{n}": _content(n) for n in range(12) if n % 3 != 1}
        open_file = fs.open("/pl/open", "wb", buffering=0)
        open_file.write(b"before " * 30_000)
        open_file.fsync()
        _kill_everything(cluster)
        asyncio.run(_start_everything(cluster))
        open_file.write(b"after " * 30_000)
        open_file.close()
        kept["open"] = b"before " * 30_000 + b"after " * 30_000
    finally:
        with contextlib.suppress(Exception):
            fs.close()
    with cluster.connect("alice") as fresh:
        assert sorted(fresh.listdir("/pl")) == sorted(kept)
        for name, data in kept.items():
            with fresh.open(f"/pl/{name}", "rb") as f:
                assert f.read() == data, name
    db = cluster.folder / "meta.db"
    wait_until(lambda: not _tree_problems(db), 30, "a consistent tree")
    wait_until(lambda: _stored_inodes(cluster.folder) <= _live_files(db), 30, "removed files' chunks collected")
