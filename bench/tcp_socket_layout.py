"""Loopback TCP between emulated nodes: tree links carrying data both ways against one connection per direction.

The traffic of hfreduce's tree links at 2 nodes x ``--num-local`` local ranks, and nothing else: each rank exchanges
its slice with the same local rank of the other node, half per tree, a thread per send and per receive (hfreduce's
thread runner, its ``Link`` calls). Two layouts of the same bytes, set up once in the same processes and alternated
round by round:

- ``both``: per tree one connection, carrying partial chunks up and final chunks down (hfreduce before 2026-11-25);
- ``one-way``: per tree one connection each way (hfreduce now).

Per round and layout, ``--exchanges`` back-to-back exchanges: the wall time (max over ranks), the machine's busy
time (all CPUs, softirq included, from /proc/stat; it counts whole clock ticks, so it is summed over all rounds of a
layout) and the kernel's count of packets it coalesced into a socket's backlog (``TcpExt: TCPBacklogCoalesce``,
packets that arrived while a thread held the socket: the contention a socket carrying both ways has). Prints the
wall medians, the median of the per-round wall ratios both / one-way, and the ratio of the busy totals.

    .venv/bin/python bench/tcp_socket_layout.py --rounds 11 --num-local 2
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import threading
import time
from typing import Any

import numpy as np
from _hfreduce_common import MS_PER_TICK, connect_to_peer, free_ports, machine_busy_ticks, run_ranks

LAYOUTS = ("both", "one-way")
TIMEOUT_S = 60.0


def backlog_coalesced() -> int:
    """The kernel's TcpExt TCPBacklogCoalesce counter (whole machine)."""
    with open("/proc/net/netstat") as f:
        lines = [line.split() for line in f if line.startswith("TcpExt:")]
    return int(dict(zip(lines[0][1:], lines[1][1:], strict=True))["TCPBacklogCoalesce"])


def rank_main(
    node: int,
    local: int,
    num_local: int,
    port: int,
    nbytes: int,
    rounds: int,
    exchanges: int,
    barrier: Any,
    queue: Any,
) -> None:
    from hfreduce.transport import Link, tune_tcp  # in the rank processes only

    chunk = 4 << 20
    socks = connect_to_peer(node, port, 6, barrier.wait, TIMEOUT_S)
    for sock in socks:
        tune_tcp(sock, 0)  # as hfreduce sets up its links (kernel autotuning)
    links = [Link(sock, -1, TIMEOUT_S) for sock in socks]
    # "both": connection t carries tree t both ways; "one-way": connection 2 + 2 * t + d carries tree t from node d
    plans = {
        "both": [(links[t], links[t]) for t in (0, 1)],
        "one-way": [(links[2 + 2 * t + node], links[2 + 2 * t + 1 - node]) for t in (0, 1)],
    }
    out = np.ones(nbytes // 4, dtype=np.float32)
    into = np.ones(nbytes // 4, dtype=np.float32)
    src, dst = out.data.cast("B"), into.data.cast("B")
    half = nbytes // 2

    def send(link: Any, view: memoryview) -> None:
        for c in range(0, len(view), chunk):
            link.send(view[c : c + chunk])

    def recv(link: Any, view: memoryview) -> None:
        for c in range(0, len(view), chunk):
            link.recv_into(view[c : c + chunk])

    def exchange(layout: str) -> None:
        threads = []
        for t, (out_link, in_link) in enumerate(plans[layout]):
            span = slice(t * half, (t + 1) * half)
            threads.append(threading.Thread(target=send, args=(out_link, src[span])))
            threads.append(threading.Thread(target=recv, args=(in_link, dst[span])))
        for th in threads:
            th.start()
        for th in threads:
            th.join()

    for layout in LAYOUTS:  # warm-up
        exchange(layout)
    rank = node * num_local + local
    for r in range(rounds):
        order = LAYOUTS if r % 2 == 0 else LAYOUTS[::-1]
        for layout in order:
            barrier.wait()
            b0, k0 = machine_busy_ticks(), backlog_coalesced()
            t0 = time.perf_counter()
            for _ in range(exchanges):
                exchange(layout)
            took = time.perf_counter() - t0
            barrier.wait()
            busy, backlog = machine_busy_ticks() - b0, backlog_coalesced() - k0
            queue.put((r, layout, rank, took / exchanges, busy, backlog / exchanges))
    for sock in socks:
        sock.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=32, help="bytes each rank sends (and receives) per exchange")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--exchanges", type=int, default=16, help="back-to-back exchanges per round and layout")
    parser.add_argument("--num-local", type=int, default=2, help="local ranks per emulated node")
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    num_local, rounds, exchanges = args.num_local, args.rounds, args.exchanges
    barrier = ctx.Barrier(2 * num_local)
    ports = free_ports(num_local)
    procs = [
        ctx.Process(
            target=rank_main,
            args=(node, local, num_local, ports[local], args.mib << 20, rounds, exchanges, barrier, queue),
        )
        for node in range(2)
        for local in range(num_local)
    ]
    got = run_ranks(procs, queue, rounds * len(LAYOUTS) * 2 * num_local)
    wall = {(r, lay): max(g[3] for g in got if g[:2] == (r, lay)) for r in range(rounds) for lay in LAYOUTS}
    rank0 = {(g[0], g[1]): g for g in got if g[2] == 0}  # rank 0 read the machine-wide counters
    busy = {lay: sum(rank0[(r, lay)][4] for r in range(rounds)) * MS_PER_TICK / rounds / exchanges for lay in LAYOUTS}
    print(
        f"# 2 nodes x {num_local} local ranks on loopback, each rank sends and receives {args.mib} MiB per exchange "
        f"in 4 MiB chunks, a thread per send and receive; {rounds} rounds of {exchanges} exchanges per layout; "
        f"busy time per exchange from clock ticks summed over the rounds (one tick is "
        f"{MS_PER_TICK / rounds / exchanges:.2f} ms of it)"
    )
    print(f"{'layout':>8} {'wall ms':>8} {'busy ms':>8} {'backlog':>8}")
    for lay in LAYOUTS:
        w = statistics.median(wall[(r, lay)] for r in range(rounds)) * 1e3
        backlog = statistics.median(rank0[(r, lay)][5] for r in range(rounds))
        print(f"{lay:>8} {w:8.1f} {busy[lay]:8.1f} {backlog:8.0f}")
    wall_ratio = statistics.median(wall[(r, "both")] / wall[(r, "one-way")] for r in range(rounds))
    busy_ratio = busy["both"] / busy["one-way"]
    print(f"MEDIAN RATIO both / one-way: wall {wall_ratio:.2f}x; machine busy (totals) {busy_ratio:.2f}x")


if __name__ == "__main__":
    main()
