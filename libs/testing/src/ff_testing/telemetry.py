"""Helpers to run the collector for real in tests and benchmarks, and a client with one token.

The collector runs in this process (an asyncio task) or as a process.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ff_rpc import RpcClient, open_channel
from ff_telemetry.config import TelemetrySettings
from ff_telemetry.server import main
from ff_testing.process import ServiceProcess, module_args, wait_ready
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


@dataclass
class InProcessTelemetry:
    """A collector serving in this process as an asyncio task (``start_in_process``)."""

    address: str
    http_address: str
    stop: asyncio.Event
    task: asyncio.Task[None]

    async def shutdown(self) -> None:
        """Stop the collector and wait up to 15 s for it to finish."""
        self.stop.set()
        await asyncio.wait_for(self.task, timeout=15)


async def start_in_process(
    folder: Path, database_url: str, mgmtd_address: str, cluster_token: str, name: str = "t1", **overrides: Any
) -> InProcessTelemetry:
    """Start a collector named ``name`` in this event loop with the tests' fast jobs; return it once ready.

    ``overrides`` are settings fields.
    """
    ready = folder / f"{name}.ready.json"
    ready.unlink(missing_ok=True)
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
    stop = asyncio.Event()
    task = asyncio.create_task(main(settings, stop))
    try:
        info = await wait_ready(ready, timeout_s=READY_TIMEOUT_S)
    except Exception:
        stop.set()
        await task
        raise
    return InProcessTelemetry(info["grpc"], info["http"], stop, task)


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
    flags = {k.replace("_", "-"): str(v).lower() if isinstance(v, bool) else str(v) for k, v in values.items()}
    env = {**os.environ, "FF_TELEMETRY_CLUSTER_TOKEN": cluster_token}
    folder.mkdir(parents=True, exist_ok=True)
    return ServiceProcess(name, folder, module_args("ff_telemetry", flags), env)


class TelemetryClient:
    """TelemetryService with one token."""

    def __init__(self, address: str, token: str) -> None:
        self.channel = open_channel(address)
        self.rpc = RpcClient(token=token, timeout_s=10.0)
        self.stub = telemetry_pb2_grpc.TelemetryServiceStub(self.channel)

    async def call(self, method: Any, request: Any) -> Any:
        """Call ``method`` (a method of ``stub``) with the client's token; RpcError on failure."""
        return await self.rpc.unary(method, request)

    async def close(self) -> None:
        """Close the channel."""
        await self.channel.close()
