"""A real cluster per test: mgmtd and three storage services as processes, chains of 3."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ff_testing.cluster import StorageCluster, start_cluster, tail_logs
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
