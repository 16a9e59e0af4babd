"""The storage node's telemetry: bytes and latencies counted per target on the write and read paths."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ff_fsprotocol.checksum import crc32c_of
from ff_storage.core.requests import ReadIO, WriteIO
from ff_storage.core.results import IoStatus
from ff_storage.io_stats import quantile
from ff_storage.node import StorageNode
from ff_storage.reporter import StorageReporter
from ff_telemetry_client import Kind, SampleBuffer


def test_quantile_is_the_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (quantile(values, 0.5), quantile(values, 0.9), quantile(values, 0.99)) == (50.0, 90.0, 99.0)
    assert quantile([3.0], 0.99) == 3.0


@pytest.fixture
async def node(whole_chain_node: Callable[[int, int, int], StorageNode]) -> StorageNode:
    """One target, the whole chain 7 (head and tail)."""
    return whole_chain_node(1, 70, 7)


def _write(index: int, data: bytes) -> WriteIO:
    return WriteIO(
        chain_id=7,
        chain_version=1,
        key=(5, index),
        offset=0,
        length=len(data),
        chunk_size=1 << 16,
        data=data,
        checksum=crc32c_of(data),
    )


async def test_written_and_read_bytes_and_latencies_per_target(node: StorageNode) -> None:
    results = await node.writer.batch_write([_write(0, b"a" * 1000), _write(1, b"b" * 3000)], owner="o")
    assert all(r.status == IoStatus.OK for r in results), results
    reads = [ReadIO(chain_id=7, chain_version=1, key=(5, 0), offset=0, length=500)]
    got, _, _ = await node.reader.batch_read(reads, bulk=False, owner="o")
    assert got[0].status == IoStatus.OK
    missing = [ReadIO(chain_id=7, chain_version=1, key=(9, 0), offset=0, length=5)]
    await node.reader.batch_read(missing, bulk=False, owner="o")  # not found: no bytes, not counted
    buffer = SampleBuffer()
    StorageReporter(node).collect_now(buffer)
    points = {(p.name, p.labels.get("quantile", "")): p for p in buffer.take(100)}
    assert points[("ff_storage_target_written_bytes_total", "")].value == 4000
    assert points[("ff_storage_target_written_bytes_total", "")].kind is Kind.COUNTER
    assert points[("ff_storage_target_read_bytes_total", "")].value == 500
    assert points[("ff_storage_target_stored_bytes", "")].value == 4000
    assert points[("ff_storage_target_chunks", "")].value == 2
    assert points[("ff_storage_target_capacity_bytes", "")].value >= points[("ff_storage_target_free_bytes", "")].value
    assert {p.labels["target_id"] for p in points.values()} == {"70"}
    assert {p.labels["chain_id"] for p in points.values()} == {"7"}
    for op in ("read", "write"):
        p50, p99 = (
            points[(f"ff_storage_target_{op}_latency_seconds", "0.5")],
            points[(f"ff_storage_target_{op}_latency_seconds", "0.99")],
        )
        assert 0 < p50.value <= p99.value < 10
    StorageReporter(node).collect_now(buffer)  # latencies are per interval; byte counters keep counting
    again = {(p.name, p.labels.get("quantile", "")) for p in buffer.take(100)}
    assert ("ff_storage_target_read_latency_seconds", "0.5") not in again
    assert ("ff_storage_target_read_bytes_total", "") in again
