"""Run a real cluster for tests and benchmarks: mgmtd and storage services as subprocesses."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ff_cluster import MgmtdClient
from ff_testing import free_port
from ff_testing.process import Process, ServiceProcess, module_args, spawn, stop_all, wait_ready
from fireflyer.mgmtd.v1 import mgmtd_pb2 as mpb
from hf3fs.admin import setup_chain_table

CLUSTER_TOKEN = "test-cluster-token"
FAST = {
    "lease_duration_s": 2.0,
    "heartbeat_interval_s": 0.2,
    "election_lease_s": 2.0,
    "grace_s": 0.5,
    "chain_scan_interval_s": 0.1,
}


# Four processes importing grpc at once on a loaded 2-core CI machine: each may take far longer than alone.
READY_TIMEOUT_S = 60.0
MGMTD_NODE_ID = 1  # the storage services are 101, 102, ...


def spawn_mgmtd(folder: Path, timing: dict[str, float] = FAST, listen: str = "127.0.0.1:0") -> tuple[Process, Path]:
    """Start mgmtd as a process (``python -m ff_mgmtd``; a service does not import another one).

    ``timing``: lease, heartbeat and scan settings (default: the tests' fast ones; ``{}``: mgmtd's own);
    ``listen``: its gRPC address (a fixed port lets the storage services start before it is ready).
    """
    ready = folder / "m1.ready.json"
    ready.unlink(missing_ok=True)
    flags = {
        "database-url": f"sqlite:///{folder / 'mgmtd.db'}",
        "state-dir": str(folder / "m1"),
        "ready-file": str(ready),
        "instance-id": "m1",
        # Its own node id, as the appliance gives every instance one: with 0 it would take the next free id when
        # it registers itself, which may be a storage service's fixed id if that one registered first.
        "node-id": str(MGMTD_NODE_ID),
        "metrics-address": "",
        "listen-address": listen,
        **{k.replace("_", "-"): str(v) for k, v in timing.items()},
    }
    env = {**os.environ, "FF_MGMTD_CLUSTER_TOKEN": CLUSTER_TOKEN}
    with (folder / "m1.log").open("ab") as out:
        proc = spawn(module_args("ff_mgmtd", flags), log=out, env=env)
    return proc, ready


class StorageProcess(ServiceProcess):
    """A storage service process (see ``start_cluster``)."""


@dataclass
class StorageCluster:
    """A real mgmtd and storage services as processes, for tests and benchmarks (``start_cluster``)."""

    folder: Path
    mgmtd_address: str
    mgmtd_proc: Process
    nodes: list[StorageProcess]

    def client(self, token: str = CLUSTER_TOKEN) -> MgmtdClient:
        """A new client of the cluster's mgmtd (the caller closes it); the cluster token unless ``token``."""
        return MgmtdClient([self.mgmtd_address], token=token, timeout_s=3.0)

    async def routing(self) -> mpb.RoutingInfo:
        """The cluster's current routing info, from mgmtd."""
        client = self.client()
        try:
            resp = await client.mgmtd(lambda s: s.GetRoutingInfo, mpb.GetRoutingInfoRequest())
            info: mpb.RoutingInfo = resp.routing_info
            return info
        finally:
            await client.close()

    async def wait_all_serving(self, timeout_s: float = 60.0) -> mpb.RoutingInfo:
        """The routing info once there are chains and every target of them serves.

        Raises:
            TimeoutError: not so within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            info = await self.routing()
            if info.chains and all(
                t.public_state == mpb.PUBLIC_TARGET_STATE_SERVING for c in info.chains for t in c.targets
            ):
                return info
            if time.monotonic() > deadline:
                raise TimeoutError(f"targets not all serving: {info.chains}")
            await asyncio.sleep(0.1)

    def stop(self) -> None:
        """Stop the storage services, then mgmtd (SIGTERM, SIGKILL after 10 s)."""
        stop_all(self.nodes)
        if self.mgmtd_proc.poll() is None:
            self.mgmtd_proc.terminate()
            try:
                self.mgmtd_proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.mgmtd_proc.kill()
                self.mgmtd_proc.wait()


async def start_cluster(
    folder: Path,
    *,
    num_nodes: int = 3,
    targets_per_disk: int = 2,
    replication: int = 3,
    fsync: bool = True,
    extra: dict[str, str] | None = None,
    timing: dict[str, float] = FAST,
) -> StorageCluster:
    """Start mgmtd and ``num_nodes`` storage services in ``folder`` and make a chain table over their targets.

    Returns once every target serves; on any failure what was started is stopped. ``extra``: more storage
    flags; ``timing``: mgmtd's lease, heartbeat and scan settings.
    """
    await asyncio.to_thread(folder.mkdir, parents=True, exist_ok=True)
    mg_address = f"127.0.0.1:{free_port()}"  # known before mgmtd is up: every process starts at once
    mg_proc, mg_ready = spawn_mgmtd(folder, timing, mg_address)
    cluster: StorageCluster | None = None
    try:
        nodes = []
        env = {**os.environ, "FF_STORAGE_CLUSTER_TOKEN": CLUSTER_TOKEN}
        for i in range(1, num_nodes + 1):
            flags = {
                "mgmtd-addresses": mg_address,
                "state-dir": str(folder / f"s{i}"),
                "node-id": str(100 + i),
                "instance-id": f"s{i}",
                "metrics-address": "",
                "fsync": str(fsync).lower(),
                "forward-timeout-s": "8",
                **(extra or {}),
            }
            nodes.append(StorageProcess(f"s{i}", folder, module_args("ff_storage", flags), env))
        cluster = StorageCluster(folder, mg_address, mg_proc, nodes)
        for n in nodes:
            n.start()
        await wait_ready(mg_ready, mg_proc, READY_TIMEOUT_S)
        for n in nodes:
            await n.ready(READY_TIMEOUT_S)
        client = cluster.client()
        try:
            await _wait_alive(client, [100 + i for i in range(1, num_nodes + 1)])
            await setup_chain_table(client, CLUSTER_TOKEN, targets_per_disk=targets_per_disk, replication=replication)
        finally:
            await client.close()
        await cluster.wait_all_serving()
        return cluster
    except BaseException:
        if cluster is not None:
            cluster.stop()
        elif mg_proc.poll() is None:
            mg_proc.kill()
        raise


async def _wait_alive(client: MgmtdClient, node_ids: list[int], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = (await client.mgmtd(lambda s: s.GetRoutingInfo, mpb.GetRoutingInfoRequest())).routing_info
        alive = {n.node_id for n in info.nodes if n.status == mpb.NODE_STATUS_ALIVE}
        if set(node_ids) <= alive:
            return
        await asyncio.sleep(0.05)
    raise TimeoutError("storage nodes did not register")


def tail_logs(folder: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of every process log in ``folder``, for a failing test's message."""
    out = []
    for log in sorted(folder.glob("*.log")):
        text = log.read_text(errors="replace").splitlines()[-lines:]
        out.append(f"== {log.name}\n" + "\n".join(text))
    return "\n".join(out)
