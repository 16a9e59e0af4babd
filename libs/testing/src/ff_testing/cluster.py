"""A real cluster for tests and benchmarks, every service a process (``python -m ff_<svc>``, as the appliance has).

``start_cluster``: mgmtd and storage services with a chain table over their targets (``StorageCluster``).
``start_test_cluster`` (``running_cluster`` for a fixture): that, and as the test asks meta, the scheduler, agents
and the collector, and users with their tokens (``Cluster``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import hf3fs
from ff_cluster import MgmtdClient
from ff_testing import free_port
from ff_testing.process import CLUSTER_TOKEN, Process, ServiceProcess, service_process, stop_all
from ff_testing.waiting import eventually
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2 as mpb
from hf3fs.admin import setup_chain_table

if TYPE_CHECKING:  # (imported where used: a storage-only cluster need not load the other services)
    from ff_testing.agent import AgentProcess
    from ff_testing.meta import MetaProcess
    from ff_testing.scheduler import SchedulerProcess

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


def mgmtd_process(folder: Path, timing: Mapping[str, float] = FAST, listen: str = "127.0.0.1:0") -> ServiceProcess:
    """Mgmtd ``m1`` as a process, not yet started (``python -m ff_mgmtd``; a service does not import another one).

    ``timing``: lease, heartbeat and scan settings (default: the tests' fast ones; ``{}``: mgmtd's own);
    ``listen``: its gRPC address (a fixed port lets the storage services start before it is ready).
    """
    settings = {
        "database_url": f"sqlite:///{folder / 'mgmtd.db'}",
        "state_dir": folder / "m1",
        "instance_id": "m1",
        # Its own node id, as the appliance gives every instance one: with 0 it would take the next free id when
        # it registers itself, which may be a storage service's fixed id if that one registered first.
        "node_id": MGMTD_NODE_ID,
        "metrics_address": "",
        "listen_address": listen,
        **timing,
    }
    return service_process("mgmtd", folder, "m1", cluster_token=CLUSTER_TOKEN, settings=settings)


class StorageProcess(ServiceProcess):
    """A storage service process (see ``start_cluster``)."""


@dataclass
class StorageCluster:
    """A real mgmtd and storage services as processes, for tests and benchmarks (``start_cluster``)."""

    folder: Path
    mgmtd_address: str
    mgmtd: ServiceProcess
    nodes: list[StorageProcess]

    @property
    def mgmtd_proc(self) -> Process:
        """Mgmtd's process."""
        assert self.mgmtd.proc is not None
        return self.mgmtd.proc

    def client(self, token: str = CLUSTER_TOKEN) -> MgmtdClient:
        """A new client of the cluster's mgmtd (the caller closes it); the cluster token unless ``token``."""
        return MgmtdClient([self.mgmtd_address], token=token, timeout_s=3.0)

    @contextlib.asynccontextmanager
    async def storage_client(self, **options: Any) -> AsyncIterator[hf3fs.StorageClient]:
        """A storage client of the cluster with the cluster token (``options``: StorageClient's), closed on exit."""
        mg = self.client()
        client = hf3fs.StorageClient(mg, CLUSTER_TOKEN, **options)
        try:
            yield client
        finally:
            await client.close()
            await mg.close()

    async def routing(self) -> mpb.RoutingInfo:
        """The cluster's current routing info, from mgmtd."""
        client = self.client()
        try:
            resp = await client.mgmtd.get_routing_info(mpb.GetRoutingInfoRequest())
            info: mpb.RoutingInfo = resp.routing_info
            return info
        finally:
            await client.close()

    async def wait_all_serving(self, timeout_s: float = 60.0) -> mpb.RoutingInfo:
        """The routing info once there are chains and every target of them serves.

        Raises:
            TimeoutError: not so within ``timeout_s``.
        """
        seen: list[mpb.RoutingInfo] = []

        async def all_serving() -> bool:
            seen[:] = [await self.routing()]
            chains = seen[0].chains
            return bool(chains) and all(
                t.public_state == mpb.PUBLIC_TARGET_STATE_SERVING for c in chains for t in c.targets
            )

        try:
            await eventually(all_serving, timeout_s, "every target serving", interval_s=0.1)
        except TimeoutError:
            raise TimeoutError(f"targets not all serving: {seen[0].chains if seen else None}") from None
        return seen[0]

    def stop(self) -> None:
        """Stop the storage services, then mgmtd (SIGTERM, SIGKILL after 10 s)."""
        stop_all(self.nodes)
        self.mgmtd.terminate()


async def start_cluster(
    folder: Path,
    *,
    num_nodes: int = 3,
    targets_per_disk: int = 2,
    replication: int = 3,
    fsync: bool = True,
    extra: Mapping[str, object] | None = None,
    timing: Mapping[str, float] = FAST,
) -> StorageCluster:
    """Start mgmtd and ``num_nodes`` storage services in ``folder`` and make a chain table over their targets.

    Returns once every target serves; on any failure what was started is stopped. ``extra``: more storage
    settings (fields, or ``--flag`` names without the dashes); ``timing``: mgmtd's lease, heartbeat and scan
    settings.
    """
    await asyncio.to_thread(folder.mkdir, parents=True, exist_ok=True)
    mg_address = f"127.0.0.1:{free_port()}"  # known before mgmtd is up: every process starts at once
    mgmtd = mgmtd_process(folder, timing, mg_address)
    nodes = [
        service_process(
            "storage",
            folder,
            f"s{i}",
            cluster_token=CLUSTER_TOKEN,
            settings={
                "mgmtd_addresses": mg_address,
                "state_dir": folder / f"s{i}",
                "node_id": 100 + i,
                "instance_id": f"s{i}",
                "metrics_address": "",
                "fsync": fsync,
                "forward_timeout_s": 8,
                **(extra or {}),
            },
            kind=StorageProcess,
        )
        for i in range(1, num_nodes + 1)
    ]
    cluster = StorageCluster(folder, mg_address, mgmtd, nodes)
    try:
        for service in (mgmtd, *nodes):
            service.start()
        for service in (mgmtd, *nodes):
            await service.ready(READY_TIMEOUT_S)
        client = cluster.client()
        try:
            await _wait_alive(client, [100 + i for i in range(1, num_nodes + 1)])
            await setup_chain_table(client, CLUSTER_TOKEN, targets_per_disk=targets_per_disk, replication=replication)
        finally:
            await client.close()
        await cluster.wait_all_serving()
        return cluster
    except BaseException:
        cluster.stop()
        raise


async def _wait_alive(client: MgmtdClient, node_ids: list[int], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = (await client.mgmtd.get_routing_info(mpb.GetRoutingInfoRequest())).routing_info
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


@dataclass
class Cluster:
    """A real cluster (``start_test_cluster``), each service a process; users with their tokens and uids.

    mgmtd and storage services always; meta services, the scheduler, agents and the collector as asked.
    """

    folder: Path
    storage: StorageCluster
    tokens: dict[str, str] = field(default_factory=dict)
    uids: dict[str, int] = field(default_factory=dict)
    meta: list[MetaProcess] = field(default_factory=list)
    scheduler: SchedulerProcess | None = None
    agents: list[AgentProcess] = field(default_factory=list)
    telemetry: ServiceProcess | None = None
    _clients: dict[str, hf3fs.FileSystem] = field(default_factory=dict, repr=False)

    @property
    def mgmtd(self) -> str:
        """Mgmtd's gRPC address."""
        return self.storage.mgmtd_address

    def connect(self, user: str, **options: Any) -> hf3fs.FileSystem:
        """A new 3FS client of ``user`` (``hf3fs.connect``; the caller closes it)."""
        return hf3fs.connect(self.mgmtd, self.tokens[user], **options)

    def fs(self, user: str) -> hf3fs.FileSystem:
        """The cluster's own 3FS client of ``user``: made on first use, closed when the cluster stops."""
        if user not in self._clients:
            self._clients[user] = self.connect(user)
        return self._clients[user]

    def logs(self) -> str:
        """The end of every process's log, for a failing test's message."""
        return tail_logs(self.folder)

    def stop(self) -> None:
        """Stop agents, collector, scheduler and meta at once, then storage and mgmtd (SIGTERM; SIGKILL past 15 s)."""
        for client in self._clients.values():
            client.close()
        self._clients.clear()
        others: list[ServiceProcess] = [*self.agents, *self.meta]
        others += [p for p in (self.telemetry, self.scheduler) if p is not None]
        stop_all(others, timeout_s=15.0)
        self.storage.stop()


async def start_test_cluster(
    folder: Path,
    *,
    users: Mapping[str, common_pb2.Role.ValueType] | None = None,
    storage: Mapping[str, Any] | None = None,
    meta: Mapping[str, object] | None = None,
    scheduler: Mapping[str, Any] | None = None,
    agents: Sequence[str] = (),
    telemetry: Mapping[str, object] | None = None,
) -> Cluster:
    """Start a cluster in ``folder``: mgmtd and storage services (``start_cluster(**storage)``), then what is asked.

    ``meta``, ``scheduler``, ``telemetry``: that service (``meta1`` on ``meta.db``, ``s1`` on ``sched.db``, ``t1``)
    with these settings over the tests' own (``{}``: none more); ``agents``: an agent of each name, once the
    scheduler serves; ``users``: name: role (default: alice, bob and the admin root). Returns once every
    process is ready; on any failure what was started is stopped.
    """
    from ff_testing.agent import spawn_process as agent_process
    from ff_testing.meta import meta_process
    from ff_testing.mgmtd import TEST_USERS, create_users
    from ff_testing.scheduler import spawn_process as scheduler_process
    from ff_testing.telemetry import telemetry_process

    cluster = Cluster(folder, await start_cluster(folder, **(storage or {})))
    address = cluster.mgmtd
    try:
        if meta is not None:
            database = f"sqlite:///{folder / 'meta.db'}"
            cluster.meta.append(
                meta_process(
                    folder, "meta1", mgmtd_address=address, cluster_token=CLUSTER_TOKEN, database_url=database, **meta
                )
            )
            cluster.meta[0].start()
        if scheduler is not None:
            database = f"sqlite:///{folder / 'sched.db'}"
            cluster.scheduler = scheduler_process(folder, database, address, CLUSTER_TOKEN, **scheduler)
        if telemetry is not None:
            cluster.telemetry = telemetry_process(
                folder, "t1", mgmtd_address=address, cluster_token=CLUSTER_TOKEN, **telemetry
            )
            cluster.telemetry.start()
        cluster.tokens, cluster.uids = await create_users(address, dict(TEST_USERS) if users is None else users)
        for service in (*cluster.meta, cluster.scheduler, cluster.telemetry):
            if service is not None:
                await service.ready(READY_TIMEOUT_S)
        for name in agents:
            cluster.agents.append(agent_process(folder, address, CLUSTER_TOKEN, name))
        for agent in cluster.agents:
            await agent.ready(READY_TIMEOUT_S)
        return cluster
    except BaseException:
        cluster.stop()
        raise


@contextlib.contextmanager
def running_cluster(folder: Path, **asked: Any) -> Iterator[Cluster]:
    """``start_test_cluster(folder, **asked)`` for a fixture of any scope: the cluster, stopped on exit.

    When the block fails (a fixture's setup, not its tests), the end of every process's log is printed.
    """
    cluster = asyncio.run(start_test_cluster(folder, **asked))
    try:
        yield cluster
    except BaseException:
        print(cluster.logs())
        raise
    finally:
        cluster.stop()
