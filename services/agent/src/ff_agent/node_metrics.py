"""The node's own series for telemetry: CPU, memory, disk and network from /proc, GPUs through NVML.

Names (all gauges unless ``_total``, which are counters since boot): ``ff_node_cpu_utilization`` (0..1 over
the last interval), ``ff_node_cpus``, ``ff_node_memory_total_bytes``, ``ff_node_memory_available_bytes``,
``ff_node_disk_total_bytes`` / ``ff_node_disk_free_bytes`` (the state folder's file system),
``ff_node_disk_read_bytes_total`` / ``ff_node_disk_written_bytes_total`` (whole disks),
``ff_node_network_receive_bytes_total`` / ``ff_node_network_transmit_bytes_total`` (by ``device``, not lo),
``ff_node_gpus`` (0 without NVML or GPU), and per ``gpu``: ``ff_node_gpu_utilization`` (0..1),
``ff_node_gpu_memory_used_bytes``, ``ff_node_gpu_memory_total_bytes``, ``ff_node_gpu_xid_errors_total``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ff_telemetry_client import Kind, SampleBuffer

logger = logging.getLogger(__name__)

SECTOR_BYTES = 512
# Whole disks, not their partitions (sda, vda, xvda, nvme0n1, mmcblk0), so bytes are not counted twice.
_WHOLE_DISK = re.compile(r"(?:[shv]d[a-z]+|xvd[a-z]+|nvme\d+n\d+|mmcblk\d+)")


@dataclass(frozen=True)
class CpuTimes:
    """The aggregate CPU time since boot, busy and in all, in /proc/stat's clock ticks."""

    busy: int
    total: int


def parse_cpu(stat_text: str) -> CpuTimes:
    """The aggregate ``cpu`` line of /proc/stat (idle and iowait are not busy)."""
    fields = [int(v) for v in stat_text.splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    total = sum(fields[:8])  # guest time is already inside user and nice
    return CpuTimes(busy=total - idle, total=total)


def cpu_utilization(before: CpuTimes, after: CpuTimes) -> float:
    """The busy share (0..1) of the CPU time between two samples; 0 when no time passed."""
    elapsed = after.total - before.total
    return (after.busy - before.busy) / elapsed if elapsed > 0 else 0.0


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo in bytes, by field name."""
    out = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            out[name] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return out


def parse_diskstats(text: str) -> tuple[int, int]:
    """Bytes read and written by whole disks since boot (/proc/diskstats)."""
    read = written = 0
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 10 and _WHOLE_DISK.fullmatch(parts[2]):
            read += int(parts[5]) * SECTOR_BYTES
            written += int(parts[9]) * SECTOR_BYTES
    return read, written


def parse_net_dev(text: str) -> dict[str, tuple[int, int]]:
    """(received, transmitted) bytes by interface since boot, loopback left out (/proc/net/dev)."""
    out = {}
    for line in text.splitlines()[2:]:
        name, _, rest = line.partition(":")
        parts = rest.split()
        if name.strip() != "lo" and len(parts) >= 9:
            out[name.strip()] = (int(parts[0]), int(parts[8]))
    return out


class Gpus:
    """NVML, when pynvml is installed and a driver answers; else ``status`` says why there is no GPU."""

    def __init__(self) -> None:
        self.nvml: Any = None
        self.handles: list[Any] = []
        self.xid_errors: dict[int, int] = {}
        self._events: Any = None
        self.status = self._init()
        logger.info("GPU metrics: %s", self.status)

    def _init(self) -> str:
        try:
            import pynvml  # type: ignore[import-not-found,unused-ignore]
        except ImportError:
            return "no GPU (pynvml is not installed)"
        try:
            pynvml.nvmlInit()
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except pynvml.NVMLError as err:
            return f"no GPU (NVML: {err})"
        self.nvml = pynvml
        self.xid_errors = dict.fromkeys(range(len(self.handles)), 0)
        self._watch_xid()
        return f"{len(self.handles)} GPUs through NVML" if self.handles else "no GPU (NVML sees none)"

    def _watch_xid(self) -> None:
        try:
            self._events = self.nvml.nvmlEventSetCreate()
            for handle in self.handles:
                self.nvml.nvmlDeviceRegisterEvents(handle, self.nvml.nvmlEventTypeXidCriticalError, self._events)
        except self.nvml.NVMLError as err:
            logger.warning("GPU Xid errors are not counted: %s", err)
            self._events = None

    def collect(self, buffer: SampleBuffer, labels: Mapping[str, str]) -> None:
        """Add the GPU count and, per GPU, utilization, memory and Xid errors to ``buffer`` (blocking NVML calls)."""
        buffer.add("ff_node_gpus", len(self.handles), labels)
        if self.nvml is None:
            return
        self._drain_xid()
        for index, handle in enumerate(self.handles):
            gpu = {**labels, "gpu": str(index)}
            util = self.nvml.nvmlDeviceGetUtilizationRates(handle)
            memory = self.nvml.nvmlDeviceGetMemoryInfo(handle)
            buffer.add("ff_node_gpu_utilization", util.gpu / 100.0, gpu)
            buffer.add("ff_node_gpu_memory_used_bytes", memory.used, gpu)
            buffer.add("ff_node_gpu_memory_total_bytes", memory.total, gpu)
            buffer.add("ff_node_gpu_xid_errors_total", self.xid_errors[index], gpu, kind=Kind.COUNTER)

    def _drain_xid(self) -> None:
        while self._events is not None:
            try:
                event = self.nvml.nvmlEventSetWait(self._events, 0)
            except self.nvml.NVMLError:
                return  # timeout: nothing pending
            for index, handle in enumerate(self.handles):
                if event.device == handle:
                    self.xid_errors[index] += 1
                    logger.warning("GPU %d: Xid error %s", index, event.eventData)


class NodeMetrics:
    """Reads the node's counters each interval (``collect`` is the PeriodicReporter's collect)."""

    def __init__(self, disk_path: Path, proc: Path = Path("/proc"), gpus: Gpus | None = None) -> None:
        self.disk_path = disk_path
        self.proc = proc
        self.gpus = gpus or Gpus()
        self._cpu: CpuTimes | None = None

    async def collect(self, buffer: SampleBuffer) -> None:
        """Add one sample of every node series to ``buffer``; the blocking reads run in a thread."""
        await asyncio.to_thread(self.collect_now, buffer, {})

    def collect_now(self, buffer: SampleBuffer, labels: Mapping[str, str]) -> None:
        """Read /proc, the state folder's file system and the GPUs, adding samples labelled ``labels`` (blocking).

        The CPU utilization needs two reads: the first call adds none.
        """
        cpu = parse_cpu((self.proc / "stat").read_text())
        if self._cpu is not None:
            buffer.add("ff_node_cpu_utilization", cpu_utilization(self._cpu, cpu), labels)
        self._cpu = cpu
        buffer.add("ff_node_cpus", os.cpu_count() or 1, labels)
        memory = parse_meminfo((self.proc / "meminfo").read_text())
        buffer.add("ff_node_memory_total_bytes", memory.get("MemTotal", 0), labels)
        buffer.add("ff_node_memory_available_bytes", memory.get("MemAvailable", 0), labels)
        fs = os.statvfs(self.disk_path)
        buffer.add("ff_node_disk_total_bytes", fs.f_blocks * fs.f_frsize, labels)
        buffer.add("ff_node_disk_free_bytes", fs.f_bavail * fs.f_frsize, labels)
        read, written = parse_diskstats((self.proc / "diskstats").read_text())
        buffer.add("ff_node_disk_read_bytes_total", read, labels, kind=Kind.COUNTER)
        buffer.add("ff_node_disk_written_bytes_total", written, labels, kind=Kind.COUNTER)
        for device, (rx, tx) in parse_net_dev((self.proc / "net" / "dev").read_text()).items():
            dev = {**labels, "device": device}
            buffer.add("ff_node_network_receive_bytes_total", rx, dev, kind=Kind.COUNTER)
            buffer.add("ff_node_network_transmit_bytes_total", tx, dev, kind=Kind.COUNTER)
        self.gpus.collect(buffer, labels)
