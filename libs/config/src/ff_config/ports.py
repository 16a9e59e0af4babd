"""Choosing the TCP ports written into services' configuration (and tests'), before the services start.

A port picked by binding port 0 comes from the kernel's ephemeral range, the same range outgoing
connections draw their local ports from: between the pick and the server's bind, any client on the host
may take it (a service failing at start with EADDRINUSE). Ports are therefore picked below that range,
where only listeners live.

Processes that pick ports side by side without talking to each other (the workers of one test run, each starting
its own clusters) may still pick the same free port and race to bind it. Give each one a range of its own in
``FF_PORT_RANGE`` (``LOW-HIGH``; see :func:`share_of_range`): every pick in that process, and in the processes it
starts, stays inside it.
"""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Collection
from pathlib import Path

LOOPBACK = "127.0.0.1"
PORT_RANGE_ENV = "FF_PORT_RANGE"
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10000  # below: well-known and registered services' usual ports
_ATTEMPTS = 2000


def pick_free_ports(count: int, exclude: Collection[int] = (), host: str = LOOPBACK) -> list[int]:
    """``count`` distinct ports free on ``host`` right now, none in ``exclude``, outside the ephemeral range.

    The sockets stay bound until all ports are chosen, so one call never returns a port twice. Falls back to
    kernel-chosen ports when the ephemeral range leaves no room below it.

    Raises:
        OSError: no free port was found.
    """
    low, high = _listener_range()
    held: list[socket.socket] = []  # the chosen ports' sockets, bound until all are chosen
    try:
        for _ in range(_ATTEMPTS if high > low else count * 50):
            if len(held) == count:
                break
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind((host, random.randint(low, high) if high > low else 0))
            except OSError:
                sock.close()
                continue
            if sock.getsockname()[1] in exclude:
                sock.close()
                continue
            held.append(sock)
        ports: list[int] = [s.getsockname()[1] for s in held]
    finally:
        for sock in held:
            sock.close()
    if len(ports) == count:
        return ports
    raise OSError(f"no {count} free TCP ports on {host} (tried ports {low}-{high})")


def free_port(host: str = LOOPBACK) -> int:
    """One TCP port on ``host`` that was free a moment ago, outside the ephemeral range."""
    return pick_free_ports(1, host=host)[0]


def port_in_use(port: int, host: str = LOOPBACK) -> bool:
    """Whether something listens on ``host:port`` (connections lingering in TIME_WAIT do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def share_of_range(index: int, count: int) -> str:
    """The ``index``-th of ``count`` equal, disjoint slices of the listener range, as ``FF_PORT_RANGE`` takes it.

    Raises:
        ValueError: ``index`` is not in ``range(count)``, or the range is too small to share.
    """
    if not 0 <= index < count:
        raise ValueError(f"share {index} of {count}: the index must be in 0..{count - 1}")
    low, high = _listener_range()
    size = (high - low + 1) // count
    if size < 100:
        raise ValueError(f"ports {low}-{high} are too few to share among {count}")
    return f"{low + index * size}-{low + (index + 1) * size - 1}"


def _listener_range() -> tuple[int, int]:
    """``FF_PORT_RANGE`` when set, else the ports below the ephemeral range, or (0, 0) when there are none to speak of.

    Raises:
        ValueError: ``FF_PORT_RANGE`` is not ``LOW-HIGH`` with 1 <= LOW <= HIGH <= 65535.
    """
    given = os.environ.get(PORT_RANGE_ENV, "").strip()
    if given:
        return _parse_range(given)
    try:
        ephemeral_low = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    high = ephemeral_low - 1
    return (_LOWEST, high) if high - _LOWEST >= 1000 else (0, 0)


def _parse_range(text: str) -> tuple[int, int]:
    low_text, _, high_text = text.partition("-")
    try:
        low, high = int(low_text), int(high_text)
    except ValueError:
        low = high = 0
    if not 1 <= low <= high <= 65535:
        raise ValueError(f"{PORT_RANGE_ENV}={text!r}: expected LOW-HIGH, two ports with LOW <= HIGH")
    return low, high
