"""3FS metadata rates: create, stat, list and rename through hf3fs and the meta service, next to (a) a
no-op gRPC round trip to the same server over the same client plumbing (the transport's ceiling) and
(b) the same operations on the local file system (for scale).

One run starts a real cluster (mgmtd and three storage services as processes through
``ff_testing.cluster.start_cluster``) and one meta service as a process on the embedded default store
(SQLite in ``--dir``), or with ``--postgres`` on a PostgreSQL server started for the run; ``--meta-instances N``
starts N meta services on the one database. ``--threads`` client threads share one ``hf3fs.FileSystem`` per meta
instance (as a data loader or FUSE would), thread t calling instance t % N. Each round runs every operation for
``--seconds`` on each side, in an order that rotates between rounds; the no-op is the gRPC health Check on the meta
server (served by the same ff_rpc runtime and interceptor), called through the FileSystem's event-loop thread like
every meta call. With several instances a fourth side, ``one``, runs the meta operations through the first instance
only, so that "N instances / 1" is a ratio within the run.

- create: new empty files (one meta Create each) in one directory per thread (not the listed one);
- stat: stat of existing files (/bench-<pid>/t<thread>/f<k>: three components);
- list: listdir of a directory with ``--entries`` entries (one List page);
- rename: a file renamed back and forth within its directory.

Prints per-round rates, the medians, the median per-round ratios meta/no-op and meta/local, and the CPU time per
call of meta's processes and of this (client) process on the meta and no-op sides (from /proc and
``time.process_time``: steadier than rates on a shared machine). Goals (issue 24): stat and list >= 0.85 of the
no-op rate; creates >= 2,000/s on SQLite; creates scale with meta instances on PostgreSQL.

    .venv/bin/python bench/meta_ops.py                     # 5 rounds x 4 ops x 3 sides x 2 s, ~2 min
    .venv/bin/python bench/meta_ops.py --ops stat,list --rounds 3
    .venv/bin/python bench/meta_ops.py --postgres --meta-instances 2 --ops create
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from grpc_health.v1 import health_pb2, health_pb2_grpc

import hf3fs
from ff_cluster import MgmtdClient
from ff_rpc import open_channel
from ff_rpc.fastpath import FastPool
from ff_testing.cluster import CLUSTER_TOKEN, StorageCluster, start_cluster
from ff_testing.meta import MetaProcess, meta_process
from ff_testing.postgres import PostgresServer, start_postgres
from fireflyer.mgmtd.v1 import mgmtd_pb2 as mpb

OPS = ("create", "stat", "list", "rename")
SIDES = ("meta", "noop", "local")
Rates = dict[tuple[str, str], list[float]]
Cpu = dict[tuple[str, str], tuple[list[float], list[float], list[float]]]  # CPU us per call: meta, client, PostgreSQL


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used, from ``/proc/<pid>/stat``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def postgres_cpu_s(server: PostgresServer) -> float:
    """CPU seconds the PostgreSQL server's processes (the postmaster and its children, the backends) have used."""
    postmaster = int((server.data_dir / "postmaster.pid").read_text().split()[0])
    pids = [postmaster]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rpartition(")")[2].split()[1]) == postmaster:
                    pids.append(int(entry.name))
            except (OSError, ValueError):
                continue  # gone meanwhile
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += process_cpu_s(pid)
    return total


def run_for(seconds: float, threads: int, op: Callable[[int, int], None]) -> tuple[float, int]:
    """(ops/s, ops) of ``op(thread, i)`` run by ``threads`` threads for ``seconds``."""
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
    return sum(counts) / elapsed, sum(counts)


class MetaSide:
    """The operations through hf3fs; thread ``t`` calls meta instance ``t % len(fss)`` (a FileSystem each)."""

    def __init__(self, fss: list[hf3fs.FileSystem], threads: int, entries: int, serial: Iterator[int]) -> None:
        self.fss = fss
        self.top = f"/bench-{os.getpid()}"
        self.serial = serial
        fs = fss[0]
        for t in range(threads):
            fs.makedirs(f"{self.top}/t{t}", exist_ok=True)
            fs.makedirs(f"{self.top}/c{t}", exist_ok=True)
            for k in range(entries):
                if not fs.exists(f"{self.top}/t{t}/f{k}"):
                    fs.create(f"{self.top}/t{t}/f{k}")

    def op(self, name: str) -> Callable[[int, int], None]:
        fss, top, n = self.fss, self.top, len(self.fss)
        if name == "create":
            batch = next(self.serial)
            return lambda t, i: fss[t % n].create(f"{top}/c{t}/c{batch}-{i}") and None
        if name == "stat":
            return lambda t, i: fss[t % n].stat(f"{top}/t{t}/f{i % 50}") and None
        if name == "list":
            return lambda t, i: fss[t % n].listdir(f"{top}/t{t}") and None
        return lambda t, i: fss[t % n].rename(f"{top}/t{t}/f{i % 2}", f"{top}/t{t}/f{(i + 1) % 2}x") or fss[
            t % n].rename(f"{top}/t{t}/f{(i + 1) % 2}x", f"{top}/t{t}/f{i % 2}")  # fmt: skip


class NoopSide:
    """The health Check on the meta servers, through the FileSystems' loops like every meta call (thread ``t``: the
    instance ``t % len(fss)``, as on the meta side), over the transport meta calls take: the fast path
    (``ff_rpc.fastpath``) where the instance registered one, else gRPC."""

    def __init__(self, fss: list[hf3fs.FileSystem], addresses: list[str]) -> None:
        self.fss = fss
        self.pool = FastPool()

        async def make(address: str) -> health_pb2_grpc.HealthStub:
            return health_pb2_grpc.HealthStub(open_channel(address))

        self.stubs = [fs._run(make(address)) for fs, address in zip(fss, addresses, strict=True)]
        self.fast = [fs._run(_fast_endpoint(fs, address)) for fs, address in zip(fss, addresses, strict=True)]
        self.request = health_pb2.HealthCheckRequest()
        self.transport = "fast path" if all(self.fast) else "gRPC"

    def op(self, name: str) -> Callable[[int, int], None]:
        fss, stubs, fast, req, n = self.fss, self.stubs, self.fast, self.request, len(self.fss)
        calls = 2 if name == "rename" else 1  # a rename is two calls on the meta side too
        raw = req.SerializeToString()

        async def check(t: int) -> None:
            if fast[t % n]:
                await self.pool.call(fast[t % n], "/grpc.health.v1.Health/Check", raw, (), 10)
            else:
                await stubs[t % n].Check(req, timeout=10)

        def run(t: int, i: int) -> None:
            for _ in range(calls):
                fss[t % n]._run(check(t))

        return run


async def _fast_endpoint(fs: hf3fs.FileSystem, address: str) -> str:
    """The fast endpoint of the meta instance at ``address``, from mgmtd's routing, as the client finds it."""
    meta = fs._conn.meta
    await meta.refresh()
    return meta._fast_of.get(address, "")


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


async def start(folder: Path, database_url: str, instances: int) -> tuple[StorageCluster, list[MetaProcess], str]:
    """The cluster, ``instances`` meta services on ``database_url``, and a user token."""
    cluster = await start_cluster(folder / "cluster")
    metas: list[MetaProcess] = []
    try:
        mg = MgmtdClient([cluster.mgmtd_address], token=CLUSTER_TOKEN)
        try:
            await mg.identity.create_user(mpb.CreateUserRequest(name="bench"))
            token = (await mg.identity.issue_token(mpb.IssueTokenRequest(user_name="bench"))).token
        finally:
            await mg.close()
        for k in range(instances):  # one after the other: the first runs the migrations
            meta = meta_process(folder, f"meta{k}", mgmtd_address=cluster.mgmtd_address, cluster_token=CLUSTER_TOKEN,
                                database_url=database_url, log_level="WARNING")  # fmt: skip
            metas.append(meta)
            meta.start()
            await meta.ready()
        return cluster, metas, token
    except BaseException:
        for meta in metas:
            meta.stop()
        cluster.stop()
        raise


def cpu_sides(rates: Rates, op: str) -> list[str]:
    """The sides measured for ``op`` other than the local file system."""
    return [s for (o, s) in rates if o == op and s != "local"]


def median_ratio(a: list[float], b: list[float]) -> float:
    """The median of the per-round ratios a/b."""
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def report(rates: Rates, cpu: Cpu, ops: tuple[str, ...], instances: int, *, postgres: bool = False) -> None:
    """The medians, the per-round ratios and the CPU per call of meta's processes and of this (client) process."""
    print(f"{'op':8} {'meta/s':>10} {'noop/s':>10} {'local/s':>10} {'meta/noop':>10} {'meta/local':>11}"
          f" {'meta-proc us/call':>18} {'client us/call':>15}")  # fmt: skip
    for op in ops:
        m, n, loc = (rates[(op, s)] for s in SIDES)
        server = "/".join(f"{statistics.median(cpu[(op, s)][0]):.0f}" for s in ("meta", "noop"))
        client = "/".join(f"{statistics.median(cpu[(op, s)][1]):.0f}" for s in ("meta", "noop"))
        print(f"{op:8} {statistics.median(m):>10,.0f} {statistics.median(n):>10,.0f} "
              f"{statistics.median(loc):>10,.0f} {median_ratio(m, n):>10.2f} {median_ratio(m, loc):>11.3f} "
              f"{server:>18} {client:>15}")  # fmt: skip
    print("(us/call: CPU of meta's processes and of this process per call, meta side / no-op side, medians)")
    if postgres:
        for op in ops:
            per_side = ", ".join(f"{s} {statistics.median(cpu[(op, s)][2]):,.0f}" for s in cpu_sides(rates, op))
            print(f"PostgreSQL's processes, CPU us per {op}: {per_side}")
    if instances > 1:
        print(f"\nthrough one of the {instances} meta instances (side 'one') and through all of them:")
        for op in ops:
            one, every = rates[(op, "one")], rates[(op, "meta")]
            one_cpu, all_cpu = (statistics.median(cpu[(op, side)][0]) for side in ("one", "meta"))
            print(f"{op:8} one {statistics.median(one):>8,.0f}/s, all {statistics.median(every):>8,.0f}/s: "
                  f"{instances} instances / 1 = {median_ratio(every, one):.2f}; meta CPU us per call: one "
                  f"{one_cpu:,.0f}, all {all_cpu:,.0f}")  # fmt: skip
    goals = []
    for op in ("stat", "list"):
        if op in ops:
            ratio = median_ratio(rates[(op, "meta")], rates[(op, "noop")])
            goals.append(f"{op} >= 0.85 of no-op: {ratio:.2f} ({'met' if ratio >= 0.85 else 'NOT met'})")
    if "create" in ops:
        creates = statistics.median(rates[("create", "meta")])
        goals.append(f"creates >= 2,000/s: {creates:,.0f}/s ({'met' if creates >= 2000 else 'NOT met'})")
    print("\ngoals: " + "; ".join(goals))


def measure(
    runners: dict[str, MetaSide | NoopSide | LocalSide],
    ops: tuple[str, ...],
    sides: tuple[str, ...],
    pids: list[int],
    args: argparse.Namespace,
    pg: PostgresServer | None = None,
) -> tuple[Rates, Cpu]:
    """Every op on every side for ``args.seconds``, ``args.rounds`` times (the sides' order rotating).

    The server CPU per call is meta's processes' and, with ``pg``, PostgreSQL's too (a third figure in the Cpu lists).
    """
    rates: Rates = {(o, s): [] for o in ops for s in sides}
    cpu: Cpu = {(o, s): ([], [], []) for o in ops for s in sides}
    for r in range(args.rounds):
        order = sides[r % len(sides) :] + sides[: r % len(sides)]
        line = []
        for op in ops:
            for side in order:
                server0, client0 = sum(map(process_cpu_s, pids)), time.process_time()
                pg0 = postgres_cpu_s(pg) if pg is not None else 0.0
                rate, calls = run_for(args.seconds, args.threads, runners[side].op(op))
                server_s, client_s = sum(map(process_cpu_s, pids)) - server0, time.process_time() - client0
                pg_s = postgres_cpu_s(pg) - pg0 if pg is not None else 0.0
                rates[(op, side)].append(rate)
                cpu[(op, side)][0].append(server_s / max(calls, 1) * 1e6)
                cpu[(op, side)][1].append(client_s / max(calls, 1) * 1e6)
                cpu[(op, side)][2].append(pg_s / max(calls, 1) * 1e6)
            line.append(f"{op} " + " ".join(f"{s}={rates[(op, s)][-1]:,.0f}/s" for s in sides))
        print(f"round {r + 1}: " + "; ".join(line), flush=True)
    return rates, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--entries", type=int, default=100)
    parser.add_argument("--ops", default=",".join(OPS), help=f"which of {','.join(OPS)} to run (default: all)")
    parser.add_argument("--postgres", action="store_true", help="meta on a PostgreSQL server started for the run")
    parser.add_argument("--meta-instances", type=int, default=1, help="meta services on the one database")
    parser.add_argument("--dir", type=Path, default=None, help="working folder (default: a temp folder)")
    args = parser.parse_args()
    ops = tuple(o for o in OPS if o in args.ops.split(","))
    sides = SIDES + (("one",) if args.meta_instances > 1 else ())
    folder = Path(tempfile.mkdtemp(prefix="bench-meta-", dir=args.dir))
    pg = start_postgres() if args.postgres else None
    try:
        url = pg.create_database() if pg is not None else f"sqlite:///{folder / 'meta.db'}"
        cluster, metas, token = asyncio.run(start(folder, url, args.meta_instances))
    except BaseException:
        if pg is not None:
            pg.stop()
        raise
    pids = [m.proc.pid for m in metas if m.proc is not None]
    try:
        with contextlib.ExitStack() as stack:
            fss = [stack.enter_context(hf3fs.connect(cluster.mgmtd_address, token, meta_addresses=[m.address]))
                   for m in metas]  # fmt: skip
            serial = itertools.count()
            runners: dict[str, MetaSide | NoopSide | LocalSide] = {
                "meta": MetaSide(fss, args.threads, args.entries, serial),
                "noop": NoopSide(fss, [m.address for m in metas]),
                "local": LocalSide(folder, args.threads, args.entries),
            }
            if "one" in sides:
                runners["one"] = MetaSide(fss[:1], args.threads, args.entries, serial)
            store = "PostgreSQL" if pg is not None else "SQLite"
            print(f"{args.threads} client threads, {args.seconds:g} s per measurement, {args.rounds} rounds, "
                  f"{args.meta_instances} meta on {store} (meta pids {pids}, this pid {os.getpid()})",
                  flush=True)  # fmt: skip
            rates, cpu = measure(runners, ops, sides, pids, args, pg)
            print()
            report(rates, cpu, ops, args.meta_instances, postgres=pg is not None)
    finally:
        for meta in metas:
            meta.stop()
        cluster.stop()
        if pg is not None:
            pg.stop()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
