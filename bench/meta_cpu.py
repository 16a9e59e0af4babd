"""Meta's own CPU per call, in process: the servicer called directly (no gRPC), on a SQLite file, against a real
mgmtd (for the chain tables a Create needs). The part of an RPC that meta's code decides, without the transport
and without the noise of a shared machine's wall time: CPU time (``time.process_time``) and Python function
calls (cProfile) per call of Stat (two components), List of a folder of ``--entries`` names, List with inodes,
Create, and Remove (unlink) of the files the Creates made.

Meta's read cache (Stat and List answers kept while the database has had no commit) is off unless ``--read-cache``:
nothing here commits between the Stats, so with it on every Stat after the first is a hit.

``--baseline-src FOLDER``: also run meta's code from FOLDER (``services/meta/src`` of another checkout, e.g. a
``git worktree`` of the commit before a change) in a child process, rounds interleaved with this tree's, and print
the median ratio baseline / this tree per operation (> 1: this tree spends less). ``--baseline-tree CHECKOUT``: the
same with every package of that checkout (for a commit whose meta needs its own libraries, e.g. e18b0ca, the meta of
before the operator layer).

    .venv/bin/python bench/meta_cpu.py --rounds 5
    git worktree add /tmp/before HEAD~1
    .venv/bin/python bench/meta_cpu.py --rounds 5 --baseline-src /tmp/before/services/meta/src
    git worktree add /tmp/arch e18b0ca && .venv/bin/python bench/meta_cpu.py --rounds 5 --baseline-tree /tmp/arch
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

OPS = ("stat", "list", "list+inodes", "create", "remove")
KEEP_READS_ENV = "META_CPU_READ_CACHE"  # "1": meta's read cache on (then Stat and List after the first are its hits)


async def measure(mgmtd: str, token: str, calls: int, entries: int) -> dict[str, tuple[float, float]]:
    """(CPU us per call, function calls per call) of each op, on a fresh SQLite file."""
    from ff_cluster import MgmtdClient
    from ff_rpc.auth import Principal, Role, set_current_principal
    from fireflyer.meta.v1 import meta_pb2 as pb

    folder = tempfile.mkdtemp(prefix="meta-cpu-")
    client = MgmtdClient([mgmtd], token=token, timeout_s=10.0)
    sv, close = await _servicer(f"sqlite:///{folder}/meta.db", client, token)
    set_current_principal(Principal(uid=0, name="admin", role=Role.ADMIN))
    await sv.Mkdirs(pb.MkdirsRequest(path=pb.PathAt(path="/d/e"), mode=0o777, recursive=True), None)
    for i in range(entries):
        await sv.Create(pb.CreateRequest(path=pb.PathAt(path=f"/d/e/f{i}"), mode=0o644), None)
    set_current_principal(Principal(uid=1000, name="user", role=Role.USER, gids=(1000,)))
    await sv.Mkdirs(pb.MkdirsRequest(path=pb.PathAt(path="/d/u"), mode=0o755), None)
    stats = [pb.StatRequest(path=pb.PathAt(path=f"/d/e/f{i % entries}")) for i in range(calls)]
    names = pb.ListRequest(path=pb.PathAt(path="/d/e"), page_size=entries)
    full = pb.ListRequest(path=pb.PathAt(path="/d/e"), page_size=entries, include_inodes=True)
    made = iter(range(10**9))
    removed = iter(range(10**9))  # the files the creates made, in order

    def runner(op: str) -> tuple[int, Callable[[], Awaitable[None]]]:
        async def stat() -> None:
            for r in stats:
                await sv.Stat(r, None)

        async def listing(req: pb.ListRequest, n: int) -> None:
            for _ in range(n):
                await sv.List(req, None)

        async def create() -> None:
            for _ in range(calls // 4):
                req = pb.CreateRequest(path=pb.PathAt(path=f"/d/u/c{next(made)}"), mode=0o644)
                await sv.Create(req, None)

        async def remove() -> None:
            for _ in range(calls // 4):
                await sv.Remove(pb.RemoveRequest(path=pb.PathAt(path=f"/d/u/c{next(removed)}")), None)

        return {
            "remove": (calls // 4, remove),
            "stat": (calls, stat),
            "list": (calls // 10, lambda: listing(names, calls // 10)),
            "list+inodes": (calls // 40, lambda: listing(full, calls // 40)),
            "create": (calls // 4, create),
        }[op]

    out: dict[str, tuple[float, float]] = {}
    for op in OPS:
        n, run = runner(op)
        await run()  # warm: caches, statements
        t0 = time.process_time()
        await run()
        cpu = time.process_time() - t0
        prof = cProfile.Profile()
        prof.enable()
        await run()
        prof.disable()
        out[op] = (cpu / n * 1e6, pstats.Stats(prof).total_calls / n)
    await close()
    await client.close()
    return out


async def _servicer(url: str, mgmtd: Any, token: str) -> tuple[Any, Callable[[], Awaitable[None]]]:
    """Meta's servicer over a new SQLite store, as its server wires it; the meta of before the operator layer
    (e18b0ca: ``MetaApp``) too, so that ``--baseline-tree`` can measure the code of before issue 21's point 3."""
    from ff_meta.servicer import MetaServicer

    try:
        from ff_meta.ops import MetaOps, MetaOptions
        from ff_meta.store.metastore import MetaStore
    except ImportError:  # before the operator layer
        from ff_meta.app import MetaApp
        from ff_meta.app import MetaOptions as AppOptions
        from ff_meta.server import MIGRATIONS as OLD_MIGRATIONS
        from ff_meta.server import tune_sqlite
        from ff_meta.store.schema import VERSION_TABLE
        from ff_store import open_store

        old = await asyncio.to_thread(open_store, url, OLD_MIGRATIONS, VERSION_TABLE)
        tune_sqlite(old.engine, "NORMAL")
        app = MetaApp(old, mgmtd, AppOptions(cluster_token=token))

        async def close_app() -> None:
            await app.close()
            await asyncio.to_thread(old.dispose)

        return MetaServicer(app), close_app
    store = await asyncio.to_thread(MetaStore.open, url)
    ops = MetaOps.build(store, mgmtd, MetaOptions(cluster_token=token))
    if os.environ.get(KEEP_READS_ENV) != "1" and hasattr(ops.shared, "reads"):
        from ff_meta.store.read_cache import ReadCache

        ops.shared.reads = ReadCache(max_entries=0)  # keeps nothing: Stat and List do their reads every call

    async def close_ops() -> None:
        await ops.close()
        await store.close()

    return MetaServicer(ops), close_ops


def child_main(argv: list[str]) -> None:
    mgmtd, token, calls, entries = argv[0], argv[1], int(argv[2]), int(argv[3])
    print(json.dumps(asyncio.run(measure(mgmtd, token, calls, entries))))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=2000, help="Stat calls a measurement (List a tenth, Create a quarter)")
    p.add_argument("--entries", type=int, default=100)
    p.add_argument(
        "--read-cache",
        action="store_true",
        help="leave meta's read cache on (554fc7c): Stat and List then measure its hits, as no call here commits",
    )
    p.add_argument("--baseline-src", type=Path, default=None, help="meta's src folder of another checkout")
    p.add_argument(
        "--baseline-tree", type=Path, default=None, help="another whole checkout: every package's src folder from it"
    )
    a = p.parse_args()
    from ff_testing.cluster import start_cluster
    from ff_testing.process import CLUSTER_TOKEN

    root = Path(tempfile.mkdtemp(prefix="meta-cpu-cluster-"))
    cluster = asyncio.run(start_cluster(root))
    baseline: list[Path] | None = None
    if a.baseline_tree is not None:
        baseline = sorted(a.baseline_tree.glob("*/*/src")) + sorted(a.baseline_tree.glob("appliance/src"))
    elif a.baseline_src is not None:
        baseline = [a.baseline_src]
    sides: dict[str, list[Path] | None] = {"this": None} if baseline is None else {"baseline": baseline, "this": None}
    results: dict[str, dict[str, list[tuple[float, float]]]] = {s: {op: [] for op in OPS} for s in sides}
    try:
        for r in range(a.rounds):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for side in order:
                env = dict(os.environ, **{KEEP_READS_ENV: "1" if a.read_cache else "0"})
                src = sides[side]
                if src is not None:
                    env["PYTHONPATH"] = os.pathsep.join([*map(str, src), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
                argv = [sys.executable, __file__, "--child", cluster.mgmtd_address, CLUSTER_TOKEN, str(a.calls)]
                out = subprocess.run([*argv, str(a.entries)], env=env, capture_output=True, text=True, check=True)
                got = json.loads(out.stdout.strip().splitlines()[-1])
                for op in OPS:
                    results[side][op].append(tuple(got[op]))
                line = ", ".join(f"{op} {got[op][0]:.1f} us / {got[op][1]:.0f} calls" for op in OPS)
                print(f"round {r + 1} {side}: {line}", flush=True)
    finally:
        cluster.stop()
    print(f"\nmedians (CPU us per call / Python function calls per call), {a.rounds} rounds, {a.entries} entries:")
    for op in OPS:
        cells = []
        for side in sides:
            cpu = statistics.median(v[0] for v in results[side][op])
            calls = statistics.median(v[1] for v in results[side][op])
            cells.append(f"{side} {cpu:8.1f} us {calls:6.0f} calls")
        if "baseline" in sides:
            pairs = zip(results["baseline"][op], results["this"][op], strict=True)
            ratio = statistics.median(b[0] / t[0] for b, t in pairs)
            cells.append(f"baseline/this CPU {ratio:.2f}")
        print(f"  {op:12} " + " | ".join(cells))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main(sys.argv[2:])
    else:
        sys.exit(main())
