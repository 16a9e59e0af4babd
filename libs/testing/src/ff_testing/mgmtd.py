"""Helpers to run mgmtd for real in tests: in this process (an asyncio task) or as a subprocess."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from ff_cluster import MgmtdClient
from ff_mgmtd.config import MgmtdSettings
from ff_mgmtd.server import main
from ff_testing.process import CLUSTER_TOKEN, ServiceProcess, service_process
from ff_testing.service import InProcessService
from ff_testing.service import start_in_process as start_service
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2

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


class InProcessMgmtd(InProcessService):
    """An mgmtd serving in the test's own event loop."""

    @property
    def metrics_port(self) -> int:
        """The port of its ``/metrics`` endpoint."""
        return int(self.info["metrics_port"])

    @property
    def cluster_id(self) -> str:
        """The cluster's id, as mgmtd made it."""
        return str(self.info["cluster_id"])

    def client(self, token: str = CLUSTER_TOKEN) -> MgmtdClient:
        """A new client of this instance (the caller closes it); the cluster token unless ``token`` is given."""
        return MgmtdClient([self.address], token=token)


async def start_in_process(folder: Path, database_url: str, name: str = "m1", **overrides: Any) -> InProcessMgmtd:
    """Start mgmtd ``name`` in this event loop with short leases; return it once it registered itself.

    ``overrides`` are settings fields.
    """
    ready = folder / f"{name}.ready.json"
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
    started = await start_service(main, settings, ready, READY_TIMEOUT_S)
    instance = InProcessMgmtd(started.info, started.stop, started.task)
    await wait_registered(instance.client(), name)
    return instance


async def create_users(
    mgmtd_address: str, users: Mapping[str, common_pb2.Role.ValueType] = dict(TEST_USERS)
) -> tuple[dict[str, str], dict[str, int]]:
    """Creates ``users`` (name: role) in the registry of the mgmtd at ``mgmtd_address`` and issues each a token.

    Returns the tokens and the uids, by user name.
    """
    client = MgmtdClient([mgmtd_address], token=CLUSTER_TOKEN, timeout_s=5.0)
    tokens, uids = {}, {}
    try:
        for name, role in users.items():
            user = await client.identity.create_user(mgmtd_pb2.CreateUserRequest(name=name, role=role))
            uids[name] = int(user.user.uid)
            issued = await client.identity.issue_token(mgmtd_pb2.IssueTokenRequest(user_name=name))
            tokens[name] = str(issued.token)
    finally:
        await client.close()
    return tokens, uids


async def make_users(mgmtd: InProcessMgmtd) -> dict[str, str]:
    """Creates the TEST_USERS in mgmtd's registry and issues each a token; the tokens by user name."""
    return (await create_users(mgmtd.address))[0]


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
            info = (await client.mgmtd.get_routing_info(mgmtd_pb2.GetRoutingInfoRequest())).routing_info
            if any(
                n.tags.get("instance_id") == instance_id and n.status == mgmtd_pb2.NODE_STATUS_ALIVE for n in info.nodes
            ):
                return
            await asyncio.sleep(0.05)
    finally:
        await client.close()
    raise TimeoutError(f"mgmtd {instance_id} did not register itself")


class MgmtdProcess(ServiceProcess):
    """An mgmtd in its own process (``python -m ff_mgmtd``)."""


def spawn_process(folder: Path, database_url: str, name: str, **overrides: Any) -> MgmtdProcess:
    """Start ``python -m ff_mgmtd`` with short leases, its output in ``folder/<name>.log``; not yet ready."""
    settings = {
        "database_url": database_url,
        "state_dir": folder / name,
        "instance_id": name,
        "metrics_address": "",
        **FAST_TIMING,
        **overrides,
    }
    proc = service_process("mgmtd", folder, name, cluster_token=CLUSTER_TOKEN, settings=settings, kind=MgmtdProcess)
    proc.start()
    return proc
