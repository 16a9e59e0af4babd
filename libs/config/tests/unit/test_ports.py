"""Ports picked for servers: free, distinct, and never from the range outgoing connections draw from."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from ff_config import ports


def test_picked_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    picked = ports.pick_free_ports(20)
    assert len(set(picked)) == 20
    assert all(ports._LOWEST <= p < ephemeral_low for p in picked)
    for port in picked:
        assert not ports.port_in_use(port)


def test_excluded_ports_are_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "_listener_range", lambda: (40000, 40003))
    assert sorted(ports.pick_free_ports(2, exclude={40000, 40001})) == [40002, 40003]


def test_a_listening_port_is_in_use_and_never_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as listener:
        listener.bind((ports.LOOPBACK, ports.free_port()))
        listener.listen()
        taken = listener.getsockname()[1]
        assert ports.port_in_use(taken)
        monkeypatch.setattr(ports, "_listener_range", lambda: (taken, taken + 1))
        assert ports.pick_free_ports(1) == [taken + 1]


def test_no_room_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as listener:
        listener.bind((ports.LOOPBACK, ports.free_port()))
        listener.listen()
        taken = listener.getsockname()[1]
        monkeypatch.setattr(ports, "_listener_range", lambda: (taken, taken + 1))
        with pytest.raises(OSError, match="no 2 free TCP ports"):
            ports.pick_free_ports(2)
