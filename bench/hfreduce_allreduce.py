"""hfreduce vs torch.distributed gloo allreduce, OSU style: algbw/busbw per size, interleaved rounds.

Every rank is both a gloo rank and an hfreduce rank on the same layout (nodes x local ranks, all on
loopback). Per round and size, in the same processes: hfreduce on an ordinary array ("copy": local
ranks read and write each other's buffers directly), the same staged through shared memory ("staged",
cross_memory=False), hfreduce on a registered buffer ("reg", zero copy), gloo on the same ordinary
array, the shared-memory reduce ceiling (all ranks reduce the world's buffers held in one
shared-memory space, no network), and at 2 nodes the wire floor (each rank only exchanges its slice with
the same local rank of the other node over loopback TCP: the bytes hfreduce's trees move, nothing else).
Every round each rank's buffer is new random data (normal, float32); gloo goes first and its result is the
reference: every element of every hfreduce result is compared with it (within float32 summation's tolerance for
the world size; the "ok" column). 8 B and 4 KiB give the latency line (time per allreduce vs gloo's).
Time = max over ranks. Ratios are medians of per-round ratios
t_gloo / t_hfreduce. CPU time (user + sys of every thread, summed over ranks) is printed too: on this
2-core box the ops are CPU-bound, so it predicts the ratios without the noise of other load. Process CPU
time leaves out the kernel's softirq work (loopback TCP's receive path), so the machine's busy time during
each kind of op (all CPUs, from /proc/stat, averaged over rounds) is printed as well, also for the wire floor
and the ceiling: what hfreduce's TCP bytes cost alone, and what the sums of an allreduce cost alone.
``--profile`` prints hfreduce's wall time per phase and rank.

    .venv/bin/python bench/hfreduce_allreduce.py --layouts 2x1,2x2 --rounds 11
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import signal
import statistics
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from _hfreduce_common import (
    MS_PER_TICK,
    WireFloor,
    free_ports,
    loopback_config,
    machine_busy_ticks,
    run_ranks,
)

KIB = 1024
DEFAULT_SIZES = [8] + [KIB * 4**i for i in range(10)]  # 8 B (latency), then 1 KiB .. 256 MiB
LATENCY_SIZES = (8, 4 * KIB)  # the sizes of the latency line: time per allreduce, hfreduce vs gloo
# hfreduce on an ordinary array (local ranks read and write each other's buffers directly), on an ordinary
# array staged through shared memory (cross_memory=False: the path before cross-memory attach), on a
# registered buffer; then gloo
KINDS = ("copy", "staged", "reg", "gloo")
# what the CPU clocks keep per op: the kinds above, the shared-memory reduce ceiling, the wire floor
SLOTS = (*KINDS, "ceil", "wire")


class Clock:
    """Times one op after a gloo barrier; keeps this rank's CPU seconds (all threads, user + sys) of the
    last op of each kind, and with ``profile`` reports hfreduce's seconds by phase to the parent."""

    def __init__(self, dist: Any, queue: Any, rank: int, profile: bool) -> None:
        self.dist, self.queue, self.rank, self.profile = dist, queue, rank, profile
        self.cpu = [0.0] * len(SLOTS)
        self.busy = [0] * len(SLOTS)  # rank 0: the machine's busy clock ticks during the last op of each slot

    def timed(self, fn: Any, slot: int = -1) -> float:
        self.dist.barrier()
        b0 = machine_busy_ticks() if self.rank == 0 and slot >= 0 else 0
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        took = time.perf_counter() - t0
        if slot >= 0:
            self.cpu[slot] = time.process_time() - c0
            if self.rank == 0:
                self.busy[slot] = machine_busy_ticks() - b0
        return took

    def profiled(self, kind: str, nbytes: int, fn: Any, group: Any) -> float:
        before = group.counters().seconds if self.profile else {}
        took = self.timed(fn, KINDS.index(kind))
        if self.profile:
            after = group.counters().seconds
            phases = {k: v - before.get(k, 0.0) for k, v in after.items()}
            self.queue.put(("phases", self.rank, nbytes, kind, phases))
        return took


def rank_main(
    node: int,
    local: int,
    nodes: int,
    num_local: int,
    ports: tuple[int, ...],
    sizes: list[int],
    rounds: int,
    shm_prefix: str,
    queue: Any,
    slot_bytes: int,
    profile: bool,
    options: dict[str, Any],
) -> None:
    import torch
    import torch.distributed as dist

    from hfreduce import Group

    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    world, rank = nodes * num_local, node * num_local + local
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{ports[1]}", rank=rank, world_size=world)
    configs = [
        loopback_config(
            node,
            local,
            nodes,
            num_local,
            port,
            timeout_s=120,
            shm_slot_bytes=slot_bytes,
            cross_memory=cross_memory,
            **options,
        )
        for port, cross_memory in ((ports[0], True), (ports[2], False))
    ]
    group, staged = (Group(config) for config in configs)
    worst = torch.zeros(len(KINDS) + 3, dtype=torch.float64)  # the times of KINDS, ceiling, wire; the worst error
    clock = Clock(dist, queue, rank, profile)
    timed, profiled, cpu = clock.timed, clock.profiled, clock.cpu
    wire = WireFloor(node, ports[3 + local], configs[0], dist) if nodes == 2 else None

    for nbytes in sizes:
        n = nbytes // 4
        buf = np.ones(n, dtype=np.float32)
        tbuf = torch.from_numpy(buf)
        reg = group.alloc(n)
        ceiling = [
            np.memmap(f"{shm_prefix}-{r}", dtype=np.float32, mode="r+", shape=(max(n, 1),))[:n] for r in range(world)
        ]
        a, b = n * rank // world, n * (rank + 1) // world
        out = np.empty(b - a, dtype=np.float32)
        s0, s1 = n * local // num_local, n * (local + 1) // num_local  # this rank's slice: the same on both nodes
        wire_into = np.ones(s1 - s0, dtype=np.float32)

        def shm_reduce(ceiling: list[Any] = ceiling, a: int = a, b: int = b, out: Any = out) -> None:
            np.add(ceiling[0][a:b], ceiling[1][a:b], out=out)
            for other in ceiling[2:]:
                np.add(out, other[a:b], out=out)

        for _ in range(2):  # warm-up
            group.allreduce(buf)
            staged.allreduce(buf)
            group.allreduce(reg)
            dist.all_reduce(tbuf)
        for round_index in range(rounds):
            # Random data, new every round and rank; gloo's result is the reference every hfreduce result is
            # compared with, element by element (float32 sums in another order: within TOLERANCE).
            src = np.random.default_rng([round_index, rank, nbytes]).standard_normal(n, dtype=np.float32)
            np.copyto(buf, src)
            gloo_took, expected = timed(partial(dist.all_reduce, tbuf), KINDS.index("gloo")), buf.copy()
            took, worst_error = _hfreduce_round(
                (("copy", group, buf), ("staged", staged, buf), ("reg", group, reg)),
                src,
                expected,
                world,
                partial(profiled, nbytes=nbytes),
            )
            took.append(gloo_took)
            took.append(timed(shm_reduce, SLOTS.index("ceil")))
            exchange = partial(wire.exchange, buf[s0:s1], wire_into) if wire is not None else None
            took.append(timed(exchange, SLOTS.index("wire")) if exchange is not None else float("nan"))
            worst.copy_(torch.tensor([*took, worst_error], dtype=torch.float64))
            dist.all_reduce(worst, op=dist.ReduceOp.MAX)
            ok, took = bool(worst[-1] <= 1.0), worst[:-1]
            cpu_sum = torch.tensor(cpu, dtype=torch.float64)
            dist.all_reduce(cpu_sum)
            if rank == 0:
                queue.put(("times", nbytes, ok, took.tolist(), cpu_sum.tolist(), list(clock.busy)))
    if wire is not None:
        wire.close()
    staged.close()
    group.close()
    dist.destroy_process_group()


def _hfreduce_round(
    runs: tuple[tuple[str, Any, Any], ...], src: Any, expected: Any, world: int, profiled: Any
) -> tuple[list[float], float]:
    """Each (kind, group, array) of ``runs``: ``src`` copied in, allreduced, timed, compared with ``expected``.

    The times in order, and the largest error seen (``_error``'s unit).
    """
    took, worst_error = [], 0.0
    for kind, grp, arr in runs:
        np.copyto(arr, src)
        took.append(profiled(kind, fn=partial(grp.allreduce, arr), group=grp))
        worst_error = max(worst_error, _error(arr, expected, world))
    return took, worst_error


def _error(got: Any, expected: Any, world: int) -> float:
    """The largest difference of ``got`` from ``expected``, in units of float32 summation's tolerance (1 = at it).

    Summing ``world`` float32 values in another order differs by at most about (world - 1) roundings of the
    partial sums' magnitude, each half an ulp: the tolerance per element is world * eps * (|expected| + 1) (the
    addends of a random-normal sum are of order 1, so a sum near 0 keeps an absolute tolerance).
    """
    if got.size == 0:
        return 0.0
    tolerance = world * np.finfo(np.float32).eps * (np.abs(expected) + 1.0)
    return float(np.max(np.abs(got - expected) / tolerance))


def run_layout(
    nodes: int,
    num_local: int,
    sizes: list[int],
    rounds: int,
    slot_bytes: int,
    profile: bool,
    options: dict[str, Any],
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    world = nodes * num_local
    prefix = f"/dev/shm/hfbench-{os.getpid()}"
    paths = [Path(f"{prefix}-{r}") for r in range(world)]
    for path in paths:
        np.ones(max(sizes) // 4, dtype=np.float32).tofile(path)
    ports = free_ports(3 + num_local)  # hfreduce, gloo, hfreduce staged, a wire floor port per local rank
    procs = [
        ctx.Process(
            target=rank_main,
            args=(n, lr, nodes, num_local, ports, sizes, rounds, prefix, queue, slot_bytes, profile, options),
        )
        for n in range(nodes)
        for lr in range(num_local)
    ]
    try:
        got = run_ranks(procs, queue, len(sizes) * rounds * (1 + (3 * world if profile else 0)))
    finally:
        for path in paths:
            path.unlink(missing_ok=True)
    return [r[1:] for r in got if r[0] == "times"], [r[1:] for r in got if r[0] == "phases"]


def _size(nbytes: int) -> str:
    if nbytes < KIB:
        return f"{nbytes} B"
    return f"{nbytes // KIB} KiB" if nbytes < KIB * KIB else f"{nbytes // KIB // KIB} MiB"


def report_phases(layout: str, phases: list[tuple[Any, ...]]) -> None:
    """Median ms per phase over rounds, per rank, for each size and kind (copy path, registered)."""
    print(f"\n# phases {layout}: median ms over rounds per rank (pipeline-task phases summed over tasks)")
    for nbytes in sorted({p[1] for p in phases}):
        for kind in KINDS[:-1]:
            mine = [p for p in phases if p[1] == nbytes and p[2] == kind]
            names = sorted({k for p in mine for k in p[3]}, key=_PHASE_ORDER.index)
            head = f"{_size(nbytes)} {kind}: "
            print(head + " ".join(f"{n:>8.8}" for n in ["rank", *names]))
            for rank in sorted({p[0] for p in mine}):
                per = [p[3] for p in mine if p[0] == rank]
                meds = [statistics.median(d.get(k, 0.0) for d in per) * 1e3 for k in names]
                print(" " * len(head) + f"{rank:>8} " + " ".join(f"{m:8.1f}" for m in meds))


_PHASE_ORDER = [
    "collective",
    "notify",
    "copy_in",
    "barrier_in",
    "tree",
    "barrier_out",
    "copy_out",
    "up_intra_reduce",
    "exchange",
    "exchange_finalize",
    "up_recv",
    "up_inter_reduce",
    "up_send",
    "up_reduce_send",
    "up_finalize",
    "down_wait_reduce",
    "down_recv",
    "down_send",
    "down_distribute",
]


def report(layout: str, world: int, rows: list[tuple[Any, ...]]) -> dict[int, dict[str, float]]:
    """rows: (nbytes, ok, max-over-ranks seconds per kind + ceiling + wire floor, CPU seconds per kind summed over
    ranks, the machine's busy clock ticks per kind)."""
    factor = 2 * (world - 1) / world
    print(
        f"\n# layout {layout} (world {world}); algbw = bytes/time, busbw = algbw * {factor:.2f}; GB/s = 1e9 B/s; "
        "medians over rounds; ratios are medians of per-round time ratios (gloo time / hfreduce time)"
    )
    hf = KINDS[:-1]
    gloo = KINDS.index("gloo")
    print(
        f"{'size':>10} "
        + " ".join(f"{k + ' alg/bus':>14}" for k in KINDS)
        + f" {'ceil alg':>8} "
        + " ".join(f"{k + '/gloo':>11}" for k in hf)
        + " "
        + " ".join(f"{k + '/ceil':>11}" for k in hf)
        + "  ok"
    )
    ceil, floor = len(KINDS), len(KINDS) + 1  # slots of the shared-memory ceiling and the wire floor in r[2]
    summary = {}
    cpu_lines: list[str] = []
    wire_lines: list[str] = []
    for nbytes in sorted({r[0] for r in rows}):
        mine = [r for r in rows if r[0] == nbytes]
        med = [statistics.median(r[2][i] for r in mine) for i in range(len(KINDS) + 1)]
        alg = [nbytes / t / 1e9 for t in med]
        pairs = " ".join(f"{f'{a:.3f}/{a * factor:.3f}':>14}" for a in alg[:-1])
        ratios = {k: statistics.median(r[2][gloo] / r[2][i] for r in mine) for i, k in enumerate(hf)}
        ceils = [statistics.median(r[2][ceil] / r[2][i] for r in mine) for i in range(len(hf))]
        ok = all(r[1] for r in mine)
        print(
            f"{_size(nbytes):>10} {pairs} {alg[-1]:8.3f} "
            + " ".join(f"{ratios[k]:11.2f}" for k in hf)
            + " "
            + " ".join(f"{c:11.2f}" for c in ceils)
            + f" {'yes' if ok else 'NO':>3}"
        )
        cpu_ms = [statistics.median(r[3][i] for r in mine) * 1e3 for i in range(len(KINDS))]
        cpu_ratios = [statistics.median(r[3][gloo] / r[3][i] for r in mine) for i in range(len(hf))]
        busy_ms = [sum(r[4][i] for r in mine) * MS_PER_TICK / len(mine) for i in range(len(SLOTS))]
        busy_ratios = [busy_ms[gloo] / b if b else float("nan") for b in busy_ms[: len(hf)]]
        cpu_lines.append(
            f"{_size(nbytes):>10} "
            + " ".join(f"{c:9.1f}" for c in cpu_ms)
            + " "
            + " ".join(f"{c:11.2f}" for c in cpu_ratios)
            + " | "
            + " ".join(f"{c:9.1f}" for c in busy_ms[: len(KINDS)])
            + " "
            + " ".join(f"{c:11.2f}" for c in busy_ratios)
        )
        wire = [r[2][floor] for r in mine]
        if not any(math.isnan(w) for w in wire):  # measured (2 nodes)
            wire_lines.append(
                f"{_size(nbytes):>10} {nbytes / statistics.median(wire) / 1e9:9.3f} "
                + " ".join(f"{statistics.median(r[2][floor] / r[2][i] for r in mine):11.2f}" for i in range(len(hf)))
                + f" {statistics.median(r[2][gloo] / r[2][floor] for r in mine):11.2f}"
                + f" | {busy_ms[SLOTS.index('wire')]:9.1f} {busy_ms[SLOTS.index('ceil')]:9.1f}"
            )
        summary[nbytes] = ratios
    print(
        "CPU ms per op: the ranks' processes (user + sys of all threads, medians), then the whole machine's busy "
        "time during the op (all CPUs, softirq included, mean over rounds); gloo CPU / hfreduce CPU for each:"
    )
    cpu_head = " ".join(f"{k:>9}" for k in KINDS) + " " + " ".join(f"{'gloo/' + k:>11}" for k in hf)
    print(f"{'size':>10} {cpu_head} | {cpu_head}")
    print("\n".join(cpu_lines))
    if wire_lines:
        print(
            "wire floor: each rank only exchanges its slice with its peer on the other node over TCP (algbw of "
            "the whole buffer); wire time / hfreduce time, and gloo time / wire time (about the most a design "
            "sending these bytes this way could reach); then the machine's busy ms during the wire floor, and during "
            "the shared-memory ceiling (the sums of an allreduce, world size - 1 per element, read from shared "
            "memory):"
        )
        print(
            f"{'size':>10} {'wire alg':>9} "
            + " ".join(f"{k + ' eff':>11}" for k in hf)
            + f" {'gloo/wire':>11} | {'wire busy':>9} {'ceil busy':>9}"
        )
        print("\n".join(wire_lines))
    for nbytes in LATENCY_SIZES:
        mine = [r for r in rows if r[0] == nbytes]
        if mine:
            us = [statistics.median(r[2][i] for r in mine) * 1e6 for i in range(len(KINDS))]
            print(
                f"LATENCY {layout} {_size(nbytes)}: "
                + ", ".join(f"{k} {t:.0f} us" for k, t in zip(KINDS, us, strict=True))
                + f"; gloo/reg {summary[nbytes]['reg']:.2f}x, gloo/ordinary {summary[nbytes]['copy']:.2f}x"
            )
    for nbytes in (64 * KIB * KIB, 256 * KIB * KIB):
        if nbytes in summary:
            s = summary[nbytes]
            print(
                f"MEDIAN RATIO {layout} {nbytes // KIB // KIB} MiB: ordinary {s['copy']:.2f}x gloo "
                f"(staged through shm {s['staged']:.2f}x), registered {s['reg']:.2f}x gloo"
            )
    return summary


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # run the finally blocks that remove /dev/shm files
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layouts", default="2x1,2x2", help="nodes x local ranks, comma separated")
    parser.add_argument("--sizes", default=",".join(str(s) for s in DEFAULT_SIZES), help="bytes, comma separated")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--shm-slot-mib", type=int, default=256)
    parser.add_argument("--profile", action="store_true", help="also print hfreduce's time per phase per rank")
    parser.add_argument("--chunk-kib", type=int, default=0, help="pipeline chunk size (default: the library's)")
    parser.add_argument(
        "--pipeline", choices=["auto", "threads", "loop"], default="auto", help="hfreduce's runner (GroupConfig)"
    )
    args = parser.parse_args()
    # numpy's OpenBLAS threads spin for a while after start; nothing here uses BLAS, so keep them out of the
    # way of both hfreduce and gloo (the ranks are spawned, so they read this before importing numpy)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    sizes = [int(s) for s in args.sizes.split(",")]
    options: dict[str, Any] = {"pipeline": args.pipeline}  # GroupConfig fields of both hfreduce groups
    if args.chunk_kib:
        options["chunk_size_bytes"] = args.chunk_kib << 10
    from hfreduce.shm import huge_pages  # after the environment above is set

    print(
        f"# transparent huge pages: private memory '{huge_pages(shared=False)}' (gloo's buffers here are numpy's, "
        f"which ask for them), shared memory '{huge_pages()}' (hfreduce's segments ask for them, and its "
        "registered buffers are collapsed into them where the kernel allows)"
    )
    for layout in args.layouts.split(","):
        nodes, num_local = (int(x) for x in layout.split("x"))
        rows, phases = run_layout(nodes, num_local, sizes, args.rounds, args.shm_slot_mib << 20, args.profile, options)
        report(layout, nodes * num_local, rows)
        if phases:
            report_phases(layout, phases)


if __name__ == "__main__":
    main()
