"""Crash consistency of the storage plane as a hostile operator sees it: every storage service (and mgmtd) SIGKILLed
at once or one after another, restarted from the same folders, with real processes: 3 storage services, chains
of 3.

What must hold after each restart: every write acknowledged before the kill reads back, and every replica of a
chain holds the same whole chunk (the last acknowledged write, or one in flight at the kill, never a mix).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field

import pytest

from ff_testing.cluster import StorageCluster, StorageProcess, tail_logs
from ff_testing.process import kill_all
from ff_testing.waiting import eventually
from fireflyer.mgmtd.v1 import mgmtd_pb2 as mpb
from hf3fs import ChunkRead, ChunkWrite, StorageClient

CHUNK = 4096
KEYS_PER_WRITER = 4
Key = tuple[int, int]


@pytest.fixture
async def quick(cluster: StorageCluster) -> AsyncIterator[StorageClient]:
    """A client that gives up after a few seconds: the writers notice a dead cluster soon."""
    async with cluster.storage_client(timeout_s=3.0, retry_deadline_s=3.0) as sc:
        yield sc


@dataclass
class Stream:
    """Writers of whole chunks, each over its own keys, round after round, until stopped.

    Per chunk it keeps the last acknowledged bytes and what was sent since without an answer (may or may not be
    in the chain after a crash).
    """

    client: StorageClient
    chain_ids: list[int]
    num_writers: int = 3
    chains: dict[Key, int] = field(default_factory=dict)
    acked: dict[Key, bytes] = field(default_factory=dict)
    unanswered: dict[Key, list[bytes]] = field(default_factory=dict)
    num_acked: int = 0
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self) -> None:
        """Start the writers."""
        self._tasks = [asyncio.create_task(self._writer(w)) for w in range(self.num_writers)]

    async def stop(self) -> None:
        """Stop the writers (each ends once its write in progress answers or gives up)."""
        self._stop.set()
        await asyncio.gather(*self._tasks)

    async def acked_at_least(self, count: int, timeout_s: float = 60.0) -> None:
        """Wait until ``count`` more writes were acknowledged than when called."""
        target = self.num_acked + count

        async def enough() -> bool:
            return self.num_acked >= target

        await eventually(enough, timeout_s, f"{count} more acknowledged writes")

    def allowed(self, key: Key) -> list[bytes]:
        """What the chunk may hold after a crash: its last acknowledged bytes or bytes sent since."""
        return [*([self.acked[key]] if key in self.acked else []), *self.unanswered.get(key, [])]

    async def _writer(self, w: int) -> None:
        keys = [(7000 + w, i) for i in range(KEYS_PER_WRITER)]
        for n, key in enumerate(keys):
            self.chains[key] = self.chain_ids[(w * KEYS_PER_WRITER + n) % len(self.chain_ids)]
        counter = 0
        while not self._stop.is_set():
            counter += 1
            batch = {key: (f"w{w} k{key[1]} #{counter} ".encode() * CHUNK)[:CHUNK] for key in keys}
            for key, data in batch.items():
                self.unanswered.setdefault(key, []).append(data)
            writes = [
                ChunkWrite(chain_id=self.chains[k], inode_id=k[0], chunk_index=k[1], data=d, chunk_size=CHUNK)
                for k, d in batch.items()
            ]
            try:
                results = await self.client.batch_write(writes)
            except Exception:  # the cluster is being killed: what was sent stays unanswered
                await asyncio.sleep(0.05)
                continue
            for (key, data), r in zip(batch.items(), results, strict=True):
                if r.ok:
                    self.acked[key] = data
                    self.unanswered[key] = []
                    self.num_acked += 1


async def _check_every_replica(cluster: StorageCluster, stream: Stream) -> None:
    """Every chunk the stream wrote: the same whole bytes on every replica, ones it may hold after the crash."""
    info = await cluster.wait_all_serving(timeout_s=60)
    async with cluster.storage_client(retry_deadline_s=30.0) as reader:
        for chain in info.chains:
            keys = [k for k, c in stream.chains.items() if c == chain.chain_id]
            if not keys:
                continue
            copies: dict[Key, dict[int, tuple[int, bytes]]] = {k: {} for k in keys}
            for target in chain.targets:
                reads = [
                    ChunkRead(chain_id=chain.chain_id, inode_id=k[0], chunk_index=k[1], length=CHUNK) for k in keys
                ]
                deadline = time.monotonic() + 60
                while True:  # until every node has the routing the client has
                    await reader.routing.refresh(force=True)
                    got = await reader.batch_read(reads, prefer_target=target.target_id)
                    if all(g.target_id == target.target_id for g in got) or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.1)
                for k, g in zip(keys, got, strict=True):
                    assert g.ok and g.target_id == target.target_id, (k, target.target_id, g.status, g.message)
                    copies[k][target.target_id] = (g.version, bytes(g.data))
            for k, by_target in copies.items():
                heads = {t: (v, d[:16]) for t, (v, d) in by_target.items()}
                one_copy = len(set(by_target.values())) == 1  # the same bytes under the same chunk version
                assert one_copy, f"chunk {k} of chain {chain.chain_id} differs by replica: {heads}"
                allowed = stream.allowed(k)
                known = next(iter(by_target.values()))[1] in allowed
                assert known, f"chunk {k}: {heads} is neither acknowledged nor in flight: {[a[:16] for a in allowed]}"


async def _start(nodes: Iterable[StorageProcess]) -> None:
    started = list(nodes)
    for n in started:
        n.start()
    for n in started:
        await n.ready(60)


async def test_power_loss_while_heads_are_behind_their_replicas_converges(
    cluster: StorageCluster, quick: StorageClient
) -> None:
    """A head stores a write as pending and forwards it; its replicas commit it; the power goes before the head
    commits (the head frozen, then every process SIGKILLed, mgmtd too). Restarted, mgmtd finds every target
    offline at once and makes the head the chain's last serving copy (lastsrv): the head's committed copy is
    the chain's, a version behind its replicas. Recovery must make the replicas hold the head's copy, not keep
    their newer one (a sync write older than what a replica holds was answered "duplicate" and dropped:
    the replicas then served other bytes than the head, forever)."""
    info = await cluster.wait_all_serving()
    head_node = info.chains[0].targets[0].node_id
    chain_ids = [c.chain_id for c in info.chains if c.targets[0].node_id == head_node]
    head = next(n for n in cluster.nodes if n.info["node_id"] == head_node)
    stream = Stream(quick, chain_ids, num_writers=4)
    stream.start()
    try:
        await stream.acked_at_least(40)
        os.kill(head.info["pid"], signal.SIGSTOP)  # its writes in flight: pending here, forwarded, not committed
        cluster.mgmtd.kill()  # at once: it never sees the head stop
        await asyncio.sleep(0.5)  # the replicas commit what they took (no assertion rests on this)
        kill_all(cluster.nodes)
    finally:
        await stream.stop()
    cluster.mgmtd.start()
    await cluster.mgmtd.ready(60)

    async def each_chain_has_a_lastsrv() -> bool:
        chains = (await cluster.routing()).chains
        return all(any(t.public_state == mpb.PUBLIC_TARGET_STATE_LASTSRV for t in c.targets) for c in chains)

    await eventually(each_chain_has_a_lastsrv, 30, "every chain down to its last serving target")
    routing = await cluster.routing()
    lastsrv = {c.chain_id: c.targets[0].target_id for c in routing.chains}
    assert all(t.public_state == mpb.PUBLIC_TARGET_STATE_LASTSRV for c in routing.chains for t in c.targets[:1])
    assert {c.chain_id: c.targets[0].node_id for c in routing.chains if c.chain_id in chain_ids} == dict.fromkeys(
        chain_ids, head_node
    ), f"the frozen head is not the chains' last serving target: {lastsrv}"
    await _start(cluster.nodes)
    try:
        await _check_every_replica(cluster, stream)
    except AssertionError:
        print(tail_logs(cluster.folder, 60))
        raise


@pytest.mark.parametrize("with_mgmtd", [False, True], ids=["mgmtd up", "mgmtd too"])
async def test_every_storage_service_killed_mid_stream_and_restarted_at_once(
    cluster: StorageCluster, quick: StorageClient, with_mgmtd: bool
) -> None:
    """All storage services SIGKILLed at once in a stream of writes (and mgmtd, or not), restarted all together."""
    info = await cluster.wait_all_serving()
    stream = Stream(quick, [c.chain_id for c in info.chains], num_writers=4)
    stream.start()
    try:
        await stream.acked_at_least(60)
        if with_mgmtd:
            cluster.mgmtd.kill()
        kill_all(cluster.nodes)
    finally:
        await stream.stop()
    if with_mgmtd:
        cluster.mgmtd.start()
    await _start(cluster.nodes)
    if with_mgmtd:
        await cluster.mgmtd.ready(60)
    await _check_every_replica(cluster, stream)
    stream = Stream(quick, [c.chain_id for c in info.chains], num_writers=2)
    stream.start()  # and the chains take writes again
    try:
        await stream.acked_at_least(20)
    finally:
        await stream.stop()
    await _check_every_replica(cluster, stream)


def _states(info: mpb.RoutingInfo, node_id: int) -> set[int]:
    return {t.public_state for c in info.chains for t in c.targets if t.node_id == node_id}


@pytest.mark.parametrize(
    ("kill_order", "restart_order"),
    [("head first", "stalest first"), ("tail first", "stalest first"), ("head first", "freshest first")],
)
async def test_killed_one_by_one_and_restarted_one_by_one(
    cluster: StorageCluster, quick: StorageClient, kill_order: str, restart_order: str
) -> None:
    """Writes go on while the storage services die one after another (heads first, or tails first), each noticed
    by mgmtd; the last one to die holds the only up-to-date copies (lastsrv). They come back one at a time. The
    stalest first: no chain serves (reads or writes) until the last one to die is back. The freshest first: the
    chains serve at once, and writes go on while the others come back and sync. Either way every acknowledged
    write ends on every replica."""
    info = await cluster.wait_all_serving()
    by_node = {n.info["node_id"]: n for n in cluster.nodes}
    order_ids = [t.node_id for t in info.chains[0].targets]
    if kill_order == "tail first":
        order_ids.reverse()
    stream = Stream(quick, [c.chain_id for c in info.chains], num_writers=2)
    stream.start()
    try:
        await stream.acked_at_least(20)
        for n, node_id in enumerate(order_ids):
            by_node[node_id].kill()

            async def noticed(node_id: int = node_id) -> bool:
                states = _states(await cluster.routing(), node_id)
                return mpb.PUBLIC_TARGET_STATE_SERVING not in states

            await eventually(noticed, 30, f"node {node_id}'s targets out of service")
            if n < len(order_ids) - 1:
                await stream.acked_at_least(10)  # writes go on without it
        if restart_order == "stalest first":
            await _restart_stalest_first(cluster, [by_node[i] for i in order_ids])
        else:
            for node_id in reversed(order_ids):
                await _start([by_node[node_id]])
                await stream.acked_at_least(10)  # writes go on while the others come back
        await cluster.wait_all_serving(timeout_s=60)
        await stream.acked_at_least(20)  # and once all are back
    finally:
        await stream.stop()
    await _check_every_replica(cluster, stream)


async def _restart_stalest_first(cluster: StorageCluster, nodes: list[StorageProcess]) -> None:
    """Start ``nodes`` one at a time in order: each but the last waits, and no chain serves without the last."""
    for node in nodes:
        await _start([node])
        if node is nodes[-1]:
            return
        node_id = node.info["node_id"]

        async def waiting(node_id: int = node_id) -> bool:
            return _states(await cluster.routing(), node_id) == {mpb.PUBLIC_TARGET_STATE_WAITING}

        await eventually(waiting, 30, f"node {node_id}'s targets waiting for the last serving copy")
        chains = (await cluster.routing()).chains
        serving = [c.chain_id for c in chains if c.targets[0].public_state == mpb.PUBLIC_TARGET_STATE_SERVING]
        assert serving == [], f"chains {serving} serve without their last serving copy"


async def test_mgmtd_killed_mid_stream_and_restarted(cluster: StorageCluster, quick: StorageClient) -> None:
    """Mgmtd SIGKILLed in a stream of writes and started again: past half a lease without it the storage services
    stop serving and every target comes back through recovery (from the chain's last serving copy); writes go on
    once it is back, and every replica holds every acknowledged write."""
    info = await cluster.wait_all_serving()
    stream = Stream(quick, [c.chain_id for c in info.chains], num_writers=3)
    stream.start()
    try:
        await stream.acked_at_least(40)
        cluster.mgmtd.kill()
        await asyncio.sleep(2.0)  # away for a whole lease (2 s in these tests)
        cluster.mgmtd.start()
        await cluster.mgmtd.ready(60)
        await cluster.wait_all_serving(timeout_s=60)
        # Under load a node's lease may lapse again just after mgmtd made its target the lastsrv: that target must
        # still come back (it reported offline for good, and its chains never served again: TargetRole).
        await stream.acked_at_least(40)
    except BaseException:
        print(tail_logs(cluster.folder, 80))
        raise
    finally:
        await stream.stop()
    await _check_every_replica(cluster, stream)
