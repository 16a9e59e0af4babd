"""Ports picked for servers: free, distinct, and never from the range outgoing connections draw from."""

from __future__ import annotations

import itertools
import socket
from pathlib import Path

import pytest

from ff_config import ports

EPHEMERAL_LOW = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def bindable(port: int) -> bool:
    """Whether ``port`` binds as :func:`ports.pick_free_ports` binds it (a connection in TIME_WAIT blocks it)."""
    with socket.socket() as sock:
        try:
            sock.bind((ports.LOOPBACK, port))
        except OSError:
            return False
    return True


def free_run(length: int) -> int:
    """The first of ``length`` consecutive ports free now, inside this process's own range.

    That range is this test worker's share (``FF_PORT_RANGE``), so another worker's servers never take the run
    between this check and the test's picks.
    """
    low, high = ports._listener_range()
    for base in range(low + (high - low) // 2, high - length, 97):
        if all(bindable(p) for p in range(base, base + length)):
            return base
    raise AssertionError(f"no run of {length} free ports in {low}-{high}")


def test_picked_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    picked = ports.pick_free_ports(20)
    assert len(set(picked)) == 20
    assert all(ports._LOWEST <= p < EPHEMERAL_LOW for p in picked)
    for port in picked:
        assert not ports.port_in_use(port)


def test_excluded_ports_are_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    base = free_run(4)
    monkeypatch.setattr(ports, "_listener_range", lambda: (base, base + 3))
    assert sorted(ports.pick_free_ports(2, exclude={base, base + 1})) == [base + 2, base + 3]


def test_a_listening_port_is_in_use_and_never_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    base = free_run(2)
    with socket.socket() as listener:
        listener.bind((ports.LOOPBACK, base))
        listener.listen()
        assert ports.port_in_use(base)
        monkeypatch.setattr(ports, "_listener_range", lambda: (base, base + 1))
        assert ports.pick_free_ports(1) == [base + 1]


def test_no_room_is_a_clear_error_and_leaks_no_sockets(monkeypatch: pytest.MonkeyPatch) -> None:
    base = free_run(2)
    open_before = len(list(Path("/proc/self/fd").iterdir()))
    with socket.socket() as listener:
        listener.bind((ports.LOOPBACK, base))
        listener.listen()
        monkeypatch.setattr(ports, "_listener_range", lambda: (base, base + 1))
        with pytest.raises(OSError, match="no 2 free TCP ports"):
            ports.pick_free_ports(2)
    assert len(list(Path("/proc/self/fd").iterdir())) == open_before


def test_picks_stay_inside_the_range_given_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    base = free_run(8)
    monkeypatch.setenv(ports.PORT_RANGE_ENV, f"{base}-{base + 7}")
    assert all(base <= p <= base + 7 for p in ports.pick_free_ports(8))
    assert base <= ports.free_port() <= base + 7


@pytest.mark.parametrize("given", ["1000", "20-10", "a-b", "0-10", "10-70000"])
def test_a_malformed_range_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, given: str) -> None:
    monkeypatch.setenv(ports.PORT_RANGE_ENV, given)
    with pytest.raises(ValueError, match="expected LOW-HIGH"):
        ports.pick_free_ports(1)


def test_shares_of_the_range_are_disjoint_and_inside_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ports.PORT_RANGE_ENV, raising=False)
    low, high = ports._listener_range()
    shares = [ports._parse_range(ports.share_of_range(i, 3)) for i in range(3)]
    assert shares[0][0] == low and shares[-1][1] <= high
    assert all(a[1] < b[0] for a, b in itertools.pairwise(shares))
    with pytest.raises(ValueError, match="index must be"):
        ports.share_of_range(3, 3)
