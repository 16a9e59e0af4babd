"""3FS metadata rates: create, stat, list and rename through hf3fs and the meta service, next to (a) a
no-op gRPC round trip to the same server over the same client plumbing (the transport's ceiling) and
(b) the same operations on the local file system (for scale).

One run starts a real cluster (mgmtd and three storage services as processes through
``ff_testing.cluster.start_cluster``) and one meta service as a process on the embedded default store
(SQLite in ``--dir``). ``--threads`` client threads share one ``hf3fs.FileSystem`` (as a data loader or
FUSE would). Each round runs every operation for ``--seconds`` on each side, in an order that rotates
between rounds; the no-op is the gRPC health Check on the meta server (served by the same ff_rpc
runtime and interceptor), called through the FileSystem's event-loop thread like every meta call.

- create: new empty files (one meta Create each) in one directory per thread (not the listed one);
- stat: stat of existing files (two path components);
- list: listdir of a directory with ``--entries`` entries (one List page);
- rename: a file renamed back and forth within its directory.

Prints per-round rates, the medians, and the median per-round ratios meta/no-op and meta/local.
Goals: stat >= 0.5 of the no-op rate; creates >= 1,000/s.

    .venv/bin/python bench/meta_ops.py                     # 5 rounds x 4 ops x 3 sides x 2 s, ~2 min
    .venv/bin/python bench/meta_ops.py --threads 8 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from grpc_health.v1 import health_pb2, health_pb2_grpc

import hf3fs
from ff_cluster import MgmtdClient
from ff_rpc import open_channel
from ff_testing.cluster import CLUSTER_TOKEN, StorageCluster, start_cluster
from ff_testing.meta import MetaProcess, meta_process
from fireflyer.mgmtd.v1 import mgmtd_pb2 as mpb

OPS = ("create", "stat", "list", "rename")
SIDES = ("meta", "noop", "local")


def run_for(seconds: float, threads: int, op: Callable[[int, int], None]) -> float:
    """Ops/s of ``op(thread, i)`` run by ``threads`` threads for ``seconds``."""
    stop = threading.Event()
    counts = [0] * threads
    errors: list[BaseException] = []

    def loop(t: int) -> None:
        i = 0
        try:
            while not stop.is_set():
                op(t, i)
                i += 1
        except BaseException as exc:
            errors.append(exc)
        counts[t] = i

    workers = [threading.Thread(target=loop, args=(t,)) for t in range(threads)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    time.sleep(seconds)
    stop.set()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    return sum(counts) / elapsed


class MetaSide:
    def __init__(self, fs: hf3fs.FileSystem, threads: int, entries: int) -> None:
        self.fs = fs
        self.threads = threads
        self.top = f"/bench-{os.getpid()}"
        self.serial = itertools.count()
        for t in range(threads):
            fs.makedirs(f"{self.top}/t{t}", exist_ok=True)
            fs.makedirs(f"{self.top}/c{t}", exist_ok=True)
            for k in range(entries):
                fs.create(f"{self.top}/t{t}/f{k}")

    def op(self, name: str) -> Callable[[int, int], None]:
        fs, top = self.fs, self.top
        if name == "create":
            batch = next(self.serial)
            return lambda t, i: fs.create(f"{top}/c{t}/c{batch}-{i}") and None
        if name == "stat":
            return lambda t, i: fs.stat(f"{top}/t{t}/f{i % 50}") and None
        if name == "list":
            return lambda t, i: fs.listdir(f"{top}/t{t}") and None
        return lambda t, i: fs.rename(f"{top}/t{t}/f{i % 2}", f"{top}/t{t}/f{(i + 1) % 2}x") or fs.rename(
            f"{top}/t{t}/f{(i + 1) % 2}x", f"{top}/t{t}/f{i % 2}")  # fmt: skip


class NoopSide:
    """The health Check on the meta server, through the FileSystem's loop like every meta call."""

    def __init__(self, fs: hf3fs.FileSystem, address: str) -> None:
        self.fs = fs

        async def make() -> health_pb2_grpc.HealthStub:
            self.channel = open_channel(address)
            return health_pb2_grpc.HealthStub(self.channel)

        self.stub = fs._run(make())
        self.request = health_pb2.HealthCheckRequest()

    def op(self, name: str) -> Callable[[int, int], None]:
        fs, stub, req = self.fs, self.stub, self.request
        calls = 2 if name == "rename" else 1  # a rename is two calls on the meta side too

        async def check() -> None:
            await stub.Check(req, timeout=10)

        def run(t: int, i: int) -> None:
            for _ in range(calls):
                fs._run(check())

        return run


class LocalSide:
    def __init__(self, folder: Path, threads: int, entries: int) -> None:
        self.top = folder / "local"
        self.serial = itertools.count()
        for t in range(threads):
            (self.top / f"t{t}").mkdir(parents=True, exist_ok=True)
            (self.top / f"c{t}").mkdir(parents=True, exist_ok=True)
            for k in range(entries):
                (self.top / f"t{t}" / f"f{k}").touch()

    def op(self, name: str) -> Callable[[int, int], None]:
        top = str(self.top)
        if name == "create":
            batch = next(self.serial)
            return lambda t, i: os.close(os.open(f"{top}/c{t}/c{batch}-{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        if name == "stat":
            return lambda t, i: os.stat(f"{top}/t{t}/f{i % 50}") and None
        if name == "list":
            return lambda t, i: os.listdir(f"{top}/t{t}") and None
        return lambda t, i: os.rename(f"{top}/t{t}/f{i % 2}", f"{top}/t{t}/f{(i + 1) % 2}x") or os.rename(
            f"{top}/t{t}/f{(i + 1) % 2}x", f"{top}/t{t}/f{i % 2}")  # fmt: skip


async def start(folder: Path) -> tuple[StorageCluster, MetaProcess, str]:
    cluster = await start_cluster(folder / "cluster")
    try:
        mg = MgmtdClient([cluster.mgmtd_address], token=CLUSTER_TOKEN)
        try:
            await mg.identity.create_user(mpb.CreateUserRequest(name="bench"))
            token = (await mg.identity.issue_token(mpb.IssueTokenRequest(user_name="bench"))).token
        finally:
            await mg.close()
        meta = meta_process(folder, "meta", mgmtd_address=cluster.mgmtd_address, cluster_token=CLUSTER_TOKEN,
                            database_url=f"sqlite:///{folder / 'meta.db'}", log_level="WARNING")  # fmt: skip
        meta.start()
        await meta.ready()
        return cluster, meta, token
    except BaseException:
        cluster.stop()
        raise


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--entries", type=int, default=100)
    parser.add_argument("--dir", type=Path, default=None, help="working folder (default: a temp folder)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-meta-", dir=args.dir))
    cluster, meta, token = asyncio.run(start(folder))
    try:
        with hf3fs.connect(cluster.mgmtd_address, token, meta_addresses=[meta.address]) as fs:
            sides = {"meta": MetaSide(fs, args.threads, args.entries), "noop": NoopSide(fs, meta.address),
                     "local": LocalSide(folder, args.threads, args.entries)}  # fmt: skip
            rates: dict[tuple[str, str], list[float]] = {(o, s): [] for o in OPS for s in SIDES}
            print(f"{args.threads} client threads, {args.seconds:g} s per measurement, {args.rounds} rounds")
            for r in range(args.rounds):
                order = SIDES[r % 3 :] + SIDES[: r % 3]
                line = []
                for op in OPS:
                    for side in order:
                        rate = run_for(args.seconds, args.threads, sides[side].op(op))  # type: ignore[attr-defined]
                        rates[(op, side)].append(rate)
                    line.append(f"{op} " + " ".join(f"{s}={rates[(op, s)][-1]:,.0f}/s" for s in SIDES))
                print(f"round {r + 1}: " + "; ".join(line), flush=True)
            print()
            print(f"{'op':8} {'meta/s':>10} {'noop/s':>10} {'local/s':>10} {'meta/noop':>10} {'meta/local':>11}")
            for op in OPS:
                m, n, loc = (rates[(op, s)] for s in SIDES)
                to_noop = statistics.median(a / b for a, b in zip(m, n, strict=True))
                to_local = statistics.median(a / b for a, b in zip(m, loc, strict=True))
                print(f"{op:8} {statistics.median(m):>10,.0f} {statistics.median(n):>10,.0f} "
                      f"{statistics.median(loc):>10,.0f} {to_noop:>10.2f} {to_local:>11.3f}")  # fmt: skip
            stat_ratio = statistics.median(a / b for a, b in zip(rates[("stat", "meta")], rates[("stat", "noop")],
                                                                 strict=True))  # fmt: skip
            creates = statistics.median(rates[("create", "meta")])
            print(f"\ngoals: stat >= 0.5 of no-op: {stat_ratio:.2f} ({'met' if stat_ratio >= 0.5 else 'NOT met'}); "
                  f"creates >= 1,000/s: {creates:,.0f}/s ({'met' if creates >= 1000 else 'NOT met'})")  # fmt: skip
    finally:
        meta.stop()
        cluster.stop()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
