"""The storage node's series for telemetry, per target (labels ``target_id``, ``chain_id``).

``ff_storage_target_read_bytes_total`` / ``ff_storage_target_written_bytes_total`` (counters),
``ff_storage_target_read_latency_seconds`` / ``ff_storage_target_write_latency_seconds`` (gauges by
``quantile`` 0.5, 0.9, 0.99 over the last interval), ``ff_storage_target_capacity_bytes`` and
``ff_storage_target_free_bytes`` (its disk's file system), ``ff_storage_target_stored_bytes`` and
``ff_storage_target_chunks``.
"""

from __future__ import annotations

import asyncio

from ff_storage.io_stats import READ, WRITE, quantile
from ff_storage.node import StorageNode
from ff_storage.store.disk_space import disk_space
from ff_telemetry_client import Kind, SampleBuffer

QUANTILES = (0.5, 0.9, 0.99)
_BYTES = {READ: "ff_storage_target_read_bytes_total", WRITE: "ff_storage_target_written_bytes_total"}
_LATENCY = {READ: "ff_storage_target_read_latency_seconds", WRITE: "ff_storage_target_write_latency_seconds"}


class StorageReporter:
    """Collects the per-target series for the telemetry reporter (see the module doc)."""

    def __init__(self, node: StorageNode) -> None:
        self.node = node

    async def collect(self, buffer: SampleBuffer) -> None:
        """Add one sample of every series to ``buffer``; the blocking reads run in a thread."""
        await asyncio.to_thread(self.collect_now, buffer)

    def collect_now(self, buffer: SampleBuffer) -> None:
        """Add one sample of every series to ``buffer`` (blocking: file system and engine reads).

        The latency quantiles cover what happened since the last call.
        """
        chains = {t.target_id: str(t.record.chain_id) for t in list(self.node.state.targets.values())}
        for target in list(self.node.state.targets.values()):
            labels = {"target_id": str(target.target_id), "chain_id": chains[target.target_id]}
            space = disk_space(target.record.path)
            chunks, stored = target.engine.usage()
            buffer.add("ff_storage_target_capacity_bytes", space.capacity_bytes, labels)
            buffer.add("ff_storage_target_free_bytes", space.free_bytes, labels)
            buffer.add("ff_storage_target_stored_bytes", stored, labels)
            buffer.add("ff_storage_target_chunks", chunks, labels)
        for (op, target_id), (total, latencies) in self.node.state.io_stats.take().items():
            labels = {"target_id": str(target_id), "chain_id": chains.get(target_id, "")}
            buffer.add(_BYTES[op], total, labels, kind=Kind.COUNTER)
            latencies.sort()
            for q in QUANTILES if latencies else ():
                buffer.add(_LATENCY[op], quantile(latencies, q), {**labels, "quantile": str(q)})
