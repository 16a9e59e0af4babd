"""The node's series: /proc parsed as the kernel writes it, and no GPU reported as such, not as an error."""

from __future__ import annotations

from pathlib import Path

import pytest

from ff_agent.node_metrics import (
    CpuTimes,
    Gpus,
    NodeMetrics,
    cpu_utilization,
    parse_cpu,
    parse_diskstats,
    parse_meminfo,
    parse_net_dev,
)
from ff_telemetry_client import Kind, SampleBuffer

STAT = "cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 50 0 25 400 25 0 0 0 0 0\n"
MEMINFO = "MemTotal:       16000 kB\nMemFree:         1000 kB\nMemAvailable:    8000 kB\nHugePages_Total:       0\n"
DISKSTATS = (
    "   8       0 sda 10 0 100 5 20 0 200 9 0 0 0 0 0 0 0 0 0\n"
    "   8       1 sda1 10 0 100 5 20 0 200 9 0 0 0 0 0 0 0 0 0\n"
    " 259       0 nvme0n1 1 0 8 1 2 0 16 1 0 0 0 0 0 0 0 0 0\n"
    "   7       0 loop0 1 0 999 0 0 0 999 0 0 0 0 0 0 0 0 0 0\n"
)
NET_DEV = (
    "Inter-|   Receive  |  Transmit\n face |bytes packets|bytes packets\n"
    "    lo: 999 1 0 0 0 0 0 0 999 1 0 0 0 0 0 0\n"
    "  eth0: 1000 10 0 0 0 0 0 0 2000 20 0 0 0 0 0 0\n"
)


def test_cpu_busy_share_between_two_reads() -> None:
    before = parse_cpu(STAT)
    assert before == CpuTimes(busy=150, total=1000)
    after = CpuTimes(busy=before.busy + 30, total=before.total + 100)
    assert cpu_utilization(before, after) == pytest.approx(0.3)
    assert cpu_utilization(before, before) == 0.0


def test_meminfo_in_bytes() -> None:
    mem = parse_meminfo(MEMINFO)
    assert mem["MemTotal"] == 16000 * 1024 and mem["MemAvailable"] == 8000 * 1024
    assert mem["HugePages_Total"] == 0


def test_disk_bytes_count_whole_disks_once() -> None:
    assert parse_diskstats(DISKSTATS) == ((100 + 8) * 512, (200 + 16) * 512)


def test_network_bytes_by_interface_without_loopback() -> None:
    assert parse_net_dev(NET_DEV) == {"eth0": (1000, 2000)}


def test_without_nvml_the_node_reports_no_gpu_not_an_error(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    gpus = Gpus()
    assert gpus.status.startswith("no GPU")
    proc = tmp_path / "proc"
    (proc / "net").mkdir(parents=True)
    (proc / "stat").write_text(STAT)
    (proc / "meminfo").write_text(MEMINFO)
    (proc / "diskstats").write_text(DISKSTATS)
    (proc / "net" / "dev").write_text(NET_DEV)
    buffer = SampleBuffer()
    metrics = NodeMetrics(tmp_path, proc=proc, gpus=gpus)
    metrics.collect_now(buffer, {"node": "n1"})
    points = {(p.name, p.labels.get("device", "")): p for p in buffer.take(100)}
    assert points[("ff_node_gpus", "")].value == 0
    assert not [n for n, _ in points if n.startswith("ff_node_gpu_")]
    assert points[("ff_node_memory_available_bytes", "")].value == 8000 * 1024
    assert points[("ff_node_network_transmit_bytes_total", "eth0")].kind is Kind.COUNTER
    assert points[("ff_node_disk_total_bytes", "")].value > 0
    assert ("ff_node_cpu_utilization", "") not in points  # needs two reads
    assert all(p.labels["node"] == "n1" for p in points.values())
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "WARNING")]
