"""Helpers to run the scheduler for real in tests, and a protocol-level agent driver.

The scheduler runs in this process or as a subprocess. The agent driver is a real AgentService on a port,
registered with mgmtd and the scheduler, that records the orders it gets and reports what the test tells it to.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ff_cluster import MembershipOptions, NodeMembership
from ff_rpc import RpcServer, ServerOptions, ServiceBinding
from ff_scheduler.config import SchedulerSettings
from ff_scheduler.server import main
from ff_testing.mgmtd import InProcessMgmtd
from ff_testing.process import CLUSTER_TOKEN, ServiceProcess, service_process
from ff_testing.service import InProcessService, ServiceClient
from ff_testing.service import start_in_process as start_service
from fireflyer.agent.v1 import agent_pb2, agent_pb2_grpc
from fireflyer.common.v1 import common_pb2
from fireflyer.scheduler.v1 import scheduler_pb2 as pb
from fireflyer.scheduler.v1 import scheduler_pb2_grpc

READY_TIMEOUT_S = 20.0
# Short deadlines so protocol tests take seconds.
FAST: dict[str, Any] = {
    "tick_interval_s": 0.1,
    "ack_window_s": 1.0,
    "default_grace_s": 2.0,
    "max_grace_s": 10.0,
    "min_run_time_s": 0.0,
    "order_resend_interval_s": 0.5,
    "stop_timeout_s": 5.0,
    "start_timeout_s": 10.0,
    "token_cache_ttl_s": 0.5,
    "grace_s": 0.5,
    "default_max_restarts": 1,
}


class InProcessScheduler(InProcessService):
    """A scheduler serving in this process as an asyncio task (``start_in_process``)."""


def _settings_for(
    folder: Path, database_url: str, mgmtd_address: str, name: str = "s1", **overrides: Any
) -> dict[str, Any]:
    return {
        "state_dir": folder / name,
        "database_url": database_url,
        "mgmtd_addresses": mgmtd_address,
        "metrics_address": "",
        "instance_id": name,
        **FAST,
        **overrides,
    }


async def start_in_process(
    folder: Path, database_url: str, mgmtd_address: str, cluster_token: str, name: str = "s1", **overrides: Any
) -> InProcessScheduler:
    """Start a scheduler named ``name`` in this event loop with test settings; return it once ready.

    ``overrides`` are settings fields.
    """
    ready = folder / f"{name}.ready.json"
    values = _settings_for(folder, database_url, mgmtd_address, name, **overrides)
    settings = SchedulerSettings(**{**values, "cluster_token": cluster_token, "ready_file": ready})
    started = await start_service(main, settings, ready, READY_TIMEOUT_S)
    return InProcessScheduler(started.info, started.stop, started.task)


class SchedulerProcess(ServiceProcess):
    """A scheduler in its own process (``python -m ff_scheduler``)."""


def spawn_process(
    folder: Path, database_url: str, mgmtd_address: str, cluster_token: str, name: str = "s1", **overrides: Any
) -> SchedulerProcess:
    """Start ``python -m ff_scheduler`` with test settings, the cluster token in its environment; not yet ready."""
    settings = _settings_for(folder, database_url, mgmtd_address, name, **overrides)
    proc = service_process(
        "scheduler", folder, name, cluster_token=cluster_token, settings=settings, kind=SchedulerProcess
    )
    proc.start()
    return proc


class SchedulerClient(ServiceClient):
    """SchedulerService (``user``) and SchedulerAgentService (``agent``) with one token."""

    def __init__(self, address: str, token: str) -> None:
        super().__init__(address, token)
        self.user = scheduler_pb2_grpc.SchedulerServiceStub(self.channel)
        self.agent = scheduler_pb2_grpc.SchedulerAgentServiceStub(self.channel)


@dataclass
class SchedulerCluster:
    """mgmtd (with users and their tokens) and the scheduler serving in this event loop (``running_scheduler``).

    ``client(user)`` makes a client of a user (``"cluster"``: with the cluster token), closed with the cluster.
    """

    folder: Path
    db_url: str
    mgmtd: InProcessMgmtd
    scheduler: InProcessScheduler
    tokens: dict[str, str]
    clients: list[SchedulerClient] = field(default_factory=list)

    def client(self, user: str) -> SchedulerClient:
        """A client of the scheduler with ``user``'s token (``"cluster"``: the cluster token)."""
        c = SchedulerClient(self.scheduler.address, self.tokens[user] if user != "cluster" else CLUSTER_TOKEN)
        self.clients.append(c)
        return c

    async def close(self) -> None:
        """Close the clients, then stop the scheduler (unless a test did); mgmtd is its owner's to stop."""
        for client in self.clients:
            await client.close()
        if not self.scheduler.task.done():
            await self.scheduler.shutdown()


C = TypeVar("C", bound=SchedulerCluster)


@asynccontextmanager
async def running_scheduler(
    folder: Path,
    db_url: str,
    mgmtd: InProcessMgmtd,
    tokens: dict[str, str],
    *,
    kind: type[C] = SchedulerCluster,  # type: ignore[assignment]
    **settings: Any,
) -> AsyncIterator[C]:
    """The scheduler in this event loop on ``db_url`` with the test settings and ``settings``, with ``mgmtd``.

    Yields a ``kind`` (a SchedulerCluster, or a test's subclass of it) and closes it on exit.
    """
    scheduler = await start_in_process(folder, db_url, mgmtd.address, CLUSTER_TOKEN, **settings)
    cluster = kind(folder, db_url, mgmtd, scheduler, tokens)
    try:
        yield cluster
    finally:
        await cluster.close()


# Suspend behaviours of the agent driver's task.
ACK_AND_GO = "ack_and_go"  # rank 0 reads the flag, then calls go_suspend()
ACK_ONLY = "ack_only"  # rank 0 reads the flag, never calls go_suspend()
IGNORE = "ignore"  # rank 0 never reads the flag


class AgentDriver(agent_pb2_grpc.AgentServiceServicer):
    """A node agent at the protocol level: orders in, reports out; no processes."""

    def __init__(
        self,
        scheduler_address: str,
        mgmtd_address: str,
        cluster_token: str,
        *,
        zone: str = "",
        node_group: str = "",
        num_devices: int = 2,
        suspend_mode: str = ACK_AND_GO,
    ) -> None:
        self.scheduler_address, self.mgmtd_address, self.cluster_token = scheduler_address, mgmtd_address, cluster_token
        self.zone, self.node_group, self.num_devices, self.suspend_mode = zone, node_group, num_devices, suspend_mode
        self.node_id = 0
        self.starts: list[agent_pb2.StartRunRequest] = []
        self.suspends: list[agent_pb2.SuspendRunRequest] = []
        self.stops: list[agent_pb2.StopRunRequest] = []
        self.phases: dict[int, int] = {}
        self.task_of: dict[int, int] = {}
        self.logs: dict[int, bytes] = defaultdict(bytes)
        self.changed = asyncio.Condition()
        self._server: RpcServer | None = None
        self._stop = asyncio.Event()
        self._membership: asyncio.Task[None] | None = None
        self._background: set[asyncio.Future[None]] = set()
        self.client: SchedulerClient | None = None

    async def start(self) -> AgentDriver:
        """Serve AgentService on a free port, register with mgmtd (then heartbeat) and with the scheduler."""
        self._server = RpcServer(
            ServerOptions(listen_address="127.0.0.1:0", cluster_token=self.cluster_token),
            [
                ServiceBinding(
                    agent_pb2.DESCRIPTOR.services_by_name["AgentService"].full_name,
                    agent_pb2_grpc.add_AgentServiceServicer_to_server,
                    self,
                )
            ],
        )
        await self._server.start()
        membership = NodeMembership(
            MembershipOptions(
                mgmtd_addresses=[self.mgmtd_address],
                cluster_token=self.cluster_token,
                node_type=common_pb2.NODE_TYPE_AGENT,
                hostname="test-agent",
                endpoints={"grpc": self._server.address},
            )
        )
        self._membership = asyncio.create_task(membership.run(self._stop))
        await asyncio.wait_for(membership.registered.wait(), 10)
        self.node_id = membership.node_id
        self.client = SchedulerClient(self.scheduler_address, self.cluster_token)
        await self.register()
        return self

    async def register(self) -> Any:
        """Register (again) with the scheduler as a node of ``num_devices`` CPU slots; its answer."""
        assert self.client is not None and self._server is not None
        devices = [pb.Device(index=i, kind=pb.DEVICE_KIND_CPU_SLOT, name="cpu-slot") for i in range(self.num_devices)]
        return await self.client.call(
            self.client.agent.RegisterNode,
            pb.RegisterNodeRequest(
                node_id=self.node_id,
                hostname=f"node{self.node_id}",
                agent_address=self._server.address,
                master_ip="127.0.0.1",
                devices=devices,
                num_cpus=4,
                memory_bytes=1 << 30,
                zone=self.zone,
                node_group=self.node_group,
            ),
        )

    async def follow(self, scheduler_address: str) -> None:
        """Report to the scheduler now at ``scheduler_address`` (a restarted one).

        As an agent that looks the scheduler up again does; the runs it holds stay as they are.
        """
        if self.client is not None:
            await self.client.close()
        self.scheduler_address = scheduler_address
        self.client = SchedulerClient(scheduler_address, self.cluster_token)

    def lose_lease(self) -> None:
        """Stop heartbeating mgmtd (the node dies as far as the cluster knows); the server stays up."""
        self._stop.set()

    async def close(self) -> None:
        """Stop heartbeating, close the client and stop the server."""
        self._stop.set()
        if self._membership is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._membership, 5)
        if self.client is not None:
            await self.client.close()
        if self._server is not None:
            await self._server.stop(0)

    # ---- what the agent reports ----

    async def report(
        self,
        run_id: int,
        phase: int,
        *,
        exit_code: int = 0,
        failure_class: int = 0,
        last_output_at: float | None = None,
    ) -> Any:
        """Report ``run_id`` in ``phase`` (with a failure when ``failure_class`` is set); the scheduler's answer."""
        assert self.client is not None
        report = pb.RunReport(
            task_id=self.task_of[run_id],
            run_id=run_id,
            phase=phase,  # type: ignore[arg-type]
            reported_at=time.time(),
            ranks=[
                pb.RankStatus(local_rank=0, state=pb.RANK_STATE_RUNNING, last_output_at=last_output_at or time.time())
            ],
        )
        if failure_class:
            report.failure.CopyFrom(
                pb.RunFailure(
                    failure_class=failure_class,  # type: ignore[arg-type]
                    node_id=self.node_id,
                    exit_code=exit_code,
                    failed_at=time.time(),
                    message="exit 1",
                )
            )
        self.phases[run_id] = phase
        return await self.client.call(
            self.client.agent.ReportRunStatus, pb.ReportRunStatusRequest(node_id=self.node_id, runs=[report])
        )

    async def suspend_stage(self, run_id: int, stage: int) -> None:
        """Report that ``run_id``'s suspend reached ``stage`` now."""
        assert self.client is not None
        await self.client.call(
            self.client.agent.ReportSuspendStage,
            pb.ReportSuspendStageRequest(
                node_id=self.node_id,
                task_id=self.task_of[run_id],
                run_id=run_id,
                stage=stage,  # type: ignore[arg-type]
                reported_at=time.time(),
            ),
        )

    async def checkpoint(self, run_id: int, step: int, path: str | None = None, taken_at: float | None = None) -> None:
        """Report a checkpoint of ``run_id``, its state captured at ``taken_at`` (default: now)."""
        assert self.client is not None
        await self.client.call(
            self.client.agent.ReportCheckpoint,
            pb.ReportCheckpointRequest(
                node_id=self.node_id,
                task_id=self.task_of[run_id],
                run_id=run_id,
                checkpoint=pb.Checkpoint(
                    path=path or f"/3fs/ckpt/{run_id}",
                    step=step,
                    committed_at=time.time(),
                    taken_at=time.time() if taken_at is None else taken_at,
                ),
            ),
        )

    async def update_run(self, run_id: int, **fields: Any) -> None:
        """Pass on an SDK change of ``run_id`` (``fields`` of UpdateRunRequest)."""
        assert self.client is not None
        await self.client.call(
            self.client.agent.UpdateRun,
            pb.UpdateRunRequest(node_id=self.node_id, task_id=self.task_of[run_id], run_id=run_id, **fields),
        )

    async def wait_for(self, predicate: Callable[[], bool], timeout_s: float = 15.0) -> None:
        """Wait until ``predicate`` holds after an order came in; TimeoutError past ``timeout_s``."""
        async with self.changed, asyncio.timeout(timeout_s):  # not wait_for: see ff_mgmtd.app.wait_notified
            await self.changed.wait_for(predicate)

    def _spawn(self, coro: Awaitable[None]) -> None:
        fut = asyncio.ensure_future(coro)
        self._background.add(fut)
        fut.add_done_callback(self._background.discard)

    async def _notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    # ---- AgentService: orders from the scheduler ----

    async def StartRun(self, request: agent_pb2.StartRunRequest, context: Any) -> agent_pb2.StartRunResponse:
        """Record the order; a run not reported yet is reported running."""
        self.starts.append(request)
        self.task_of[request.run_id] = request.task_id
        if request.run_id not in self.phases:
            self.logs[request.run_id] += f"rank {request.node_rank} started\n".encode()
            self._spawn(self._started(request.run_id))
        await self._notify()
        return agent_pb2.StartRunResponse()

    async def _started(self, run_id: int) -> None:
        with contextlib.suppress(Exception):
            await self.report(run_id, pb.NODE_RUN_PHASE_RUNNING)

    async def SuspendRun(self, request: agent_pb2.SuspendRunRequest, context: Any) -> agent_pb2.SuspendRunResponse:
        """Record the order; the first for a run plays the suspend protocol as ``suspend_mode`` says."""
        self.suspends.append(request)
        self.task_of.setdefault(request.run_id, request.task_id)
        if self.suspend_mode != IGNORE and len([s for s in self.suspends if s.run_id == request.run_id]) == 1:
            self._spawn(self._suspend_protocol(request.run_id))
        await self._notify()
        return agent_pb2.SuspendRunResponse(flag_raised=True)

    async def _suspend_protocol(self, run_id: int) -> None:
        with contextlib.suppress(Exception):
            await self.suspend_stage(run_id, pb.SUSPEND_STAGE_RECEIVED)
            if self.suspend_mode == ACK_AND_GO:
                await asyncio.sleep(0.2)  # "saving a checkpoint"
                await self.suspend_stage(run_id, pb.SUSPEND_STAGE_CAN_SUSPEND)

    async def StopRun(self, request: agent_pb2.StopRunRequest, context: Any) -> agent_pb2.StopRunResponse:
        """Record the order and report the run exited."""
        self.stops.append(request)
        self.task_of.setdefault(request.run_id, request.task_id)
        self._spawn(self._exited(request.run_id))
        await self._notify()
        return agent_pb2.StopRunResponse()

    async def _exited(self, run_id: int) -> None:
        with contextlib.suppress(Exception):
            await self.report(run_id, pb.NODE_RUN_PHASE_EXITED)
            await self._notify()

    async def ReadLogs(
        self, request: agent_pb2.ReadLogsRequest, context: Any
    ) -> AsyncIterator[agent_pb2.ReadLogsResponse]:
        """The run's whole log (a line per start order) in one message."""
        data = self.logs.get(request.run_id, b"")
        yield agent_pb2.ReadLogsResponse(offset_bytes=0, data=data, end_of_log=True)


async def set_quota(root: SchedulerClient, user: str, level: int, nodes: int, group: str = "default") -> None:
    """Give ``user`` a quota of ``nodes`` nodes at ``level`` in ``group`` (``root``: an admin's client)."""
    await root.call(
        root.user.SetQuota,
        pb.SetQuotaRequest(quota=pb.Quota(user_name=user, priority=level, node_group=group, max_nodes=nodes)),
    )


def spec(num_nodes: int, level: int | None = None, **kw: Any) -> pb.TaskSpec:
    """A task spec of ``num_nodes`` nodes (name ``train``, ``python train.py`` unless ``kw`` says otherwise)."""
    s = pb.TaskSpec(
        name=kw.pop("name", "train"), argv=kw.pop("argv", ["python", "train.py"]), num_nodes=num_nodes, **kw
    )
    if level is not None:
        s.priority = level
    return s


async def task_of(client: SchedulerClient, task_id: int) -> pb.Task:
    """The task as the scheduler has it now, with its runs."""
    resp = await client.call(client.user.GetTask, pb.GetTaskRequest(task_id=task_id, include_runs=True))
    task: pb.Task = resp.task
    return task
