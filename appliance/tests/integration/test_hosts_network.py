"""The hosts network of ``fireflyer up --hosts`` made with real namespaces and veth links (root only)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from ff_appliance import hosts

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None,
    reason="needs root and iproute2 (network namespaces, veth, a bridge)",
)


@pytest.fixture
def network() -> Iterator[hosts.NetworkPlan]:
    plan = hosts.new_network(2, hosts.taken_networks())
    try:
        yield plan
    finally:
        hosts.remove_network(plan.prefix)


def _reaches_the_bridge(plan: hosts.NetworkPlan, host: str) -> bool:
    """A TCP connection from ``host``'s namespace to a listener on the bridge's address (in this namespace)."""
    with socket.create_server((plan.bridge_address, 0)) as server:
        port = server.getsockname()[1]
        code = f"import socket; socket.create_connection(({plan.bridge_address!r}, {port}), timeout=5).close()"
        argv = [*hosts.exec_prefix(plan, host), sys.executable, "-c", code]
        return subprocess.run(argv, capture_output=True, timeout=30, check=False).returncode == 0


def test_a_half_made_host_is_repaired_by_the_next_up(network: hosts.NetworkPlan) -> None:
    # As if an earlier `up` stopped after making h1's namespace and veth pair, before moving its end in.
    h1 = network.hosts[0]
    subprocess.run(["ip", "netns", "add", network.netns(h1.name)], check=True)
    veth = ["ip", "link", "add", network.bridge_link(h1.name), "type", "veth"]
    subprocess.run([*veth, "peer", "name", network.host_link(h1.name)], check=True)

    done = hosts.ensure_network(network)

    assert f"host {h1.name}: namespace {network.netns(h1.name)}, {h1.address}" in done, done
    assert not (hosts._SYS_NET / network.host_link(h1.name)).exists()  # its end is in the namespace now
    assert _reaches_the_bridge(network, h1.name) and _reaches_the_bridge(network, network.hosts[1].name)
    assert hosts.ensure_network(network) == []  # made: nothing more to do
