"""What a rank does once, as it joins its group, after the rendezvous: check the table and make its links.

It holds the check of the rendezvous table (``check_table``), the links between nodes (their channels, which peers
a rank needs, ``wanted_links``, and the connect/accept handshake that makes them, ``open_links``, with its
connection helpers), and the probe of cross-memory attach among the ranks of a node (``probe_cross_memory``).
``group.Runtime`` calls them while it sets up.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from hfreduce import cma
from hfreduce.config import GroupConfig
from hfreduce.errors import RendezvousError
from hfreduce.local import LocalComm
from hfreduce.trees import Tree

LINK_HELLO = struct.Struct("!II")  # (rank, channel): what the connecting side of a link sends first
# Link channels. Tree t's links to a neighbour: partial chunks go up on TREE_UP[t] (child to parent), final chunks
# come down on TREE_DOWN[t], so no socket carries data both ways. With a thread per task, a socket carrying data
# both ways cost 3-11 % more machine time on loopback (its sending and receiving threads contend for it); on the
# event loop it made no difference (bench/results/hfreduce_allreduce.md, session 8).
TREE_DOWN = (0, 1)
TREE_UP = (4, 5)
RING_UP, RING_DOWN = 2, 3  # ring edge from a lower to a higher rank, and back


def check_table(table: list[dict[str, Any]], config: GroupConfig) -> None:
    """Check that every rank of the rendezvous ``table`` has this rank's layout and its node's zone.

    Raises:
        RendezvousError: a rank has another layout, or disagrees with its node about its zone.
    """
    num_local = config.local_world_size
    for entry in table:
        if (entry["num_nodes"], entry["local_world_size"]) != (config.num_nodes, config.local_world_size):
            raise RendezvousError(
                f"rank {entry['rank']} has layout {entry['num_nodes']}x"
                f"{entry['local_world_size']}, this rank {config.num_nodes}x{config.local_world_size}"
            )
        node_zone = table[int(entry["node_rank"]) * num_local]["zone"]
        if entry["zone"] != node_zone:
            raise RendezvousError(f"rank {entry['rank']} disagrees with its node about its zone")


def probe_cross_memory(local: LocalComm, config: GroupConfig) -> bool:
    """Whether every local rank can read every other's memory; all local ranks agree on the answer.

    It takes the same user, ptrace rules that allow it, and the same pid namespace.
    """
    num_local = config.local_world_size
    me = os.getpid()
    token = np.frombuffer(struct.pack("!QQ", me, config.rank), dtype=np.uint8).copy()
    rows = local.barrier(1, cma.PID_ADDR.pack(me, cma.address(token)))
    ok = config.cross_memory and num_local > 1
    if ok:
        for lr, row in enumerate(rows):
            pid, addr = cma.PID_ADDR.unpack(row)
            rank = config.node_rank * num_local + lr
            ok = ok and (lr == config.local_rank or cma.probe(pid, addr, struct.pack("!QQ", pid, rank)))
    votes = local.barrier(2, b"\x01" if ok else b"\x00")  # the token stays alive until all have read
    del token
    return all(v == b"\x01" for v in votes)


def wanted_links(
    trees: tuple[Tree, Tree], ring_order: Sequence[int], node_rank: int, local_rank: int, num_local: int
) -> list[tuple[int, int]]:
    """(peer rank, channel) of every link the rank ``(node_rank, local_rank)`` needs.

    To the same local rank of each of its tree neighbours, one link per tree for partial chunks going up and one
    for final chunks coming down; and to its two neighbours on the ring (``ring_order``: global ranks in ring
    order).
    """
    rank = node_rank * num_local + local_rank
    wanted = []
    for t in (0, 1):
        node = trees[t][node_rank]
        for nb in (node.parent, *node.children):
            if nb >= 0:
                wanted += [(nb * num_local + local_rank, ch) for ch in (TREE_UP[t], TREE_DOWN[t])]
    if len(ring_order) > 1:
        wanted += ring_links(ring_order, rank)
    return wanted


def ring_links(ring_order: Sequence[int], rank: int) -> list[tuple[int, int]]:
    """(peer, channel) of ``rank``'s links to its next and its previous rank on the ring.

    The edge from the lower to the higher rank of a pair is RING_UP, the one back RING_DOWN (two links even when
    both are one rank).
    """
    pos = ring_order.index(rank)
    nxt, prv = ring_order[(pos + 1) % len(ring_order)], ring_order[(pos - 1) % len(ring_order)]
    return [(nxt, RING_UP if rank < nxt else RING_DOWN), (prv, RING_UP if prv < rank else RING_DOWN)]


def open_links(
    listener: socket.socket,
    rank: int,
    table: list[dict[str, Any]],
    wanted: Sequence[tuple[int, int]],
    timeout_s: float,
) -> dict[tuple[int, int], socket.socket]:
    """Make every link ``rank`` wants: the lower rank of a pair connects, then each rank accepts the rest.

    The kernel backlog completes the connections before they are accepted. It returns the sockets by (peer,
    channel). On failure the sockets made so far are closed.
    """
    socks: dict[tuple[int, int], socket.socket] = {}
    deadline = time.monotonic() + timeout_s
    try:
        for peer, channel in wanted:
            if rank < peer:
                entry = table[peer]
                sock = _connect_retry((str(entry["host"]), int(entry["port"])), deadline)
                socks[(peer, channel)] = sock
                sock.sendall(LINK_HELLO.pack(rank, channel))
        while len(socks) < len(wanted):
            try:
                conn, _ = listener.accept()
            except TimeoutError as exc:
                missing = sorted({p for p, c in wanted if (p, c) not in socks})
                raise RendezvousError(
                    f"ranks {missing} did not connect their links within {timeout_s:g} s",
                    missing_ranks=tuple(missing),
                ) from exc
            with _closed_on_error(conn):
                conn.settimeout(timeout_s)
                peer, channel = LINK_HELLO.unpack(_recv_all(conn, LINK_HELLO.size))
            socks[(peer, channel)] = conn
    except BaseException:
        for sock in socks.values():
            sock.close()
        raise
    return socks


@contextlib.contextmanager
def _closed_on_error(sock: socket.socket) -> Iterator[None]:
    try:
        yield
    except BaseException:
        sock.close()
        raise


def _connect_retry(address: tuple[str, int], deadline: float) -> socket.socket:
    while True:
        try:
            return socket.create_connection(address, timeout=max(0.1, deadline - time.monotonic()))
        except OSError as exc:
            if time.monotonic() > deadline:
                raise RendezvousError(f"cannot connect to {address[0]}:{address[1]}: {exc}") from exc
            time.sleep(0.05)


def _recv_all(sock: socket.socket, nbytes: int) -> bytes:
    data = b""
    while len(data) < nbytes:
        part = sock.recv(nbytes - len(data))
        if not part:
            raise ConnectionError("peer closed during link setup")
        data += part
    return data
