"""Server bootstrap: grpc.aio with the policy interceptor, health, reflection, /metrics, and a graceful stop.

On SIGTERM: health NOT_SERVING, in-flight calls drained, exit 0.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ff_rpc.auth import TokenValidator
from ff_rpc.errors import StatusTable
from ff_rpc.fastpath import FastServer
from ff_rpc.interceptor import ServicePolicyInterceptor
from ff_rpc.metrics import MetricsHttpServer, RpcMetrics

logger = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class ServiceBinding:
    """One gRPC service to add: its full name (for health and reflection) and how to add it."""

    name: str
    add: Callable[[Any, grpc.aio.Server], None]
    servicer: Any


@dataclass(kw_only=True)
class ServerOptions:
    """How an RpcServer listens and whom it lets in.

    Attributes:
        listen_address: ``host:port`` for gRPC; port 0 picks a free one (``RpcServer.port`` says which).
        metrics_address: ``host:port`` for /metrics over HTTP; None: no metrics endpoint.
        cluster_token: the token that makes a caller the cluster itself; empty: none does.
        token_validator: turns other tokens into principals; None: only the cluster token is accepted.
        status_table: the service's exceptions and the status code each is answered with.
        grace_s: how long ``stop`` lets in-flight calls finish before cancelling them.
    """

    listen_address: str
    metrics_address: str | None = None
    cluster_token: str = ""
    token_validator: TokenValidator | None = None
    status_table: StatusTable = field(default_factory=StatusTable)
    grace_s: float = 5.0
    # The largest request message taken; a larger one is RESOURCE_EXHAUSTED before it is parsed.
    max_request_bytes: int = MAX_MESSAGE_BYTES
    # ``host:port`` where the unary methods are served over the fast path too (``ff_rpc.fastpath``; port 0: a free
    # one); None: gRPC only.
    fast_address: str | None = None


class RpcServer:
    """A running grpc.aio server with the policy every service shares."""

    def __init__(self, options: ServerOptions, bindings: Sequence[ServiceBinding]) -> None:
        self._options = options
        self._bindings = list(bindings)
        self.metrics = RpcMetrics()
        self.health = health.aio.HealthServicer()
        self.stopping = asyncio.Event()
        self._server: grpc.aio.Server | None = None
        self._fast: FastServer | None = None
        self._metrics_http: MetricsHttpServer | None = None
        self.port = 0
        self.metrics_port = 0

    @property
    def address(self) -> str:
        """The listen host with the bound port: where to reach the server once started."""
        host = self._options.listen_address.rsplit(":", 1)[0]
        return f"{host}:{self.port}"

    @property
    def fast_address(self) -> str:
        """Where the fast path listens once started (``ServerOptions.fast_address``); empty when it does not."""
        if self._fast is None or self._options.fast_address is None:
            return ""
        return f"{self._options.fast_address.rsplit(':', 1)[0]}:{self._fast.port}"

    async def start(self) -> None:
        """Binds, starts serving every binding (health SERVING) and /metrics.

        Raises:
            OSError: the listen address cannot be bound.
        """
        interceptor = ServicePolicyInterceptor(
            cluster_token=self._options.cluster_token,
            validator=self._options.token_validator,
            status_table=self._options.status_table,
            metrics=self.metrics,
        )
        server = grpc.aio.server(
            interceptors=[interceptor],
            options=[
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", self._options.max_request_bytes),
                ("grpc.so_reuseport", 0),
            ],
        )
        for binding in self._bindings:
            binding.add(binding.servicer, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        names = [b.name for b in self._bindings]
        reflection.enable_server_reflection([*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
        self.port = server.add_insecure_port(self._options.listen_address)
        if self.port == 0:
            raise OSError(f"cannot listen on {self._options.listen_address}")
        await server.start()
        self._server = server
        if self._options.fast_address is not None:
            adders = [(b.add, b.servicer) for b in self._bindings]
            adders.append((health_pb2_grpc.add_HealthServicer_to_server, self.health))  # the transport's no-op
            policy = ServicePolicyInterceptor(  # the same policy, its own cache of wrapped handlers
                cluster_token=self._options.cluster_token,
                validator=self._options.token_validator,
                status_table=self._options.status_table,
                metrics=self.metrics,
            )
            fast = FastServer(adders, policy.intercept_service, self._options.max_request_bytes)
            host, port = self._options.fast_address.rsplit(":", 1)
            await fast.start(host.strip("[]"), int(port))
            self._fast = fast
        if self._options.metrics_address:
            host, port = self._options.metrics_address.rsplit(":", 1)
            self._metrics_http = MetricsHttpServer(self.metrics.registry, host, int(port))
            self.metrics_port = self._metrics_http.port
        for name in ["", *names]:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        logger.info("serving", extra={"address": self.address, "metrics_port": self.metrics_port})

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop taking calls, let in-flight calls finish within the grace, then close."""
        if self._server is None:
            return
        self.stopping.set()
        await self.health.enter_graceful_shutdown()
        grace = self._options.grace_s if grace_s is None else grace_s
        fast, self._fast = self._fast, None
        await asyncio.gather(self._server.stop(grace), *([fast.stop(grace)] if fast is not None else []))
        self._server = None
        if self._metrics_http is not None:
            self._metrics_http.close()
            self._metrics_http = None
        logger.info("stopped")

    async def wait_for_termination(self) -> None:
        """Returns once the server has stopped (at once if it is not running)."""
        if self._server is not None:
            await self._server.wait_for_termination()


def install_stop_signals(stop: asyncio.Event) -> None:
    """SIGTERM and SIGINT set ``stop``; the service's main then drains and exits 0."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)


def write_ready_file(path: Path, **endpoints: Any) -> None:
    """Atomically write where a started service listens (read by the appliance and tests)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), **endpoints}))
    tmp.replace(path)
