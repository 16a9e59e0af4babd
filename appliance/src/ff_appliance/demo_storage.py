"""The storage part of ``fireflyer demo``: chunks written through chains of 3, read back from every replica.

The client verifies each chunk's checksums.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence

from ff_cluster import MgmtdClient
from fireflyer.mgmtd.v1 import mgmtd_pb2 as pb
from hf3fs.admin import render_chains
from hf3fs.storage_client import ChunkRead, ChunkWrite, StorageClient

DEMO_INODE = 0xDE30  # a fixed inode id: the demo overwrites its own chunks when run again
CHUNK_BYTES = 1 << 20
NUM_CHUNKS = 8


class StorageDemoError(Exception):
    """Storage did not return what was written."""


async def storage_section(
    addresses: Sequence[str], token: str, step: Callable[[str], None], say: Callable[[str], None]
) -> None:
    """Write the demo's chunks through the chains and read each back from every replica (``step``, ``say``: output).

    Raises:
        StorageDemoError: a write was not acknowledged, or a replica returned other bytes than were written.
    """
    mgmtd = MgmtdClient(list(addresses), token=token)
    client = StorageClient(mgmtd, token)
    try:
        info = (await mgmtd.mgmtd.get_routing_info(pb.GetRoutingInfoRequest())).routing_info
        step(f"write {NUM_CHUNKS} chunks of {CHUNK_BYTES >> 20} MiB through the chains (CRAQ, 3 replicas)")
        say(render_chains(info))
        chains = [c.chain_id for c in info.chains]
        payloads = [os.urandom(CHUNK_BYTES) for _ in range(NUM_CHUNKS)]
        writes = [
            ChunkWrite(
                chain_id=chains[i % len(chains)], inode_id=DEMO_INODE, chunk_index=i, data=data, chunk_size=CHUNK_BYTES
            )
            for i, data in enumerate(payloads)
        ]
        outcomes = await client.batch_write(writes)
        bad = [f"chunk {i}: {o.message or o.status}" for i, o in enumerate(outcomes) if not o.ok]
        if bad:
            raise StorageDemoError("; ".join(bad))
        say(f"acknowledged by every chain's tail: committed versions {sorted({o.committed_version for o in outcomes})}")
        step("read every chunk back from every replica")
        await _read_every_replica(client, info, writes, payloads, say)
    finally:
        await client.close()
        await mgmtd.close()


async def _read_every_replica(
    client: StorageClient,
    info: pb.RoutingInfo,
    writes: list[ChunkWrite],
    payloads: list[bytes],
    say: Callable[[str], None],
) -> None:
    by_chain = {c.chain_id: [t.target_id for t in c.targets] for c in info.chains}
    reads = 0
    for write, payload in zip(writes, payloads, strict=True):
        for target_id in by_chain[write.chain_id]:
            request = ChunkRead(
                chain_id=write.chain_id, inode_id=DEMO_INODE, chunk_index=write.chunk_index, length=CHUNK_BYTES
            )
            (got,) = await client.batch_read([request], prefer_target=target_id)
            if not got.ok or got.target_id != target_id or bytes(got.data) != payload:
                raise StorageDemoError(
                    f"chunk {write.chunk_index} asked of target {target_id}, answered by {got.target_id}: "
                    f"{'content differs' if got.ok else got.message}"
                )
            reads += 1
    digest = hashlib.sha256(b"".join(payloads)).hexdigest()[:16]
    say(f"{reads} reads ({len(writes)} chunks x 3 replicas) all equal to what was written (sha256 {digest}...)")
