"""Helpers to run mgmtd for real in tests: in this process (an asyncio task) or as a subprocess."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ff_cluster import MgmtdClient
from ff_mgmtd.config import MgmtdSettings
from ff_mgmtd.server import main
from ff_testing.process import Process, spawn, wait_ready
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2

CLUSTER_TOKEN = "test-cluster-token"
READY_TIMEOUT_S = 20.0
# Short leases so tests of expiry and failover take seconds.
FAST_TIMING: dict[str, float] = {
    "lease_duration_s": 4.0,
    "heartbeat_interval_s": 0.25,
    "election_lease_s": 1.0,
    "grace_s": 1.0,
}
# The users of make_users(): two users and an admin.
TEST_USERS = (("alice", common_pb2.ROLE_USER), ("bob", common_pb2.ROLE_USER), ("root", common_pb2.ROLE_ADMIN))


@dataclass
class InProcessMgmtd:
    """An mgmtd serving in the test's own event loop."""

    address: str
    metrics_port: int
    cluster_id: str
    stop: asyncio.Event
    task: asyncio.Task[None]

    def client(self, token: str = CLUSTER_TOKEN) -> MgmtdClient:
        """A new client of this instance (the caller closes it); the cluster token unless ``token`` is given."""
        return MgmtdClient([self.address], token=token)

    async def shutdown(self) -> None:
        """Stop the instance (it resigns its lease) and wait up to 15 s for it to finish."""
        self.stop.set()
        await asyncio.wait_for(self.task, timeout=15)


async def start_in_process(folder: Path, database_url: str, name: str = "m1", **overrides: Any) -> InProcessMgmtd:
    """Start mgmtd ``name`` in this event loop with short leases; return it once it registered itself.

    ``overrides`` are settings fields.
    """
    ready = folder / f"{name}.ready.json"
    ready.unlink(missing_ok=True)
    settings = MgmtdSettings(
        **{
            "state_dir": folder / name,
            "database_url": database_url,
            "cluster_token": CLUSTER_TOKEN,
            "ready_file": ready,
            "metrics_address": "127.0.0.1:0",
            "instance_id": name,
            **FAST_TIMING,
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
    instance = InProcessMgmtd(info["grpc"], info["metrics_port"], info["cluster_id"], stop, task)
    await wait_registered(instance.client(), name)
    return instance


async def make_users(mgmtd: InProcessMgmtd) -> dict[str, str]:
    """Creates the TEST_USERS in mgmtd's registry and issues each a token; the tokens by user name."""
    client = mgmtd.client()
    tokens = {}
    try:
        for name, role in TEST_USERS:
            await client.identity(lambda s: s.CreateUser, mgmtd_pb2.CreateUserRequest(name=name, role=role))
            issued = await client.identity(lambda s: s.IssueToken, mgmtd_pb2.IssueTokenRequest(user_name=name))
            tokens[name] = issued.token
    finally:
        await client.close()
    return tokens


@asynccontextmanager
async def running_with_users(
    folder: Path, database_url: str, **overrides: Any
) -> AsyncIterator[tuple[InProcessMgmtd, dict[str, str]]]:
    """An mgmtd in this process (``start_in_process``) with the TEST_USERS and their tokens; shut down on exit.

    ``overrides`` are settings fields (a test of lease expiry passes a shorter ``lease_duration_s``).
    """
    mgmtd = await start_in_process(folder, database_url, **overrides)
    try:
        yield mgmtd, await make_users(mgmtd)
    finally:
        await mgmtd.shutdown()


async def wait_registered(client: MgmtdClient, instance_id: str, timeout_s: float = 10.0) -> None:
    """Until the instance's own node (it registers itself) is alive in the routing info."""
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            info = (await client.mgmtd(lambda s: s.GetRoutingInfo, mgmtd_pb2.GetRoutingInfoRequest())).routing_info
            if any(
                n.tags.get("instance_id") == instance_id and n.status == mgmtd_pb2.NODE_STATUS_ALIVE for n in info.nodes
            ):
                return
            await asyncio.sleep(0.05)
    finally:
        await client.close()
    raise TimeoutError(f"mgmtd {instance_id} did not register itself")


@dataclass
class MgmtdProcess:
    """An mgmtd in its own process (``python -m ff_mgmtd``)."""

    name: str
    proc: Process
    ready_file: Path
    log: Path
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def address(self) -> str:
        """The instance's gRPC address, from its ready file (after ``ready``)."""
        return str(self.info["grpc"])

    async def ready(self) -> MgmtdProcess:
        """Wait for the ready file and return this process; raises if the process exits first."""
        self.info = await wait_ready(self.ready_file, self.proc, READY_TIMEOUT_S)
        return self


def spawn_process(folder: Path, database_url: str, name: str, **overrides: Any) -> MgmtdProcess:
    """Start ``python -m ff_mgmtd`` with short leases, its output in ``folder/<name>.log``; not yet ready."""
    ready, log = folder / f"{name}.ready.json", folder / f"{name}.log"
    ready.unlink(missing_ok=True)
    flags = {
        "database_url": database_url,
        "state_dir": folder / name,
        "ready_file": ready,
        "instance_id": name,
        "metrics_address": "",
        **FAST_TIMING,
        **overrides,
    }
    args = [sys.executable, "-m", "ff_mgmtd"]
    for key, value in flags.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    env = {**os.environ, "FF_MGMTD_CLUSTER_TOKEN": CLUSTER_TOKEN}
    with log.open("ab") as out:
        proc = spawn(args, log=out, env=env)
    return MgmtdProcess(name, proc, ready, log)
