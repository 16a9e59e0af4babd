"""The meta service's series for telemetry.

``ff_meta_ops_total`` (counter by ``op``, the MetaService method, and ``result``: ok or error), read from the server's
own RPC counters, so the collector's rate() gives each instance's operation rates.
"""

from __future__ import annotations

from collections import defaultdict

from ff_rpc.metrics import RpcMetrics
from ff_telemetry_client import Kind, SampleBuffer
from fireflyer.meta.v1 import meta_pb2

SERVICE = meta_pb2.DESCRIPTOR.services_by_name["MetaService"].full_name


class MetaReporter:
    """Pushes ``ff_meta_ops_total`` from the server's RPC counters."""

    def __init__(self, metrics: RpcMetrics) -> None:
        self.metrics = metrics

    async def collect(self, buffer: SampleBuffer) -> None:
        """The reporter's hook: add the counts to ``buffer``."""
        self.collect_now(buffer)

    def collect_now(self, buffer: SampleBuffer) -> None:
        """Add the counts to ``buffer``."""
        for (op, result), count in sorted(op_counts(self.metrics).items()):
            buffer.add("ff_meta_ops_total", count, {"op": op, "result": result}, kind=Kind.COUNTER)


def op_counts(metrics: RpcMetrics) -> dict[tuple[str, str], float]:
    """MetaService calls served since start, by method and ok/error."""
    counts: dict[tuple[str, str], float] = defaultdict(float)
    for family in metrics.requests.collect():
        for sample in family.samples:
            labels = sample.labels
            if sample.name.endswith("_total") and labels.get("service") == SERVICE:
                result = "ok" if labels.get("code") == "OK" else "error"
                counts[(labels["method"], result)] += sample.value
    return dict(counts)
