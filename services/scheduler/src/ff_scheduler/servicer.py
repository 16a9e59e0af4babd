"""Thin gRPC adapters: protobuf in, domain calls, protobuf out. Errors map in ff_scheduler.errors.

Users see and act on their own tasks only (another user's task answers NOT_FOUND); admins on any.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from sqlalchemy.orm import Session

from ff_rpc import Principal, current_principal
from ff_scheduler import wire
from ff_scheduler.app import Scheduler
from ff_scheduler.core import validation
from ff_scheduler.core.errors import Forbidden, InvalidRequest
from ff_scheduler.core.model import EndReason, SuspendStage
from ff_scheduler.core.validation import Limits
from ff_scheduler.store import ops
from fireflyer.agent.v1 import agent_pb2
from fireflyer.scheduler.v1 import scheduler_pb2 as pb
from fireflyer.scheduler.v1 import scheduler_pb2_grpc

Context = Any
MAX_PAGE = 1000
DEFAULT_PAGE = 100


def _owner(caller: Principal) -> str | None:
    """Whose tasks the caller may touch: their own, or anyone's (None) for admins."""
    return None if caller.is_admin else caller.name


def _task_id(value: int) -> int:
    if value <= 0:
        raise InvalidRequest("task_id is required")
    return value


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServiceServicer):
    def __init__(self, scheduler: Scheduler, limits: Limits) -> None:
        self._s = scheduler
        self._limits = limits

    async def _task(self, task_id: int, include_runs: bool = False) -> pb.Task:
        owner = _owner(current_principal())
        view = await self._s.store.arun(lambda s: ops.get_task(s, task_id, owner, include_runs), read_only=True)
        return wire.task_to_proto(view)

    async def SubmitTask(self, request: pb.SubmitTaskRequest, context: Context) -> pb.SubmitTaskResponse:
        caller = current_principal()
        if caller.is_cluster:
            raise InvalidRequest("tasks are submitted with a user's token, not the cluster token")
        if not request.HasField("spec"):
            raise InvalidRequest("spec is required")
        if len(request.request_id) > 128:
            raise InvalidRequest("request_id: at most 128 characters")
        checked = validation.check_task(wire.task_request(request.spec), self._limits)
        now = self._s.now()

        def submit(s: Session) -> ops.TaskView:
            """The task as of the submit's own transaction: a new one is queued (the scheduling pass woken
            below may start it at once, and the answer does not depend on how far it got); a retry with the
            same request_id answers the task as it is now."""
            task_id = ops.submit_task(
                s, caller.name, caller.uid, checked, request.request_id, now, self._limits.default_group
            )
            return ops.get_task(s, task_id, caller.name)

        accepted = await self._s.store.arun(submit)
        self._s.wake()
        return pb.SubmitTaskResponse(task=wire.task_to_proto(accepted))

    async def ListTasks(self, request: pb.ListTasksRequest, context: Context) -> pb.ListTasksResponse:
        caller = current_principal()
        owner: str | None = caller.name
        if request.all_users or (request.user_name and request.user_name != caller.name):
            if not caller.is_admin:
                raise Forbidden("only admins list other users' tasks")
            owner = request.user_name or None
        size = request.page_size or DEFAULT_PAGE
        if size > MAX_PAGE:
            raise InvalidRequest(f"page_size: at most {MAX_PAGE}")
        try:
            before = int(request.page_token) if request.page_token else 0
        except ValueError:
            raise InvalidRequest("page_token is not one this service issued") from None
        states = [int(s) for s in request.states]
        views = await self._s.store.arun(
            lambda s: ops.list_tasks(s, owner, states, request.name_contains, size, before), read_only=True
        )
        token = str(views[-1].task.task_id) if len(views) == size else ""
        return pb.ListTasksResponse(tasks=[wire.task_to_proto(v) for v in views], next_page_token=token)

    async def GetTask(self, request: pb.GetTaskRequest, context: Context) -> pb.GetTaskResponse:
        return pb.GetTaskResponse(task=await self._task(_task_id(request.task_id), request.include_runs))

    async def StopTask(self, request: pb.StopTaskRequest, context: Context) -> pb.StopTaskResponse:
        task_id, caller = _task_id(request.task_id), current_principal()
        owner, now = _owner(caller), self._s.now()
        await self._s.store.arun(lambda s: ops.stop_task(s, task_id, owner, caller.name, now))
        self._s.wake()
        return pb.StopTaskResponse(task=await self._task(task_id))

    async def SuspendTask(self, request: pb.SuspendTaskRequest, context: Context) -> pb.SuspendTaskResponse:
        task_id, owner = _task_id(request.task_id), _owner(current_principal())
        now = self._s.now()
        await self._s.store.arun(
            lambda s: ops.suspend_task(s, task_id, owner, EndReason.SUSPENDED_BY_USER, self._s.life, now)
        )
        self._s.wake()
        return pb.SuspendTaskResponse(task=await self._task(task_id))

    async def SetTaskPriority(self, request: pb.SetTaskPriorityRequest, context: Context) -> pb.SetTaskPriorityResponse:
        task_id, owner = _task_id(request.task_id), _owner(current_principal())
        if not request.HasField("priority") and not request.auto_priority:
            raise InvalidRequest("give a priority or auto_priority")
        level = request.priority if request.HasField("priority") else None
        asked = validation.check_priority_choice(level, request.auto_priority, self._limits.default_priority)
        await self._s.store.arun(lambda s: ops.set_task_priority(s, task_id, owner, asked))
        self._s.wake()
        return pb.SetTaskPriorityResponse(task=await self._task(task_id))

    async def StreamLogs(self, request: pb.StreamLogsRequest, context: Context) -> AsyncIterator[pb.StreamLogsResponse]:
        task_id, owner = _task_id(request.task_id), _owner(current_principal())
        run, node = await self._s.store.arun(
            lambda s: ops.run_location(s, task_id, owner, request.run_id, request.node_rank), read_only=True
        )
        agent_request = agent_pb2.ReadLogsRequest(
            task_id=task_id,
            run_id=run.run_id,
            offset_bytes=request.offset_bytes,
            tail_bytes=request.tail_bytes,
            follow=request.follow,
        )
        if request.HasField("local_rank"):
            agent_request.local_rank = request.local_rank
        async for chunk in self._s.agents.read_logs(node.agent_address, agent_request):
            yield pb.StreamLogsResponse(
                run_id=run.run_id, offset_bytes=chunk.offset_bytes, data=chunk.data, end_of_log=chunk.end_of_log
            )

    async def WhoAmI(self, request: pb.WhoAmIRequest, context: Context) -> pb.WhoAmIResponse:
        caller = current_principal()

        def read(s: Any) -> tuple[list[tuple[Any, int]], tuple[int, int]]:
            return ops.list_quotas(s, caller.name), ops.counts(s, caller.name)

        quotas, (num_running, num_queued) = await self._s.store.arun(read, read_only=True)
        return pb.WhoAmIResponse(
            principal=caller.to_proto(),
            quotas=[wire.quota_to_proto(r, u) for r, u in quotas],
            num_running_tasks=num_running,
            num_queued_tasks=num_queued,
        )

    async def ListNodes(self, request: pb.ListNodesRequest, context: Context) -> pb.ListNodesResponse:
        states = [int(x) for x in request.states]
        rows = await self._s.store.arun(lambda s: ops.list_nodes(s, request.node_group, states), read_only=True)
        return pb.ListNodesResponse(nodes=[wire.node_to_proto(r, ids) for r, ids in rows])

    async def SetQuota(self, request: pb.SetQuotaRequest, context: Context) -> pb.SetQuotaResponse:
        q = request.quota
        validation.check_quota(q.user_name, q.priority, q.node_group, q.max_nodes)
        await self._s.store.arun(lambda s: ops.set_quota(s, q.user_name, q.priority, q.node_group, q.max_nodes))
        self._s.wake()
        return pb.SetQuotaResponse(
            quota=pb.Quota(user_name=q.user_name, priority=q.priority, node_group=q.node_group, max_nodes=q.max_nodes)
        )

    async def ListQuotas(self, request: pb.ListQuotasRequest, context: Context) -> pb.ListQuotasResponse:
        rows = await self._s.store.arun(lambda s: ops.list_quotas(s, request.user_name or None), read_only=True)
        return pb.ListQuotasResponse(quotas=[wire.quota_to_proto(r, u) for r, u in rows])

    async def SetNodeEnabled(self, request: pb.SetNodeEnabledRequest, context: Context) -> pb.SetNodeEnabledResponse:
        if request.node_id <= 0:
            raise InvalidRequest("node_id is required")
        if len(request.reason) > 256:
            raise InvalidRequest("reason: at most 256 characters")
        caller, now = current_principal(), self._s.now()
        reason = request.reason or f"manually disabled by {caller.name}"
        await self._s.store.arun(
            lambda s: ops.set_node_enabled(s, request.node_id, request.enabled, reason, self._s.life, now)
        )
        self._s.wake()
        row, ids = await self._s.store.arun(lambda s: ops.get_node(s, request.node_id), read_only=True)
        return pb.SetNodeEnabledResponse(node=wire.node_to_proto(row, ids))

    async def ValidateNodes(self, request: pb.ValidateNodesRequest, context: Context) -> pb.ValidateNodesResponse:
        rows = await self._s.store.arun(lambda s: ops.list_nodes(s, "", []), read_only=True)
        wanted = set(request.node_ids)
        unknown = wanted - {r.node_id for r, _ in rows}
        if unknown:
            raise InvalidRequest(f"unknown nodes: {sorted(unknown)}")
        idle = [r for r, ids in rows if (not wanted or r.node_id in wanted) and not ids and r.online]
        for row in idle:
            asyncio.create_task(self._validate(row, list(request.checks)))  # noqa: RUF006 (results come back by report)
        return pb.ValidateNodesResponse(node_ids=[r.node_id for r in idle])

    async def _validate(self, row: Any, checks: list[str]) -> None:
        try:
            resp = await self._s.agents.validate(row.agent_address, agent_pb2.ValidateNodeRequest(checks=checks))
        except Exception:  # the agent reports the result itself too; a failed call changes nothing
            return
        data = wire.validation_to_json(resp.validation)
        await self._s.store.arun(lambda s: ops.report_node_health(s, row.node_id, data))


class SchedulerAgentServicer(scheduler_pb2_grpc.SchedulerAgentServiceServicer):
    """What agents call (cluster token): registration and facts; decisions happen in the tick."""

    def __init__(self, scheduler: Scheduler, default_group: str, report_interval_s: float) -> None:
        self._s = scheduler
        self._default_group = default_group
        self._report_interval_s = report_interval_s

    async def RegisterNode(self, request: pb.RegisterNodeRequest, context: Context) -> pb.RegisterNodeResponse:
        if request.node_id <= 0:
            raise InvalidRequest("node_id is required (register with mgmtd first)")
        if not request.agent_address or not request.hostname:
            raise InvalidRequest("hostname and agent_address are required")
        group = validation.check_group_name(request.node_group or self._default_group)
        values = {
            "node_id": request.node_id,
            "hostname": request.hostname,
            "agent_address": request.agent_address,
            "master_ip": request.master_ip or request.agent_address.rsplit(":", 1)[0],
            "node_group": group,
            "zone": request.zone,
            "devices": [wire.device_to_json(d) for d in request.devices],
            "num_cpus": request.num_cpus,
            "memory_bytes": request.memory_bytes,
        }
        reported = [(r.task_id, r.run_id) for r in request.runs]
        now = self._s.now()
        unwanted = await self._s.store.arun(lambda s: ops.register_node(s, values, reported, now))
        self._s.wake()
        row, ids = await self._s.store.arun(lambda s: ops.get_node(s, request.node_id), read_only=True)
        return pb.RegisterNodeResponse(
            node=wire.node_to_proto(row, ids),
            report_interval_s=self._report_interval_s,
            runs_to_stop=[pb.RunKey(task_id=t, run_id=r) for t, r in unwanted],
        )

    async def ReportRunStatus(self, request: pb.ReportRunStatusRequest, context: Context) -> pb.ReportRunStatusResponse:
        facts = [wire.run_facts(r) for r in request.runs]
        now = self._s.now()
        await self._s.store.arun(lambda s: ops.get_node(s, request.node_id), read_only=True)
        unwanted = await self._s.store.arun(lambda s: ops.report_runs(s, request.node_id, facts, now))
        self._s.wake()
        return pb.ReportRunStatusResponse(runs_to_stop=[pb.RunKey(task_id=t, run_id=r) for t, r in unwanted])

    async def ReportSuspendStage(
        self, request: pb.ReportSuspendStageRequest, context: Context
    ) -> pb.ReportSuspendStageResponse:
        if request.stage not in (pb.SUSPEND_STAGE_RECEIVED, pb.SUSPEND_STAGE_CAN_SUSPEND):
            raise InvalidRequest("stage must be RECEIVED or CAN_SUSPEND")
        at = request.reported_at or self._s.now()
        await self._s.store.arun(
            lambda s: ops.report_suspend_stage(
                s, request.node_id, request.task_id, request.run_id, SuspendStage(request.stage), at, self._s.life
            )
        )
        self._s.wake()
        return pb.ReportSuspendStageResponse()

    async def ReportCheckpoint(
        self, request: pb.ReportCheckpointRequest, context: Context
    ) -> pb.ReportCheckpointResponse:
        c = request.checkpoint
        data = {"path": c.path[:1024], "step": c.step, "committed_at": c.committed_at or self._s.now()}
        await self._s.store.arun(
            lambda s: ops.report_checkpoint(s, request.node_id, request.task_id, request.run_id, data)
        )
        self._s.wake()
        return pb.ReportCheckpointResponse()

    async def UpdateRun(self, request: pb.UpdateRunRequest, context: Context) -> pb.UpdateRunResponse:
        wls = request.whole_life_state if request.HasField("whole_life_state") else None
        watchdog = request.watchdog_time_s if request.HasField("watchdog_time_s") else None
        if watchdog is not None and watchdog < 0:
            raise InvalidRequest("watchdog_time_s must be >= 0")
        await self._s.store.arun(
            lambda s: ops.update_run(s, request.node_id, request.task_id, request.run_id, wls, watchdog)
        )
        return pb.UpdateRunResponse()

    async def ReportNodeHealth(
        self, request: pb.ReportNodeHealthRequest, context: Context
    ) -> pb.ReportNodeHealthResponse:
        data = wire.validation_to_json(request.validation)
        await self._s.store.arun(lambda s: ops.report_node_health(s, request.node_id, data))
        self._s.wake()
        row, ids = await self._s.store.arun(lambda s: ops.get_node(s, request.node_id), read_only=True)
        return pb.ReportNodeHealthResponse(node=wire.node_to_proto(row, ids))
