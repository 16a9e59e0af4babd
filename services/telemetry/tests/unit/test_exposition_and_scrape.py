"""The Prometheus text the collector writes (/federate) and reads (scraping), without sockets."""

from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families

from ff_telemetry.core.exposition import ExposedSample, render
from ff_telemetry.core.model import MetricMeta, MetricType
from ff_telemetry.scrape import Target, parse

META = {
    "lat_seconds": MetricMeta("lat_seconds", MetricType.HISTOGRAM, "latency\nin seconds"),
    "req_total": MetricMeta("req_total", MetricType.COUNTER, "requests"),
}


def test_families_are_grouped_escaped_and_read_back_by_prometheus_own_parser() -> None:
    samples = [
        ExposedSample("lat_seconds_bucket", (("le", "0.5"),), 3.0, 10.0),
        ExposedSample("lat_seconds_bucket", (("le", "+Inf"),), 4.0, 10.0),
        ExposedSample("lat_seconds_count", (), 4.0, 10.0),
        ExposedSample("lat_seconds_sum", (), 1.5, 10.0),
        ExposedSample("req_total", (("path", 'a"b\\c\nd'),), 7.0, 10.5),
        ExposedSample("loss", (("user", "alice"),), math.nan, 11.0),
    ]
    text = render(samples, META)
    assert text.count("# TYPE lat_seconds histogram") == 1 and "# HELP lat_seconds latency\\nin seconds" in text
    assert "# TYPE loss gauge" in text and 'loss{user="alice"} NaN 11000' in text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["lat_seconds"].type == "histogram" and len(families["lat_seconds"].samples) == 4
    (req,) = families["req"].samples
    assert req.labels == {"path": 'a"b\\c\nd'} and req.value == 7.0 and req.timestamp == 10.5
    assert render([], META) == ""


def test_a_scrape_becomes_the_clusters_samples_with_target_labels() -> None:
    text = (
        "# HELP ff_rpc_requests_total RPCs served.\n# TYPE ff_rpc_requests_total counter\n"
        'ff_rpc_requests_total{method="Get",job="x"} 3.0\n'
        "ff_rpc_requests_created 1.7e9\n"
        "# TYPE d_seconds histogram\n"
        'd_seconds_bucket{le="0.1"} 1.0\nd_seconds_bucket{le="+Inf"} 2.0\nd_seconds_sum 0.3\nd_seconds_count 2.0\n'
        "# TYPE up gauge\nup 1.0 1234000\n"
    )
    samples, metadata = parse(text, Target("meta", 5, "127.0.0.1:9000"), now=2000.0)
    by_name = {s.name: s for s in samples}
    assert set(by_name) == {"ff_rpc_requests_total", "d_seconds_bucket", "d_seconds_sum", "d_seconds_count", "up"}
    assert by_name["ff_rpc_requests_total"].labels == {
        "method": "Get",
        "exported_job": "x",
        "job": "meta",
        "instance": "127.0.0.1:9000",
        "node_id": "5",
    }
    assert by_name["up"].sampled_at == 1234.0 and by_name["d_seconds_sum"].sampled_at == 2000.0
    types = {m.name: m.type for m in metadata}
    assert types == {
        "ff_rpc_requests_total": MetricType.COUNTER,
        "d_seconds": MetricType.HISTOGRAM,
        "up": MetricType.GAUGE,
    }
