"""A head that stops being its chain's head in the middle of a long batch, with real processes: 3 storage
services, chains of 3 (found through the FUSE mount: a flush of 1,025 small writes to one chunk, whose head lost
mgmtd for a moment under load)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator

import pytest

from ff_testing.cluster import StorageCluster
from hf3fs import ChunkRead, ChunkWrite, StorageClient

CHUNK = 16 * 1024
PIECE = 16  # bytes per write: CHUNK // PIECE writes fill the chunk


@pytest.fixture
async def patient(cluster: StorageCluster) -> AsyncIterator[StorageClient]:
    """A client whose calls wait as long as a head stopped for seconds takes to answer."""
    async with cluster.storage_client(timeout_s=120.0, retry_deadline_s=120.0) as sc:
        yield sc


async def _replicas(cluster: StorageCluster, client: StorageClient, chain_id: int, inode_id: int) -> dict[int, bytes]:
    """The chunk's bytes on each target of its chain, read from that target."""
    info = await cluster.wait_all_serving(timeout_s=60)
    chain = next(c for c in info.chains if c.chain_id == chain_id)
    out: dict[int, bytes] = {}
    for target in chain.targets:
        for _ in range(50):  # until every node has the routing the client has
            await client.routing.refresh(force=True)
            read = ChunkRead(chain_id=chain_id, inode_id=inode_id, chunk_index=0, length=CHUNK)
            (got,) = await client.batch_read([read], prefer_target=target.target_id)
            if got.target_id == target.target_id:
                break
            await asyncio.sleep(0.1)
        assert got.ok and got.target_id == target.target_id, (got.status, got.message)
        out[target.target_id] = bytes(got.data)
    return out


async def test_a_head_stopped_mid_batch_starts_no_update_once_another_head_took_over(
    cluster: StorageCluster, patient: StorageClient
) -> None:
    """The head applies a batch's writes to one chunk one round after another. Stopped for longer than its lease, it
    is taken out of the chain and a new head serves; resumed, it must not go on versioning the rest of the batch
    and forwarding it down the chain past the new head (the replicas then hold writes the head never saw, and
    reads differ by replica). Every acknowledged write must be on every replica."""
    info = await cluster.wait_all_serving()
    chain = info.chains[0]
    pid = next(p.info["pid"] for p in cluster.nodes if p.info["node_id"] == chain.targets[0].node_id)
    inode_id = 4242
    writes = [
        ChunkWrite(
            chain_id=chain.chain_id,
            inode_id=inode_id,
            chunk_index=0,
            offset=k * PIECE,
            data=bytes([1 + k % 250]) * PIECE,
            chunk_size=CHUNK,
        )
        for k in range(CHUNK // PIECE)
    ]
    batch = asyncio.create_task(patient.batch_write(writes))
    await asyncio.sleep(0.5)  # some rounds done at the head
    os.kill(pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(4.0)  # twice the tests' 2 s lease: mgmtd takes the head out of the chain
    finally:
        os.kill(pid, signal.SIGCONT)
    results = await batch
    assert all(r.ok for r in results), [(r.status, r.message) for r in results if not r.ok][:3]
    expected = b"".join(bytes(w.data) for w in writes)
    replicas = await _replicas(cluster, patient, chain.chain_id, inode_id)
    missing = {t: _pieces_missing(data, expected) for t, data in replicas.items()}
    assert missing == {t: [] for t in replicas}, f"acknowledged writes missing, by target: {missing}"


def _pieces_missing(data: bytes, expected: bytes) -> list[int]:
    """The writes (by number) whose bytes ``data`` does not hold, the first 10."""
    return [
        k for k in range(len(expected) // PIECE) if data[k * PIECE : (k + 1) * PIECE] != expected[k * PIECE :][:PIECE]
    ][:10]
