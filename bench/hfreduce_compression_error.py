"""Error that wire compression (fp32 data sent as bf16 or fp16) adds to an allreduce sum.

Each rank holds standard-normal fp32 data (seeded); the result is compared with the float64 sum of the
same fp32 inputs. Errors are relative to sum(|x|) per element (the scale rounding errors live on) and,
as "rms rel", the rms error over the rms of the exact result.

    .venv/bin/python bench/hfreduce_compression_error.py --layouts 2x1,2x2,4x1 --elems 1000000
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
from typing import Any

import numpy as np
from _hfreduce_common import free_port, loopback_config


def rank_main(
    node: int, local: int, nodes: int, num_local: int, port: int, elems: int, wire: str | None, queue: Any
) -> None:
    from hfreduce import Group

    world, rank = nodes * num_local, node * num_local + local
    x = np.random.default_rng(7).standard_normal((world, elems)).astype(np.float32)
    buf = x[rank].copy()
    cfg = loopback_config(node, local, nodes, num_local, port, compression=wire)
    with Group(cfg) as group:
        group.allreduce(buf)
    if rank == 0:
        exact = x.astype(np.float64).sum(0)
        err = np.abs(buf - exact)
        scale = np.abs(x).astype(np.float64).sum(0)
        queue.put(
            (
                float(np.max(err / scale)),
                float(np.mean(err / scale)),
                float(np.sqrt(np.mean(err**2)) / np.sqrt(np.mean(exact**2))),
            )
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layouts", default="2x1,2x2,4x1")
    parser.add_argument("--elems", type=int, default=1_000_000)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    print(f"{'layout':>6} {'wire':>5} {'max rel':>10} {'mean rel':>10} {'rms rel':>10}")
    for layout in args.layouts.split(","):
        nodes, num_local = (int(v) for v in layout.split("x"))
        for wire in (None, "bf16", "fp16"):
            queue = ctx.Queue()
            port = free_port()
            procs = [
                ctx.Process(target=rank_main, args=(n, lr, nodes, num_local, port, args.elems, wire, queue))
                for n in range(nodes)
                for lr in range(num_local)
            ]
            for p in procs:
                p.start()
            worst, mean, rms = queue.get(timeout=300)
            for p in procs:
                p.join()
            print(f"{layout:>6} {wire or 'fp32':>5} {worst:10.2e} {mean:10.2e} {rms:10.2e}")


if __name__ == "__main__":
    main()
