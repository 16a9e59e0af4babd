"""The agent's calls to the scheduler (SchedulerAgentService, with the cluster token).

The scheduler is found through mgmtd's routing info unless its address is configured; calls are retried by
RpcClient when the proto marks them idempotent, and the callers retry the rest on their next pass.
"""

from __future__ import annotations

import logging
import time

from ff_cluster import MgmtdClient
from ff_rpc import RpcClient, RpcError, ServiceError, Unavailable
from ff_rpc.client import ClientPool
from fireflyer.common.v1 import common_pb2
from fireflyer.scheduler.v1 import scheduler_pb2 as pb
from fireflyer.scheduler.v1.scheduler_client import SchedulerAgentServiceClient

logger = logging.getLogger(__name__)

# What a failed call to the scheduler raises (a status from it, or no address to call yet).
LINK_ERRORS = (RpcError, ServiceError)


class SchedulerLink:
    """A client of the scheduler's SchedulerAgentService, speaking for node ``node_id``.

    Every call raises one of ``LINK_ERRORS`` when it fails (``Unavailable`` while no scheduler is known); each has
    the deadline ``timeout_s``.
    """

    def __init__(self, cluster_token: str, mgmtd: MgmtdClient, fixed_address: str, timeout_s: float) -> None:
        self._rpc = RpcClient(token=cluster_token, timeout_s=timeout_s)
        self._clients = ClientPool(SchedulerAgentServiceClient, self._rpc)
        self._mgmtd = mgmtd
        self._fixed = fixed_address
        self.address = fixed_address
        self.node_id = 0

    async def resolve(self) -> str:
        """The scheduler's address (configured, else the first alive scheduler mgmtd knows)."""
        if self._fixed:
            return self._fixed
        address = await self._mgmtd.service_address(common_pb2.NODE_TYPE_SCHEDULER)
        if not address:
            raise Unavailable("no alive scheduler in mgmtd's routing info")
        self.address = address
        return address

    def _client(self) -> SchedulerAgentServiceClient:
        if not self.address:
            raise Unavailable("the scheduler's address is not known yet")
        return self._clients.get(self.address)

    async def register(self, request: pb.RegisterNodeRequest) -> pb.RegisterNodeResponse:
        """Register (or register again) this node, finding the scheduler first; the answer names runs to stop."""
        await self.resolve()
        return await self._client().register_node(request)

    async def report_runs(self, reports: list[pb.RunReport]) -> pb.ReportRunStatusResponse:
        """Send the state of the given runs; the answer names runs the scheduler no longer has on this node."""
        return await self._client().report_run_status(pb.ReportRunStatusRequest(node_id=self.node_id, runs=reports))

    async def suspend_stage(self, task_id: int, run_id: int, stage: int, at: float) -> None:
        """Tell the scheduler a run reached suspend ``stage`` (a ``SuspendStage`` value) at ``at`` (epoch s)."""
        await self._client().report_suspend_stage(
            pb.ReportSuspendStageRequest(
                node_id=self.node_id,
                task_id=task_id,
                run_id=run_id,
                stage=pb.SuspendStage.ValueType(stage),
                reported_at=at,
            ),
        )

    async def update_run(
        self, task_id: int, run_id: int, *, whole_life_state: int | None = None, watchdog_time_s: float | None = None
    ) -> None:
        """Pass on what the task changed through the SDK: its whole-life state, its watchdog time (None: unchanged)."""
        request = pb.UpdateRunRequest(node_id=self.node_id, task_id=task_id, run_id=run_id)
        if whole_life_state is not None:
            request.whole_life_state = whole_life_state
        if watchdog_time_s is not None:
            request.watchdog_time_s = watchdog_time_s
        await self._client().update_run(request)

    async def report_checkpoint(self, task_id: int, run_id: int, path: str, step: int, taken_at: float) -> None:
        """Record a checkpoint the task committed (``taken_at``: when it was taken, epoch seconds)."""
        await self._client().report_checkpoint(
            pb.ReportCheckpointRequest(
                node_id=self.node_id,
                task_id=task_id,
                run_id=run_id,
                checkpoint=pb.Checkpoint(path=path, step=step, committed_at=time.time(), taken_at=taken_at),
            ),
        )

    async def report_health(self, validation: pb.Validation) -> pb.ReportNodeHealthResponse:
        """Send the validator's verdict on this node (the scheduler stops placing on a node that failed)."""
        return await self._client().report_node_health(
            pb.ReportNodeHealthRequest(node_id=self.node_id, validation=validation)
        )

    async def close(self) -> None:
        """Close the channels to the scheduler."""
        await self._clients.close()
