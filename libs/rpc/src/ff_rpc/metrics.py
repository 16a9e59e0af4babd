"""Prometheus metrics of a service: per-RPC request counts and latency, served on /metrics."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass
class RpcMetrics:
    """The RPC metrics of one server. Each server gets its own registry (tests run several per process)."""

    registry: CollectorRegistry = field(default_factory=lambda: CollectorRegistry(auto_describe=True))

    def __post_init__(self) -> None:
        self.requests = Counter(
            "ff_rpc_requests",
            "RPCs served, by final status code.",
            ["service", "method", "code"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "ff_rpc_request_duration_seconds",
            "Time to serve an RPC (streams: until the stream ends).",
            ["service", "method"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.in_flight = Gauge("ff_rpc_in_flight", "RPCs being served now.", ["service"], registry=self.registry)

        self._methods: dict[str, MethodMeters] = {}

    def observe(self, full_method: str, code: str, duration_s: float) -> None:
        """Counts one finished call of ``/pkg.Service/Method`` with its status code name and duration (seconds)."""
        self.of_method(full_method).observe(code, duration_s)

    def of_method(self, full_method: str) -> MethodMeters:
        """The metrics of one method, their labels resolved once (the server's interceptor keeps one per method)."""
        meters = self._methods.get(full_method)
        if meters is None:
            meters = self._methods[full_method] = MethodMeters(self, *_split_method(full_method))
        return meters


class MethodMeters:
    """One method's children of the server's RPC metrics: a call updates them without a label lookup."""

    def __init__(self, metrics: RpcMetrics, service: str, method: str) -> None:
        self._requests = metrics.requests
        self._service, self._method = service, method
        self._by_code: dict[str, Counter] = {}
        self.latency = metrics.latency.labels(service, method)
        self.in_flight = metrics.in_flight.labels(service)

    def observe(self, code: str, duration_s: float) -> None:
        """One finished call with its status code name and duration (seconds)."""
        counter = self._by_code.get(code)
        if counter is None:
            counter = self._by_code[code] = self._requests.labels(self._service, self._method, code)
        counter.inc()
        self.latency.observe(duration_s)


def _split_method(full_method: str) -> tuple[str, str]:
    service, _, method = full_method.lstrip("/").partition("/")
    return service, method


class MetricsHttpServer:
    """``/metrics`` over HTTP in a background thread (prometheus_client's WSGI server)."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self._httpd: WSGIServer
        self._thread: threading.Thread
        self._httpd, self._thread = start_http_server(port, addr=host, registry=registry)

    @property
    def port(self) -> int:
        """The port bound (the one asked for, or the one picked for port 0)."""
        return int(self._httpd.server_port)

    def close(self) -> None:
        """Stops serving and waits (5 s at most) for the thread to end."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
