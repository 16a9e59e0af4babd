"""Two nodes in separate network namespaces joined by a veth pair: the bytes cross a real interface."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from .conftest import Launch

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2 to create network namespaces"
)


def sh(*args: str) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def two_namespaces() -> Iterator[tuple[list[str], list[str], list[str]]]:
    tag = f"hfr{os.getpid() % 100000}"
    names, veths, addrs = [f"{tag}a", f"{tag}b"], [f"{tag}va", f"{tag}vb"], ["10.231.7.1", "10.231.7.2"]
    try:
        for ns in names:
            sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", veths[0], "type", "veth", "peer", "name", veths[1])
        for ns, veth, addr in zip(names, veths, addrs, strict=True):
            sh("ip", "link", "set", veth, "netns", ns)
            sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", veth)
            sh("ip", "-n", ns, "link", "set", veth, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        yield names, veths, addrs
    finally:
        for ns in names:
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)


def tx_bytes(ns: str, veth: str) -> int:
    return int(sh("ip", "netns", "exec", ns, "cat", f"/sys/class/net/{veth}/statistics/tx_bytes"))


def test_two_nodes_in_namespaces_reduce_correctly_over_veth(
    launch: Launch, two_namespaces: tuple[list[str], list[str], list[str]]
) -> None:
    names, veths, addrs = two_namespaces
    before = [tx_bytes(ns, v) for ns, v in zip(names, veths, strict=True)]
    n_large = 1_000_003
    results = launch(
        2,
        2,
        "correctness",
        master=addrs[0],
        node_prefix=lambda node: ["ip", "netns", "exec", names[node]],
        env={
            "TEST_SIZES": f"1,1027,{n_large}",
            "TEST_DTYPES": "float32",
            "FF_HFREDUCE_CHUNK_SIZE_BYTES": str(1 << 18),
            "FF_HFREDUCE_SHM_SLOT_BYTES": str(8 << 20),
        },
    )
    for res in results:
        assert "cases" in res, res
        assert all(c["ok"] and c.get("counters_ok", True) for c in res["cases"]), res["rank"]
    crossed = sum(tx_bytes(ns, v) for ns, v in zip(names, veths, strict=True)) - sum(before)
    # each fp32 allreduce of the large buffer moves the whole buffer each way between the two nodes
    assert crossed >= 4 * 2 * n_large * 4
    hosts = {s["rank"]: s for s in results[0]["status"]}
    assert len(hosts) == 4
