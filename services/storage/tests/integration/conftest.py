"""A real cluster per test: mgmtd and three storage services as processes, chains of 3."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ff_fsprotocol.capability import CapLayout
from ff_testing.cluster import StorageCluster, start_cluster, tail_logs
from fireflyer.mgmtd.v1 import mgmtd_pb2
from hf3fs import StorageClient


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[StorageCluster]:
    c = await start_cluster(tmp_path / "cluster")
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
async def client(cluster: StorageCluster) -> AsyncIterator[StorageClient]:
    async with cluster.storage_client(retry_deadline_s=30.0) as sc:
        yield sc


def logs(cluster: StorageCluster) -> str:
    return tail_logs(cluster.folder)


def chunk_file(cluster: StorageCluster, node_id: int, target_id: int, inode: int, index: int) -> Path:
    """The file that holds the chunk's newest version on a target, as the engine's own records name it.

    Its durable pending row while the commit's rows are not written yet (they follow the ack, without a sync), else
    its chunk row: one transaction replaces the one by the other, so a reader sees exactly one of them.
    """
    root = cluster.folder / f"s{node_id - 100}" / "disk0" / f"target-{target_id}"
    key = (inode, index)
    with contextlib.closing(sqlite3.connect(root / "meta.sqlite")) as db:
        rows = (
            db.execute(
                "SELECT file FROM pending WHERE inode_id = ? AND chunk_index = ? ORDER BY version DESC LIMIT 1", key
            ).fetchall()
            or db.execute("SELECT file FROM chunks WHERE inode_id = ? AND chunk_index = ?", key).fetchall()
        )
    [(name,)] = rows
    return root / "chunks" / name


def damage(path: Path) -> None:
    """Overwrite a few bytes in the middle of a chunk file (a test damaging a file on purpose)."""
    with open(path, "r+b") as f:
        f.seek(100)
        f.write(b"\x00garbage\x00")


def layout_on(info: mgmtd_pb2.RoutingInfo, chain_id: int, chunk_size: int) -> CapLayout:
    """A one-chain file layout over the cluster's chain table that puts every chunk on ``chain_id`` (for the
    IoCapabilities the tests make as meta would)."""
    table = info.chain_tables[0]
    return CapLayout(table.table_id, chunk_size, 1, list(table.chain_ids).index(chain_id), 0)
