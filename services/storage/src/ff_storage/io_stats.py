"""Bytes and latencies of reads and writes per target, counted on the I/O paths and read by the reporter.

Reads count the chunk bytes served by BatchRead (each IO timed in the read thread); writes count the bytes
a head target accepted, timed from lock to commit of the whole chain update (what a writer waits for).
Latencies are kept for the percentiles of the current reporting interval only (a bounded reservoir per
target and operation: the most recent ``max_samples``).
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field

READ = "read"
WRITE = "write"


@dataclass
class _Op:
    bytes_total: int = 0
    latencies_s: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=4096))


class TargetIoStats:
    """Thread-safe: reads are counted on worker threads, writes on the event loop."""

    def __init__(self) -> None:
        self._ops: dict[tuple[str, int], _Op] = collections.defaultdict(_Op)
        self._lock = threading.Lock()

    def record(self, op: str, target_id: int, num_bytes: int, seconds: float) -> None:
        """Count one ``op`` (read or write) of ``num_bytes`` on a target that took ``seconds``."""
        with self._lock:
            entry = self._ops[(op, target_id)]
            entry.bytes_total += num_bytes
            entry.latencies_s.append(seconds)

    def take(self) -> dict[tuple[str, int], tuple[int, list[float]]]:
        """Per (op, target): bytes since start, and the latencies since the last take (then forgotten)."""
        with self._lock:
            out = {key: (op.bytes_total, list(op.latencies_s)) for key, op in self._ops.items()}
            for op in self._ops.values():
                op.latencies_s.clear()
        return out


def quantile(sorted_values: list[float], q: float) -> float:
    """The nearest-rank quantile of sorted values (no interpolation)."""
    index = min(len(sorted_values) - 1, max(0, int(q * len(sorted_values) + 0.5) - 1))
    return sorted_values[index]
