"""The node's devices: the GPUs torch sees (only asked when an NVIDIA driver is present, so CPU nodes
do not pay for importing torch), else the configured number of CPU device slots."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

logger = logging.getLogger(__name__)

CPU_SLOT = "cpu-slot"


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    gpu: bool
    name: str
    memory_bytes: int = 0


def detect(detect_gpus: bool, num_slots: int) -> list[DeviceInfo]:
    if detect_gpus and os.path.exists("/proc/driver/nvidia/version"):
        try:
            import torch

            if torch.cuda.is_available():
                return [
                    DeviceInfo(
                        i,
                        True,
                        torch.cuda.get_device_name(i),
                        int(torch.cuda.get_device_properties(i).total_memory),
                    )
                    for i in range(torch.cuda.device_count())
                ]
        except Exception as exc:
            logger.warning("cannot list GPUs (%s); using %d CPU device slots", exc, num_slots)
    return [DeviceInfo(i, False, CPU_SLOT) for i in range(num_slots)]


def memory_bytes() -> int:
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def num_cpus() -> int:
    return len(os.sched_getaffinity(0))
