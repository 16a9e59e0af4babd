"""What the torch.distributed backend "hfreduce" costs over hfreduce itself, and how it compares with gloo.

Per size, interleaved in the same rank processes (the order rotates from round to round), ``--ops`` back-to-back
allreduces of one float32 tensor each: ``dist.all_reduce`` on ``new_group(backend="hfreduce")`` ("backend"), the
same group's ``hfreduce.Group`` called directly ("raw"), and ``dist.all_reduce`` on the gloo world ("gloo").
Time = max over ranks; ratios are medians over rounds of per-round ratios. Nodes are simulated on this machine
(FF_HFREDUCE_NODE_RANK); torch runs one thread per rank. 25 MiB is DDP's default bucket.

    .venv/bin/python bench/hfreduce_torch_backend.py --layouts 2x1,2x2 --sizes 1048576,26214400 --rounds 9
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time
from typing import Any

from _hfreduce_common import free_ports, run_ranks

KINDS = ("backend", "raw", "gloo")


def rank_main(rank: int, world: int, num_local: int, port: int, args: argparse.Namespace, queue: Any) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        FF_HFREDUCE_NODE_RANK=str(rank // num_local),
        FF_HFREDUCE_TIMEOUT_S="120",
        GLOO_SOCKET_IFNAME="lo",
    )
    import torch
    import torch.distributed as dist

    import hfreduce.distributed  # noqa: F401  (registers the backend)

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    hf = dist.new_group(backend="hfreduce")
    raw = hf.hf  # the backend's own hfreduce Group

    def run(kind: str, t: Any) -> float:
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.ops):
            if kind == "raw":
                raw.allreduce(t)
            else:
                dist.all_reduce(t, group=hf if kind == "backend" else None)
        return (time.perf_counter() - start) / args.ops

    for size in args.sizes:
        t = torch.zeros(size // 4)  # zeros: repeated in-place sums of random data would overflow to inf
        for kind in KINDS:  # warm-up: shared slots, first touch
            run(kind, t)
        for r in range(args.rounds):
            order = KINDS[r % 3 :] + KINDS[: r % 3]
            took = {kind: run(kind, t) for kind in order}
            worst = torch.tensor([took[k] for k in KINDS], dtype=torch.float64)
            dist.all_reduce(worst, op=dist.ReduceOp.MAX)
            if rank == 0:
                queue.put((size, dict(zip(KINDS, worst.tolist(), strict=True))))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layouts", default="2x1,2x2")
    parser.add_argument("--sizes", default="1048576,26214400", help="bytes per allreduce, comma separated")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--ops", type=int, default=3, help="allreduces per kind and round")
    args = parser.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",")]
    ctx = mp.get_context("spawn")
    for layout in args.layouts.split(","):
        nodes, num_local = (int(x) for x in layout.split("x"))
        world = nodes * num_local
        queue = ctx.Queue()
        (port,) = free_ports(1)
        procs = [ctx.Process(target=rank_main, args=(r, world, num_local, port, args, queue)) for r in range(world)]
        rounds = run_ranks(procs, queue, expect=len(args.sizes) * args.rounds)
        print(f"\n# layout {layout}: ms per allreduce (median of {args.rounds} rounds of {args.ops} ops)")
        print(f"{'size':>12} {'backend':>9} {'raw':>9} {'gloo':>9} {'backend/raw':>12} {'gloo/backend':>13}")
        for size in args.sizes:
            got = [t for s, t in rounds if s == size]
            med = {k: statistics.median(t[k] for t in got) * 1e3 for k in KINDS}
            over = statistics.median(t["backend"] / t["raw"] for t in got)
            vs_gloo = statistics.median(t["gloo"] / t["backend"] for t in got)
            print(
                f"{size:>12} {med['backend']:>9.2f} {med['raw']:>9.2f} {med['gloo']:>9.2f} "
                f"{over:>12.3f} {vs_gloo:>13.2f}"
            )
            print(f"MEDIAN RATIO {layout} {size} B: backend / raw {over:.3f}, gloo / backend {vs_gloo:.2f}x")


if __name__ == "__main__":
    main()
