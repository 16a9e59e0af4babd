"""hfreduce alone: back-to-back allreduces on one layout, wall time and CPU per op.

No gloo and no barrier between ops: what the library costs when nothing else runs, for comparing two versions of
the code (run it alternately at both commits, several pairs; these machines are noisy). Prints the wall time per
op (max over ranks), the CPU of the ranks' processes per op (user + sys, summed over ranks), the machine's busy
time per op (all CPUs, softirq included, from /proc/stat), and which copy of the library the ranks ran (so a run
with another version on ``PYTHONPATH`` says so).

    .venv/bin/python bench/hfreduce_back_to_back.py --layout 2x2 --mib 64 --ops 80 --buffer registered
    .venv/bin/python bench/hfreduce_back_to_back.py --layout 2x1 --bytes 8 --ops 3000 --buffer ordinary
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
from _hfreduce_common import MS_PER_TICK, free_port, loopback_config, machine_busy_ticks, run_ranks


def rank_main(
    node: int, local: int, nodes: int, num_local: int, port: int, args: argparse.Namespace, queue: Any
) -> None:
    import hfreduce  # in the rank processes only
    from hfreduce import Group

    cfg = loopback_config(node, local, nodes, num_local, port, timeout_s=60, pipeline=args.pipeline)
    with Group(cfg) as group:
        n = max(1, (args.bytes or args.mib << 20) // 4)
        # zeros: sums of ones would overflow to inf after some 60 ops at 4 ranks
        buf = group.alloc(n) if args.buffer == "registered" else np.zeros(n, dtype=np.float32)
        for _ in range(3):
            group.allreduce(buf)
        group.barrier()
        b0, c0, t0 = machine_busy_ticks(), time.process_time(), time.perf_counter()
        for _ in range(args.ops):
            group.allreduce(buf)
        group.barrier()
        queue.put((time.perf_counter() - t0, time.process_time() - c0, machine_busy_ticks() - b0, hfreduce.__file__))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layout", default="2x2", help="nodes x local ranks")
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--bytes", type=int, default=0, help="the buffer's size in bytes (instead of --mib)")
    parser.add_argument("--ops", type=int, default=80)
    parser.add_argument("--buffer", choices=["registered", "ordinary"], default="registered")
    parser.add_argument("--pipeline", choices=["auto", "threads", "loop"], default="auto")
    args = parser.parse_args()
    nodes, num_local = (int(x) for x in args.layout.split("x"))
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=rank_main, args=(node, local, nodes, num_local, port, args, queue))
        for node in range(nodes)
        for local in range(num_local)
    ]
    got = run_ranks(procs, queue, len(procs))
    wall = max(g[0] for g in got) / args.ops * 1e3
    cpu = sum(g[1] for g in got) / args.ops * 1e3
    busy = statistics.median(g[2] for g in got) * MS_PER_TICK / args.ops
    size = f"{args.bytes} B" if args.bytes else f"{args.mib} MiB"
    print(
        f"{args.layout} {args.buffer} {size}, {args.ops} ops: wall {wall:.3f} ms/op, "
        f"CPU of the ranks {cpu:.3f} ms/op, machine busy {busy:.3f} ms/op; hfreduce from "
        f"{', '.join(sorted({str(Path(g[3]).parent) for g in got}))}"
    )


if __name__ == "__main__":
    main()
