"""Meta's operation counts for telemetry, from the server's RPC counters."""

from __future__ import annotations

from ff_meta.reporter import SERVICE, MetaReporter, op_counts
from ff_rpc.metrics import RpcMetrics
from ff_telemetry_client import Kind, SampleBuffer


def test_ops_by_method_and_result_from_the_rpc_counters() -> None:
    metrics = RpcMetrics()
    for code in ("OK", "OK", "NOT_FOUND"):
        metrics.observe(f"/{SERVICE}/Stat", code, 0.001)
    metrics.observe(f"/{SERVICE}/Create", "OK", 0.002)
    metrics.observe("/grpc.health.v1.Health/Check", "OK", 0.001)  # not a meta op
    assert op_counts(metrics) == {("Stat", "ok"): 2.0, ("Stat", "error"): 1.0, ("Create", "ok"): 1.0}
    buffer = SampleBuffer()
    MetaReporter(metrics).collect_now(buffer)
    points = buffer.take(10)
    assert {(p.labels["op"], p.labels["result"], p.value) for p in points} == {
        ("Stat", "ok", 2.0),
        ("Stat", "error", 1.0),
        ("Create", "ok", 1.0),
    }
    assert {p.name for p in points} == {"ff_meta_ops_total"} and all(p.kind is Kind.COUNTER for p in points)
