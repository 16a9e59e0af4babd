"""3FS storage plane: durable chain writes vs raw write+fsync / 3, client reads vs raw TCP loopback.

One run starts a real cluster (mgmtd and three storage services as processes, through
``ff_testing.cluster.start_cluster``, as the integration tests do) with one chain of 3 targets, one per
service, all on the disk that holds ``--dir``. Each round, in an order that alternates between rounds:

- write: ``--chunks`` chunks of ``--block-mib`` MiB through ``hf3fs.StorageClient.batch_write`` (acknowledged
  = committed on all 3 replicas, data and metadata fsynced), vs the same bytes written to one file on the
  same disk with an fsync after every block, that throughput divided by 3 (the chain writes 3 copies);
- read: the same chunks through ``StorageClient.batch_read`` (bulk data path, checksums verified) twice:
  into plain buffers (the TCP data path) and into buffers in the client's shared memory (the same-host
  path: the node writes the bytes there), vs a raw TCP loopback stream of the same blocks from a small
  server process (blocking sockets, one preallocated receive buffer) and, for context, the same over
  AF_UNIX. The issue's read goal is the TCP path's ratio to raw TCP.

- read scaling (3FS's read throughput against the number of clients, the paper's table in miniature): the
  same chunks read by 1 and by ``--readers`` reader processes at once (default 4), each its own
  ``StorageClient`` with its own connections, reader k preferring target k mod 3 of the chain (a lone reader
  picks replicas at random); the same bytes in all either way (each of the many reads every chunk once, the
  lone reader reads them all ``--readers`` times); total MiB/s from the first reader's start to the last
  one's end, and the ratio of many to one.

Requests are of ``--batch`` blocks each on both sides. The baselines run one request at a time (one
writer, one stream); the client keeps ``--inflight`` requests in flight (default 8, as a 3FS client
would; ``--inflight 1`` measures one-by-one latency-bound transfers). Prints per-round MiB/s, the median
of each, and the median of the per-round ratios (issue 24's goals: write >= 0.9, TCP-path read >= 0.8, read
scaling > 1), and the CPU milliseconds per MiB of the storage processes (together, from their threads' schedstat) and
of this process during the chain write and the TCP-path read, against the raw TCP receiver's: on a loaded
machine wall time says little, CPU per MiB says where the cost is. The cluster runs with mgmtd's own
timing (1 s heartbeats; the tests' 0.2 s ones take a few percent of the two cores from the data path).
Reads land in caller buffers, one per block in flight, reused (the TCP baseline receives into one buffer).

    .venv/bin/python bench/storage_throughput.py                 # 11 rounds of 32 x 4 MiB, ~20 s
    .venv/bin/python bench/storage_throughput.py --inflight 1 --dir /work/tmp
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import multiprocessing as mp
import os
import shutil
import signal
import socket
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from ff_cluster import MgmtdClient
from ff_testing.cluster import StorageCluster, start_cluster
from ff_testing.process import CLUSTER_TOKEN
from hf3fs import ChunkRead, ChunkWrite, StorageClient

MIB = 1 << 20
INODE_ID = 42
_COUNT = struct.Struct(">Q")


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    block_bytes: int
    num_chunks: int
    batch: int
    inflight: int
    rounds: int
    folder: Path
    readers: int = 4


@dataclass
class Round:
    chain_write: float  # MiB/s
    raw_write_div3: float
    raw_overwrite_div3: float
    client_read: float  # over the TCP data path
    tcp_read: float
    shm_read: float  # through shared memory (same host)
    unix_read: float
    one_reader: float  # total MiB/s of one reader process
    many_readers: float  # total MiB/s of ``--readers`` reader processes at once
    # CPU ms per MiB (storage processes together, this process): chain write, client read over TCP
    write_cpu: tuple[float, float] = (0.0, 0.0)
    read_cpu: tuple[float, float] = (0.0, 0.0)
    tcp_client_cpu: float = 0.0  # this process's CPU ms per MiB receiving the raw TCP stream

    @property
    def scaling(self) -> float:
        return self.many_readers / self.one_reader if self.one_reader else 0.0  # 0: not measured (--readers 0)

    @property
    def write_ratio(self) -> float:
        return self.chain_write / self.raw_write_div3

    @property
    def read_ratio(self) -> float:
        return self.client_read / self.tcp_read

    @property
    def shm_ratio_tcp(self) -> float:
        return self.shm_read / self.tcp_read

    @property
    def overwrite_ratio(self) -> float:
        return self.chain_write / self.raw_overwrite_div3

    @property
    def shm_ratio_unix(self) -> float:
        return self.shm_read / self.unix_read


# ---- baselines ----


def raw_write_fsync(path: Path, blocks: Sequence[bytes]) -> float:
    """Seconds to write ``blocks`` to a new file with an fsync after each (the file is removed after, and
    the removal synced, so freeing its blocks is not paid inside the next measurement)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        t0 = time.perf_counter()
        for block in blocks:
            view = memoryview(block)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        return time.perf_counter() - t0
    finally:
        os.close(fd)
        path.unlink()
        os.sync()


def raw_overwrite_fsync(path: Path, blocks: Sequence[bytes]) -> float:
    """Seconds to write ``blocks`` over a file that already has them (blocks allocated, size unchanged)
    with an fdatasync after each: the cheapest durable write the disk offers, for context."""
    if not path.exists() or path.stat().st_size != sum(len(b) for b in blocks):  # the first run lays it out
        with open(path, "wb") as f:
            for block in blocks:
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
    fd = os.open(path, os.O_WRONLY)
    try:
        t0 = time.perf_counter()
        offset = 0
        for block in blocks:
            view = memoryview(block)
            while view:
                n = os.pwrite(fd, view, offset)
                view, offset = view[n:], offset + n
            os.fdatasync(fd)
        return time.perf_counter() - t0
    finally:
        os.close(fd)


def serve_blocks(listener: socket.socket, block_bytes: int) -> None:
    """The TCP baseline's server (own process): for each u64 count received, send that many blocks."""
    block = os.urandom(block_bytes)
    conn, _ = listener.accept()
    if conn.family != socket.AF_UNIX:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    with conn:
        while head := conn.recv(_COUNT.size, socket.MSG_WAITALL):
            for _ in range(_COUNT.unpack(head)[0]):
                conn.sendall(block)


class StreamBaseline:
    """A block server process on loopback (TCP) or an AF_UNIX socket, and a blocking client that receives
    into one buffer."""

    def __init__(self, block_bytes: int, batch: int, *, unix: bool = False) -> None:
        if unix:
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(f"\0ff-bench-{os.getpid()}-{time.monotonic_ns()}")  # abstract: no file to clean up
            listener.listen(1)
        else:
            listener = socket.create_server(("127.0.0.1", 0))
        self._proc = mp.get_context("spawn").Process(target=serve_blocks, args=(listener, block_bytes), daemon=True)
        self._proc.start()
        self._sock = socket.socket(listener.family, socket.SOCK_STREAM)
        self._sock.connect(listener.getsockname())
        listener.close()
        if not unix:
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._block_bytes = block_bytes
        self._batch = batch
        self._buf = memoryview(bytearray(block_bytes * batch))

    def read(self, num_blocks: int) -> float:
        """Seconds to receive ``num_blocks`` blocks, asking for ``batch`` at a time."""
        t0 = time.perf_counter()
        for start in range(0, num_blocks, self._batch):
            count = min(self._batch, num_blocks - start)
            self._sock.sendall(_COUNT.pack(count))
            want, got = count * self._block_bytes, 0
            while got < want:
                n = self._sock.recv_into(self._buf[got:want])
                if not n:
                    raise ConnectionError("block server closed the connection")
                got += n
        return time.perf_counter() - t0

    def close(self) -> None:
        self._sock.close()
        self._proc.join(timeout=5)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()


# ---- through the cluster ----


async def in_batches(total: int, cfg: BenchConfig, one: Callable[[range], Awaitable[None]]) -> float:
    """Seconds to run ``one`` over [0, total) in slices of ``cfg.batch``, ``cfg.inflight`` at a time."""
    slices = [range(i, min(i + cfg.batch, total)) for i in range(0, total, cfg.batch)]
    sem = asyncio.Semaphore(cfg.inflight)

    async def run(s: range) -> None:
        async with sem:
            await one(s)

    t0 = time.perf_counter()
    await asyncio.gather(*(run(s) for s in slices))
    return time.perf_counter() - t0


async def chain_write(client: StorageClient, chain_id: int, blocks: Sequence[bytes], cfg: BenchConfig) -> float:
    async def one(s: range) -> None:
        ios = [ChunkWrite(chain_id=chain_id, inode_id=INODE_ID, chunk_index=i, data=blocks[i],
                          chunk_size=cfg.block_bytes) for i in s]  # fmt: skip
        bad = [r for r in await client.batch_write(ios) if not r.ok]
        if bad:
            raise RuntimeError(f"write failed: {bad[0]}")

    return await in_batches(len(blocks), cfg, one)


async def client_read(
    client: StorageClient, chain_id: int, blocks: Sequence[bytes], cfg: BenchConfig, buffers: Sequence[memoryview],
    *, verify: bool,
) -> float:  # fmt: skip
    """Read every block; each request lands in a free slot of ``buffers`` (``inflight`` slots of ``batch``
    blocks: a streaming reader's ring, as the TCP baseline receives into its one buffer)."""
    free = [buffers[k * cfg.batch : (k + 1) * cfg.batch] for k in range(cfg.inflight)]

    async def one(s: range) -> None:
        slot = free.pop()
        ios = [ChunkRead(chain_id=chain_id, inode_id=INODE_ID, chunk_index=i, length=cfg.block_bytes,
                         buffer=slot[k]) for k, i in enumerate(s)]  # fmt: skip
        for i, r in zip(s, await client.batch_read(ios), strict=True):
            if not r.ok or len(r.data) != cfg.block_bytes or (verify and r.data != blocks[i]):
                raise RuntimeError(f"read of chunk {i} failed or differs: {r.status} {r.message}")
        free.append(slot)

    return await in_batches(len(blocks), cfg, one)


# ---- reader processes (read scaling) ----


@dataclass(frozen=True)
class ReaderJob:
    """What one reader process reads, and where from."""

    mgmtd_address: str
    chain_id: int
    block_bytes: int
    num_chunks: int
    batch: int
    inflight: int
    prefer_target: int  # 0: any replica, at random
    passes: int = 1  # reads of every chunk per ``go``


def reader_main(job: ReaderJob, conn: Connection) -> None:
    """A reader process: its own client; for each ``go`` (a start barrier's time), read every chunk once and
    answer (start, end) in ``time.perf_counter`` (CLOCK_MONOTONIC: the same clock in every process)."""
    asyncio.run(_reader_loop(job, conn))


async def _reader_loop(job: ReaderJob, conn: Connection) -> None:
    mgmtd = MgmtdClient([job.mgmtd_address], token=CLUSTER_TOKEN, timeout_s=3.0)
    client = StorageClient(mgmtd, CLUSTER_TOKEN)
    cfg = BenchConfig(block_bytes=job.block_bytes, num_chunks=job.num_chunks, batch=job.batch,
                      inflight=job.inflight, rounds=1, folder=Path("."))  # fmt: skip
    buffers = [memoryview(bytearray(job.block_bytes)) for _ in range(job.inflight * job.batch)]
    try:
        await _read_all(client, job, cfg, buffers)  # warm: connections up, routing known
        conn.send("ready")
        while (start_at := await asyncio.to_thread(conn.recv)) is not None:
            await asyncio.sleep(max(0.0, start_at - time.perf_counter()))  # all readers start together
            t0 = time.perf_counter()
            for _ in range(job.passes):
                await _read_all(client, job, cfg, buffers)
            conn.send((t0, time.perf_counter()))
    finally:
        await client.close()
        await mgmtd.close()


async def _read_all(client: StorageClient, job: ReaderJob, cfg: BenchConfig, buffers: Sequence[memoryview]) -> None:
    free = [buffers[k * cfg.batch : (k + 1) * cfg.batch] for k in range(cfg.inflight)]

    async def one(s: range) -> None:
        slot = free.pop()
        ios = [ChunkRead(chain_id=job.chain_id, inode_id=INODE_ID, chunk_index=i, length=cfg.block_bytes,
                         buffer=slot[k]) for k, i in enumerate(s)]  # fmt: skip
        for i, r in zip(s, await client.batch_read(ios, prefer_target=job.prefer_target), strict=True):
            if not r.ok or len(r.data) != cfg.block_bytes:
                raise RuntimeError(f"reader: read of chunk {i} failed: {r.status} {r.message}")
        free.append(slot)

    await in_batches(cfg.num_chunks, cfg, one)


class ReaderPool:
    """``count`` reader processes, each with its own StorageClient; ``read`` has them all read at once."""

    def __init__(self, jobs: Sequence[ReaderJob]) -> None:
        ctx = mp.get_context("spawn")
        self._conns: list[Connection] = []
        self._procs = []
        for job in jobs:
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=reader_main, args=(job, theirs), daemon=True)
            proc.start()
            self._conns.append(ours)
            self._procs.append(proc)
        for conn in self._conns:
            if conn.recv() != "ready":
                raise RuntimeError("a reader process did not start")
        self.mib = sum(j.num_chunks * j.block_bytes * j.passes for j in jobs) / MIB

    def read(self) -> float:
        """Seconds from the first reader's start to the last one's end (all start at one instant)."""
        start_at = time.perf_counter() + 0.05
        for conn in self._conns:
            conn.send(start_at)
        spans: list[tuple[float, float]] = [conn.recv() for conn in self._conns]
        return max(end for _, end in spans) - min(start for start, _ in spans)

    def close(self) -> None:
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.send(None)
        for proc in self._procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join()


# ---- the run ----


class CpuMeter:
    """CPU time of the storage processes and of this process around a measured step.

    The storage processes' from each thread's /proc/PID/task/TID/schedstat (nanoseconds on a CPU; /proc/PID/stat
    counts 10 ms ticks, too coarse for a round); a thread that ends within the step takes its time with it.
    """

    def __init__(self, pids: Sequence[int]) -> None:
        self.pids = list(pids)

    def storage_s(self) -> float:
        total = 0
        for pid in self.pids:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(FileNotFoundError), open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
        return total / 1e9

    async def timed(self, step: Callable[[], Awaitable[float]]) -> tuple[float, tuple[float, float]]:
        """``step``'s seconds, and (storage processes' CPU s, this process's CPU s) meanwhile."""
        node0, own0 = self.storage_s(), time.process_time()
        seconds = await step()
        return seconds, (self.storage_s() - node0, time.process_time() - own0)


@dataclass
class Baselines:
    tcp: StreamBaseline
    unix: StreamBaseline
    cpu: CpuMeter
    one_reader: ReaderPool | None = None
    many_readers: ReaderPool | None = None

    def close_readers(self) -> None:
        for pool in (self.one_reader, self.many_readers):
            if pool is not None:
                pool.close()


async def one_round(
    n: int, cfg: BenchConfig, client: StorageClient, chain_id: int, base: Baselines, blocks: Sequence[bytes],
    buffers: Sequence[memoryview], shm_buffers: Sequence[memoryview],
) -> Round:  # fmt: skip
    mib = len(blocks) * cfg.block_bytes / MIB
    raw_path = cfg.folder / "raw-fsync.bin"
    overwrite_path = cfg.folder / "raw-overwrite.bin"
    flip = n % 2 == 1  # alternate which side goes first
    verify = n == 0
    writes: dict[str, Callable[[], Awaitable[float]]] = {
        "raw": lambda: asyncio.to_thread(raw_write_fsync, raw_path, blocks),
        "chain": lambda: chain_write(client, chain_id, blocks, cfg),
        "overwrite": lambda: asyncio.to_thread(raw_overwrite_fsync, overwrite_path, blocks),
    }
    reads: dict[str, Callable[[], Awaitable[float]]] = {
        "tcp": lambda: asyncio.to_thread(base.tcp.read, len(blocks)),
        "client": lambda: client_read(client, chain_id, blocks, cfg, buffers, verify=verify),
        "shm": lambda: client_read(client, chain_id, blocks, cfg, shm_buffers, verify=verify),
        "unix": lambda: asyncio.to_thread(base.unix.read, len(blocks)),
    }
    t: dict[str, float] = {}
    cpu: dict[str, tuple[float, float]] = {}  # storage processes' and this process's CPU seconds
    for name in list(writes)[::-1] if flip else list(writes):
        t[name], cpu[name] = await base.cpu.timed(writes[name])
    for name in list(reads)[::-1] if flip else list(reads):
        t[name], cpu[name] = await base.cpu.timed(reads[name])
    scaling = {"one": 0.0, "many": 0.0}
    if base.one_reader is not None and base.many_readers is not None:
        pools = {"one": base.one_reader, "many": base.many_readers}
        for name in list(pools)[::-1] if flip else list(pools):
            scaling[name] = pools[name].mib / await asyncio.to_thread(pools[name].read)
    return Round(chain_write=mib / t["chain"], raw_write_div3=mib / t["raw"] / 3,
                 raw_overwrite_div3=mib / t["overwrite"] / 3, client_read=mib / t["client"],
                 tcp_read=mib / t["tcp"], shm_read=mib / t["shm"], unix_read=mib / t["unix"],
                 one_reader=scaling["one"], many_readers=scaling["many"],
                 write_cpu=(cpu["chain"][0] * 1000 / mib, cpu["chain"][1] * 1000 / mib),
                 read_cpu=(cpu["client"][0] * 1000 / mib, cpu["client"][1] * 1000 / mib),
                 tcp_client_cpu=cpu["tcp"][1] * 1000 / mib)  # fmt: skip


async def run(cfg: BenchConfig) -> list[Round]:
    async with contextlib.AsyncExitStack() as stack:
        cluster = await start_cluster(cfg.folder / "cluster", targets_per_disk=1, replication=3, timing={})
        stack.callback(cluster.stop)
        pids = [node.proc.pid for node in cluster.nodes if node.proc is not None]
        tcp = StreamBaseline(cfg.block_bytes, cfg.batch)
        base = Baselines(tcp, StreamBaseline(cfg.block_bytes, cfg.batch, unix=True), CpuMeter(pids))
        stack.callback(base.tcp.close)
        stack.callback(base.unix.close)
        stack.callback(base.close_readers)
        mgmtd = cluster.client()
        stack.push_async_callback(mgmtd.close)
        client = StorageClient(mgmtd, CLUSTER_TOKEN)
        stack.push_async_callback(client.close)
        return await measure(cfg, cluster, client, base)


async def measure(cfg: BenchConfig, cluster: StorageCluster, client: StorageClient, base: Baselines) -> list[Round]:
    info = await cluster.routing()
    chain = info.chains[0]
    print(f"chain {chain.chain_id}: targets {[t.target_id for t in chain.targets]} (head first), "
          f"{len(info.chains)} chain(s)")  # fmt: skip
    blocks = [os.urandom(cfg.block_bytes) for _ in range(cfg.num_chunks)]
    await chain_write(client, chain.chain_id, blocks, cfg)  # the chunks the reader processes read
    # Read buffers, one per block in flight, reused: plain memory (the TCP data path) and shared memory.
    ring = cfg.inflight * cfg.batch
    buffers = [memoryview(bytearray(cfg.block_bytes)) for _ in range(ring)]
    area = client.alloc_buffer(cfg.block_bytes * ring)
    shm_buffers = [area[i * cfg.block_bytes : (i + 1) * cfg.block_bytes] for i in range(ring)]
    if cfg.readers:

        def job(prefer: int) -> ReaderJob:
            return ReaderJob(
                mgmtd_address=cluster.mgmtd_address,
                chain_id=chain.chain_id,
                block_bytes=cfg.block_bytes,
                num_chunks=cfg.num_chunks,
                batch=cfg.batch,
                inflight=cfg.inflight,
                prefer_target=prefer,
            )

        targets = [t.target_id for t in chain.targets]
        base.one_reader = ReaderPool([dataclasses.replace(job(0), passes=cfg.readers)])
        base.many_readers = ReaderPool([job(targets[k % len(targets)]) for k in range(cfg.readers)])
    await one_round(0, cfg, client, chain.chain_id, base, blocks, buffers, shm_buffers)  # warm-up; checks content
    stats = client.data_stats
    if not stats["shm_pulls"] or not stats["tcp_pulls"]:
        raise RuntimeError(f"both read paths should have been used: {stats}")
    rounds = []
    for n in range(1, cfg.rounds + 1):
        r = await one_round(n, cfg, client, chain.chain_id, base, blocks, buffers, shm_buffers)
        print(f"round {n:2d}  write: chain {r.chain_write:6.0f} raw/3 {r.raw_write_div3:6.0f} = {r.write_ratio:4.2f}  "
              f"overwrite/3 {r.raw_overwrite_div3:6.0f}  "
              f"read: client {r.client_read:6.0f} tcp {r.tcp_read:6.0f} = {r.read_ratio:4.2f}  "
              f"shm {r.shm_read:6.0f} unix {r.unix_read:6.0f}  readers: 1 {r.one_reader:6.0f} "
              f"{cfg.readers} {r.many_readers:6.0f} = {r.scaling:4.2f}", flush=True)  # fmt: skip
        rounds.append(r)
    return rounds


def describe_disk(folder: Path) -> str:
    """Mount point, device and file system type of ``folder`` (from /proc/mounts)."""
    best: list[str] = []
    with open("/proc/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            if str(folder).startswith(fields[1].rstrip("/") + "/") and len(fields[1]) >= len(best[1] if best else ""):
                best = fields
    return f"{best[1]} ({best[0]}, {best[2]})" if best else "unknown mount"


def report(rounds: list[Round], readers: int) -> None:
    def med(f: Callable[[Round], float]) -> float:
        return statistics.median(f(r) for r in rounds)

    def span(f: Callable[[Round], float]) -> str:
        return f"{med(f):.2f} [{min(f(r) for r in rounds):.2f}-{max(f(r) for r in rounds):.2f}]"

    print(f"median MiB/s  write: chain {med(lambda r: r.chain_write):.0f}  raw/3 {med(lambda r: r.raw_write_div3):.0f}"
          f"  raw overwrite/3 {med(lambda r: r.raw_overwrite_div3):.0f}"
          f"   read: client (TCP path) {med(lambda r: r.client_read):.0f}  client (shm path) "
          f"{med(lambda r: r.shm_read):.0f}  raw TCP {med(lambda r: r.tcp_read):.0f}  raw AF_UNIX "
          f"{med(lambda r: r.unix_read):.0f}")  # fmt: skip
    print(f"MEDIAN RATIO durable write (chain of 3 / raw fsync / 3): {span(lambda r: r.write_ratio)}  (goal >= 0.9)")
    print(
        f"median ratio durable write (chain of 3 / raw overwrite+fdatasync / 3), for context: "
        f"{span(lambda r: r.overwrite_ratio)}"
    )
    print(f"MEDIAN RATIO read, TCP path (client / raw TCP loopback): {span(lambda r: r.read_ratio)}  (goal >= 0.8)")
    print(f"MEDIAN RATIO read, shm path (client / raw TCP loopback): {span(lambda r: r.shm_ratio_tcp)}")
    print(f"median ratio read, shm path (client / raw AF_UNIX), for context: {span(lambda r: r.shm_ratio_unix)}")
    print(
        f"median CPU ms/MiB  write: storage processes {med(lambda r: r.write_cpu[0]):.2f}, client "
        f"{med(lambda r: r.write_cpu[1]):.2f}   read (TCP path): storage processes "
        f"{med(lambda r: r.read_cpu[0]):.2f}, client {med(lambda r: r.read_cpu[1]):.2f}; raw TCP receiver "
        f"{med(lambda r: r.tcp_client_cpu):.2f}"
    )
    if rounds and rounds[0].one_reader:
        print(f"median MiB/s  read scaling: 1 reader {med(lambda r: r.one_reader):.0f}  {readers} readers "
              f"{med(lambda r: r.many_readers):.0f}")  # fmt: skip
        print(f"MEDIAN RATIO read scaling ({readers} reader processes / 1, total MiB/s): {span(lambda r: r.scaling)}"
              "  (goal > 1)")  # fmt: skip


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, Path]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=11, help="measured rounds (after one warm-up round)")
    parser.add_argument("--chunks", type=int, default=32, help="chunks written and read per round")
    parser.add_argument("--block-mib", type=int, default=4, help="chunk and block size in MiB")
    parser.add_argument("--batch", type=int, default=1, help="chunks per client request (and per TCP request)")
    parser.add_argument("--inflight", type=int, default=8, help="client requests in flight at once (1: one by one)")
    parser.add_argument("--readers", type=int, default=4, help="reader processes of the read-scaling test (0: skip it)")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()), help="where the run's folder goes")
    parser.add_argument("--keep", action="store_true", help="keep the run's folder (logs, chunk files)")
    args = parser.parse_args(argv)
    if min(args.rounds, args.chunks, args.block_mib, args.batch, args.inflight) < 1:
        parser.error("--rounds, --chunks, --block-mib, --batch and --inflight must be at least 1")
    if args.readers < 0:
        parser.error("--readers must be at least 0")
    return args, Path(tempfile.mkdtemp(prefix="ff-storage-bench-", dir=args.dir)).resolve()


def main(argv: list[str]) -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # unwind: stop the cluster, remove the folder
    args, folder = parse_args(argv)
    cfg = BenchConfig(block_bytes=args.block_mib * MIB, num_chunks=args.chunks, batch=args.batch,
                      inflight=args.inflight, rounds=args.rounds, folder=folder, readers=args.readers)  # fmt: skip
    print(f"disk: {folder} on {describe_disk(folder)}; cluster targets and the raw fsync file both live there")
    print(f"{cfg.num_chunks} x {args.block_mib} MiB per round, {cfg.batch} per request, {cfg.inflight} in flight, "
          f"{cfg.rounds} rounds + 1 warm-up; figures in MiB/s")  # fmt: skip
    try:
        rounds = asyncio.run(run(cfg))
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    report(rounds, cfg.readers)


if __name__ == "__main__":
    main(sys.argv[1:])
