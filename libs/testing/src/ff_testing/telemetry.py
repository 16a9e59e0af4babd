"""Helpers to run the collector for real in tests and benchmarks, and a client with one token.

The collector runs in this process (an asyncio task) or as a process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ff_telemetry.config import TelemetrySettings
from ff_telemetry.server import main
from ff_testing.process import ServiceProcess, service_process
from ff_testing.service import InProcessService, ServiceClient
from ff_testing.service import start_in_process as start_service
from fireflyer.telemetry.v1 import telemetry_pb2_grpc

READY_TIMEOUT_S = 20.0
# Jobs every fraction of a second so tests take seconds.
FAST: dict[str, Any] = {
    "downsample_interval_s": 0.2,
    "downsample_lag_s": 0.0,
    "scrape_interval_s": 0.3,
    "token_cache_ttl_s": 0.5,
    "grace_s": 0.5,
    # The alert engine's calls to mgmtd add scraped series mid-test; the alert tests turn it on.
    "alerts": False,
}


class InProcessTelemetry(InProcessService):
    """A collector serving in this process as an asyncio task (``start_in_process``)."""

    @property
    def http_address(self) -> str:
        """The address of its HTTP endpoints (``/metrics``, ``/federate``, the dashboard)."""
        return str(self.info["http"])


async def start_in_process(
    folder: Path, database_url: str, mgmtd_address: str, cluster_token: str, name: str = "t1", **overrides: Any
) -> InProcessTelemetry:
    """Start a collector named ``name`` in this event loop with the tests' fast jobs; return it once ready.

    ``overrides`` are settings fields.
    """
    ready = folder / f"{name}.ready.json"
    settings = TelemetrySettings(
        **{
            "state_dir": folder / name,
            "database_url": database_url,
            "mgmtd_addresses": mgmtd_address,
            "cluster_token": cluster_token,
            "ready_file": ready,
            "instance_id": name,
            **FAST,
            **overrides,
        }
    )
    started = await start_service(main, settings, ready, READY_TIMEOUT_S)
    return InProcessTelemetry(started.info, started.stop, started.task)


def telemetry_process(
    folder: Path, name: str, *, mgmtd_address: str, cluster_token: str, **settings: object
) -> ServiceProcess:
    """The collector as a process (``python -m ff_telemetry``), not yet started; ``settings`` become ``--flags``.

    SQLite in ``folder/name``, the tests' fast jobs.
    """
    values = {
        "state_dir": folder / name,
        "instance_id": name,
        "mgmtd_addresses": mgmtd_address,
        "metrics_address": "",
        **FAST,
        **settings,
    }
    return service_process("telemetry", folder, name, cluster_token=cluster_token, settings=values)


class TelemetryClient(ServiceClient):
    """TelemetryService with one token (``stub``)."""

    def __init__(self, address: str, token: str) -> None:
        super().__init__(address, token)
        self.stub = telemetry_pb2_grpc.TelemetryServiceStub(self.channel)
