"""What the hfreduce benchmarks share: a rank's GroupConfig on a loopback layout, free ports, running the rank
processes, and the machine's busy clock."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ff_config.ports import pick_free_ports
from ff_testing import free_port

if TYPE_CHECKING:
    from hfreduce import GroupConfig

__all__ = [
    "MS_PER_TICK",
    "WireFloor",
    "connect_to_peer",
    "free_port",
    "free_ports",
    "loopback_config",
    "machine_busy_ticks",
    "run_ranks",
]

MS_PER_TICK = 1e3 / os.sysconf("SC_CLK_TCK")  # milliseconds per clock tick of /proc/stat


def free_ports(count: int) -> tuple[int, ...]:
    """``count`` distinct ports free a moment ago, below the ephemeral range (see ``ff_testing.free_port``)."""
    return tuple(pick_free_ports(count))


def loopback_config(node: int, local: int, nodes: int, num_local: int, port: int, **options: Any) -> GroupConfig:
    """The GroupConfig of local rank ``local`` on node ``node`` of a ``nodes`` x ``num_local`` layout whose
    nodes all live on this machine (master on 127.0.0.1:``port``); ``options`` set the other fields."""
    from hfreduce import GroupConfig  # in the rank processes only

    return GroupConfig(
        master_addr="127.0.0.1",
        master_port=port,
        node_rank=node,
        num_nodes=nodes,
        local_rank=local,
        local_world_size=num_local,
        **options,
    )


def machine_busy_ticks() -> int:
    """Clock ticks all CPUs spent on anything but idle and iowait (user, nice, system, irq, softirq, steal)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return sum(ticks[:8]) - ticks[3] - ticks[4]


def run_ranks(procs: list[Any], queue: Any, expect: int, timeout_s: float = 600) -> list[Any]:
    """Start the rank processes, collect ``expect`` reports from ``queue`` and join them; whatever happens, none is
    left running."""
    try:
        for p in procs:
            p.start()
        got = [queue.get(timeout=timeout_s) for _ in range(expect)]
        for p in procs:
            p.join()
        return got
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()


def connect_to_peer(
    node: int, port: int, count: int, barrier: Callable[[], object], timeout_s: float = 60.0
) -> list[socket.socket]:
    """``count`` loopback connections between this rank and the same local rank of the other node (of 2), in
    index order: node 0 listens on ``port``, ``barrier`` (every rank of both nodes calls it) makes sure it does
    before node 1 connects and says each connection's index."""
    server = socket.create_server(("127.0.0.1", port), backlog=count) if node == 0 else None
    barrier()
    if server is None:
        socks = []
        for index in range(count):
            sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
            sock.sendall(bytes([index]))
            socks.append(sock)
        return socks
    by_index = {}
    with server:
        server.settimeout(timeout_s)
        for _ in range(count):
            conn, _ = server.accept()
            by_index[conn.recv(1)[0]] = conn
    return [by_index[i] for i in range(count)]


class WireFloor:
    """At 2 nodes, the bytes hfreduce's trees move for one rank and nothing else: the rank exchanges its slice
    (1/num_local of the buffer) with the same local rank of the other node over loopback TCP, laid out as the
    library's tree links (per tree half, one connection each way), in the library's chunks, on the runner
    hfreduce picks for the layout (a thread per task, or one event loop). No reduction, no copies between local
    ranks: what hfreduce's transport costs before any of its own work."""

    def __init__(self, node: int, port: int, config: Any, dist: Any) -> None:
        from hfreduce.runners import choose  # in the rank processes only
        from hfreduce.transport import Link, tune_tcp

        socks = connect_to_peer(node, port, 4, dist.barrier)  # 2 * tree + d carries tree's data from node d
        for sock in socks:  # set up as hfreduce sets up its tree links
            tune_tcp(sock, config.socket_buffer_bytes)
        links = [Link(sock, -1, config.timeout_s) for sock in socks]
        self.links = links
        self.out_links = [links[2 * tree + node] for tree in (0, 1)]
        self.in_links = [links[2 * tree + 1 - node] for tree in (0, 1)]
        self.chunk = config.chunk_size_bytes
        self.runner = choose(config.pipeline, config.local_world_size, config.timeout_s, self._abort)

    def exchange(self, out: Any, into: Any) -> None:
        """Send ``out`` and receive as many bytes into ``into``, half per tree."""
        src, dst = memoryview(out).cast("B"), memoryview(into).cast("B")
        mid = len(src) // 2
        spans = ((0, mid), (mid, len(src)))

        def send(tree: int) -> Any:
            a, b = spans[tree]
            for c in range(a, b, self.chunk):
                yield from self.runner.send(self.out_links[tree], src[c : min(c + self.chunk, b)])

        def recv(tree: int) -> Any:
            a, b = spans[tree]
            for c in range(a, b, self.chunk):
                yield from self.runner.recv(self.in_links[tree], dst[c : min(c + self.chunk, b)])

        self.runner.run([fn(tree) for tree in (0, 1) for fn in (send, recv)])

    def _abort(self) -> None:
        for link in self.links:
            link.abort()

    def close(self) -> None:
        self.runner.close()
        for link in self.links:
            link.close()
