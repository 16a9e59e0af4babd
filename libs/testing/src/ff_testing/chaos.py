"""A linearizability workload for tests and benchmarks: shared chunks, storage services killed at random.

Writers and readers work on a few shared chunks of a real cluster while storage services are SIGKILLed and
restarted at random; every operation's start, end and result is recorded for
``core.linearizability.check_history``.

Each writer has its own ``StorageClient`` (its own client id) and writes whole small chunks holding a unique
value (writer id and counter); each reader has its own client too and reads whole chunks. A write that did
not answer OK is "maybe happened" (no end); a read that did not answer OK is left out; a chunk not found
reads as the initial value (None).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ff_storage.core.linearizability import READ, WRITE, Operation
from ff_testing.cluster import StorageCluster
from ff_testing.process import CLUSTER_TOKEN
from fireflyer.storage.v1 import storage_pb2 as spb
from hf3fs import ChunkRead, ChunkWrite, StorageClient

logger = logging.getLogger(__name__)
CHUNK_BYTES = 64
INODE = 4242


@dataclass
class ChaosStats:
    """What a chaos run did: operation counts, kills, and the history to check."""

    writes_ok: int = 0
    writes_unknown: int = 0
    reads_ok: int = 0
    reads_failed: int = 0
    kills: int = 0
    history: list[Operation] = field(default_factory=list)


def _encode(value: str) -> bytes:
    return value.encode().ljust(CHUNK_BYTES, b".")


def _decode(data: bytes) -> str:
    return bytes(data).rstrip(b".").decode()


async def run_chaos(
    cluster: StorageCluster,
    *,
    duration_s: float,
    num_writers: int = 3,
    num_readers: int = 3,
    num_chunks: int = 3,
    kill_every_s: tuple[float, float] = (2.0, 5.0),
    down_for_s: tuple[float, float] = (0.5, 3.0),
    seed: int = 0,
    stop_when: Callable[[list[Operation]], bool] | None = None,
) -> ChaosStats:
    """Run the workload for ``duration_s`` (kills only during it), then let every write finish.

    ``stop_when``: asked after every kill and restart with the history so far (writes still in flight in it
    with no end, as of unknown outcome); True ends the run early.
    """
    rng = random.Random(seed)
    info = await cluster.routing()
    chains = [c.chain_id for c in info.chains]
    keys = [(i, chains[i % len(chains)]) for i in range(num_chunks)]
    stats = ChaosStats()
    stop = asyncio.Event()
    origin = time.monotonic()
    clients = [
        StorageClient(cluster.client(), CLUSTER_TOKEN, retry_deadline_s=30.0, timeout_s=5.0, pending_retries=1_000_000)
        for _ in range(num_writers + num_readers)
    ]
    try:
        workers = [
            asyncio.create_task(_writer(clients[w], w, keys, stop, stats, origin, rng.random()))
            for w in range(num_writers)
        ]
        workers += [
            asyncio.create_task(_reader(clients[num_writers + r], r, keys, stop, stats, origin, rng.random()))
            for r in range(num_readers)
        ]
        await _kill_loop(cluster, rng, duration_s, kill_every_s, down_for_s, stats, stop_when)
        stop.set()
        await asyncio.gather(*workers)
    finally:
        stop.set()
        for c in clients:
            await c.close()
            await c._mgmtd.close()
    return stats


async def _kill_loop(
    cluster: StorageCluster,
    rng: random.Random,
    duration_s: float,
    every: tuple[float, float],
    down: tuple[float, float],
    stats: ChaosStats,
    stop_when: Callable[[list[Operation]], bool] | None,
) -> None:
    """One storage service down at a time, at random times: SIGKILL a chain's head, restart it, wait for serving.

    The head of a random chain is the node whose death leaves writes unanswered, which clients then retry. It
    stays down a while, restarts, and the next kill waits until every target serves again.
    """
    end = time.monotonic() + duration_s
    while time.monotonic() + every[1] + down[1] < end:  # only a cycle that ends in time (recovery aside)
        await asyncio.sleep(rng.uniform(*every))
        chain = rng.choice(list((await cluster.routing()).chains))
        victim = cluster.nodes[[n.name for n in cluster.nodes].index(f"s{chain.targets[0].node_id - 100}")]
        victim.kill()
        stats.kills += 1
        await asyncio.sleep(rng.uniform(*down))
        victim.start()
        try:
            await victim.ready()
            await cluster.wait_all_serving(timeout_s=max(5.0, end - time.monotonic()))
        except (TimeoutError, RuntimeError) as exc:  # a machine too loaded to recover in time: no more kills
            logger.warning("chaos: no more kills, the cluster did not recover in time: %s", exc)
            break
        if stop_when is not None and stop_when(list(stats.history)):
            return
    await asyncio.sleep(max(0.0, end - time.monotonic()))


async def _writer(
    client: StorageClient,
    w: int,
    keys: list[tuple[int, int]],
    stop: asyncio.Event,
    stats: ChaosStats,
    origin: float,
    jitter: float,
) -> None:
    rng = random.Random(jitter)
    n = 0
    while not stop.is_set():
        index, chain = rng.choice(keys)
        value = f"w{w}-{n}"
        n += 1
        io = ChunkWrite(chain_id=chain, inode_id=INODE, chunk_index=index, data=_encode(value), chunk_size=CHUNK_BYTES)
        op = Operation(key=index, kind=WRITE, value=value, start=time.monotonic() - origin, client=f"w{w}")
        slot = len(stats.history)
        stats.history.append(op)  # in flight: no end yet
        try:
            ok = (await client.batch_write([io]))[0].ok
        except Exception:  # a refused call: the outcome is unknown to the writer as well
            ok = False
        if ok:
            stats.history[slot] = replace(op, end=time.monotonic() - origin)
        stats.writes_ok += ok
        stats.writes_unknown += not ok


async def _reader(
    client: StorageClient,
    r: int,
    keys: list[tuple[int, int]],
    stop: asyncio.Event,
    stats: ChaosStats,
    origin: float,
    jitter: float,
) -> None:
    rng = random.Random(jitter)
    while not stop.is_set():
        index, chain = rng.choice(keys)
        start = time.monotonic() - origin
        try:
            got = (
                await client.batch_read(
                    [ChunkRead(chain_id=chain, inode_id=INODE, chunk_index=index, length=CHUNK_BYTES)]
                )
            )[0]
        except Exception:
            stats.reads_failed += 1
            continue
        end = time.monotonic() - origin
        if got.ok and not got.is_pending:
            value: str | None = _decode(bytes(got.data))
        elif got.status == spb.CHUNK_IO_STATUS_CHUNK_NOT_FOUND:
            value = None
        else:
            stats.reads_failed += 1
            continue
        stats.reads_ok += 1
        stats.history.append(Operation(key=index, kind=READ, value=value, start=start, end=end, client=f"r{r}"))
