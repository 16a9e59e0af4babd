"""The node's devices: the GPUs torch sees, else the configured number of CPU device slots.

Torch is only asked when an NVIDIA driver is present, so CPU nodes do not pay for importing it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

logger = logging.getLogger(__name__)

CPU_SLOT = "cpu-slot"


@dataclass(frozen=True)
class DeviceInfo:
    """One device a rank can be given: a GPU (``index`` as torch numbers it) or a CPU slot."""

    index: int
    gpu: bool
    name: str
    memory_bytes: int = 0


def detect(detect_gpus: bool, num_slots: int) -> list[DeviceInfo]:
    """The node's GPUs when ``detect_gpus`` and torch sees any, else ``num_slots`` CPU slots; never raises."""
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
    """The node's physical memory in bytes."""
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def num_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, not the host's count)."""
    return len(os.sched_getaffinity(0))
