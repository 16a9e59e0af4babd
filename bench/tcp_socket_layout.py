"""Loopback TCP between emulated nodes: tree links carrying data both ways against one connection per direction.

The traffic of hfreduce's tree links at 2 nodes x 2 local ranks, and nothing else: each rank exchanges its slice
with the same local rank of the other node, half per tree, a thread per send and per receive (hfreduce's thread
runner, its ``Link`` calls). Two layouts of the same bytes, set up once in the same processes and alternated round
by round:

- ``both``: per tree one connection, carrying partial chunks up and final chunks down (hfreduce before 2026-11-25);
- ``one-way``: per tree one connection each way (hfreduce now).

Per round and layout, ``--exchanges`` back-to-back exchanges; the wall time (max over ranks) and the machine's busy
time (all CPUs, softirq included, from /proc/stat) per exchange. Prints the medians and the median of the per-round
ratios both / one-way.

    .venv/bin/python bench/tcp_socket_layout.py --rounds 11
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import statistics
import threading
import time
from typing import Any

import numpy as np
from _hfreduce_common import MS_PER_TICK, free_ports, machine_busy_ticks, run_ranks

LAYOUTS = ("both", "one-way")
NUM_LOCAL = 2
TIMEOUT_S = 60.0


def connect(node: int, port: int, count: int, barrier: Any) -> list[socket.socket]:
    """``count`` connections between this rank and the same local rank of the other node, in index order."""
    server = socket.create_server(("127.0.0.1", port), backlog=count) if node == 0 else None
    barrier.wait()  # every node-0 rank listens before any node-1 rank connects
    if server is None:
        socks = []
        for index in range(count):
            sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)
            sock.sendall(bytes([index]))
            socks.append(sock)
        return socks
    by_index = {}
    with server:
        server.settimeout(TIMEOUT_S)
        for _ in range(count):
            conn, _ = server.accept()
            by_index[conn.recv(1)[0]] = conn
    return [by_index[i] for i in range(count)]


def rank_main(
    node: int, local: int, port: int, nbytes: int, rounds: int, exchanges: int, barrier: Any, queue: Any
) -> None:
    from hfreduce.transport import Link, tune_tcp  # in the rank processes only

    chunk = 4 << 20
    socks = connect(node, port, 6, barrier)
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
    rank = node * NUM_LOCAL + local
    for r in range(rounds):
        order = LAYOUTS if r % 2 == 0 else LAYOUTS[::-1]
        for layout in order:
            barrier.wait()
            b0 = machine_busy_ticks()
            t0 = time.perf_counter()
            for _ in range(exchanges):
                exchange(layout)
            took = time.perf_counter() - t0
            barrier.wait()
            busy = machine_busy_ticks() - b0
            queue.put((r, layout, rank, took / exchanges, busy / exchanges))
    for sock in socks:
        sock.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=32, help="bytes each rank sends (and receives) per exchange")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--exchanges", type=int, default=4, help="back-to-back exchanges per round and layout")
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    barrier = ctx.Barrier(2 * NUM_LOCAL)
    ports = free_ports(NUM_LOCAL)
    procs = [
        ctx.Process(
            target=rank_main,
            args=(node, local, ports[local], args.mib << 20, args.rounds, args.exchanges, barrier, queue),
        )
        for node in range(2)
        for local in range(NUM_LOCAL)
    ]
    got = run_ranks(procs, queue, args.rounds * len(LAYOUTS) * 2 * NUM_LOCAL)
    wall = {(r, lay): max(g[3] for g in got if g[:2] == (r, lay)) for r in range(args.rounds) for lay in LAYOUTS}
    busy = {(r, lay): next(g[4] for g in got if g[:3] == (r, lay, 0)) * MS_PER_TICK for r, lay in wall}
    print(
        f"# 2 nodes x {NUM_LOCAL} local ranks on loopback, each rank sends and receives {args.mib} MiB per exchange "
        f"in 4 MiB chunks, a thread per send and receive; medians over {args.rounds} rounds of "
        f"{args.exchanges} exchanges"
    )
    print(f"{'layout':>8} {'wall ms':>8} {'busy ms':>8}")
    for lay in LAYOUTS:
        w = statistics.median(wall[(r, lay)] for r in range(args.rounds)) * 1e3
        b = statistics.median(busy[(r, lay)] for r in range(args.rounds))
        print(f"{lay:>8} {w:8.1f} {b:8.1f}")
    wall_ratio = statistics.median(wall[(r, "both")] / wall[(r, "one-way")] for r in range(args.rounds))
    busy_ratio = statistics.median(busy[(r, "both")] / busy[(r, "one-way")] for r in range(args.rounds))
    print(f"MEDIAN RATIO both / one-way: wall {wall_ratio:.2f}x, machine busy {busy_ratio:.2f}x")


if __name__ == "__main__":
    main()
