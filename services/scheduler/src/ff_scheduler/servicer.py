"""Thin gRPC adapters: protobuf in, domain calls, protobuf out. Errors map in ff_scheduler.errors.

Users see and act on their own tasks only (another user's task answers NOT_FOUND); admins on any.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
from sqlalchemy.orm import Session

from ff_rpc import Principal, current_principal
from ff_scheduler import wire
from ff_scheduler.app import Scheduler
from ff_scheduler.checkpoints import ManifestCheck
from ff_scheduler.core import validation
from ff_scheduler.core.errors import Forbidden, InvalidRequest, NotFoundError
from ff_scheduler.core.model import EndReason, NodeState, SuspendStage, TaskState
from ff_scheduler.core.validation import Limits
from ff_scheduler.store import ops
from fireflyer.agent.v1 import agent_pb2
from fireflyer.scheduler.v1 import scheduler_pb2 as pb
from fireflyer.scheduler.v1 import scheduler_pb2_grpc

# What grpc.aio hands each RPC; the request and response types are the RPC's own, hence Any here.
Context = grpc.aio.ServicerContext[Any, Any]
MAX_PAGE = 1000
DEFAULT_PAGE = 100


def _owner(caller: Principal) -> str | None:
    """Whose tasks the caller may touch: their own, or anyone's (None) for admins."""
    return None if caller.is_admin else caller.name


def _task_id(value: int) -> int:
    return validation.existing_id("task_id", value)


def _run_ids(task_id: int, run_id: int) -> None:
    """The run an agent reports on: ids SQL can hold (NOT_FOUND past 2^63-1)."""
    validation.existing_id("task_id", task_id)
    validation.existing_id("run_id", run_id)


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServiceServicer):
    """SchedulerService (users and admins) over the ``Scheduler`` driver and its store."""

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
            """The task as of the submit's own transaction: a new one is queued; a retry answers it as it is now.

            The scheduling pass woken below may start a new task at once, and the answer does not depend on how
            far it got; a retry with the same request_id answers the task as it is now.
            """
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
            before = int(request.page_token[:32]) if request.page_token else 0
        except ValueError:
            before = -1
        if not 0 <= before <= validation.MAX_ROW_ID or len(request.page_token) > 32:
            raise InvalidRequest("page_token is not one this service issued")
        validation.check_length("name_contains", request.name_contains, validation.MAX_NAME_CHARS)
        states = validation.check_enum_values("states", request.states, TaskState)
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
        if request.run_id > validation.MAX_ROW_ID:
            raise NotFoundError(f"run {request.run_id} does not exist")
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
        states = validation.check_enum_values("states", request.states, NodeState)
        if request.node_group:
            validation.check_group_name(request.node_group)
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
        validation.check_length("user_name", request.user_name, validation.MAX_NAME_CHARS)
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
        validation.check_count("node_ids", len(request.node_ids), validation.MAX_NODES)
        validation.check_count("checks", len(request.checks), validation.MAX_CHECKS)
        if any(len(c) > validation.MAX_CHECK_CHARS for c in request.checks):
            raise InvalidRequest(f"checks: names of at most {validation.MAX_CHECK_CHARS} characters")
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

    def __init__(
        self, scheduler: Scheduler, default_group: str, report_interval_s: float, checkpoints: ManifestCheck | None
    ) -> None:
        self._s = scheduler
        self._default_group = default_group
        self._report_interval_s = report_interval_s
        self._checkpoints = checkpoints  # None: checkpoints are taken as reported (no 3FS to ask)

    async def RegisterNode(self, request: pb.RegisterNodeRequest, context: Context) -> pb.RegisterNodeResponse:
        if request.node_id <= 0:
            raise InvalidRequest("node_id is required (register with mgmtd first)")
        if not request.agent_address or not request.hostname:
            raise InvalidRequest("hostname and agent_address are required")
        for name, text in (
            ("hostname", request.hostname),
            ("agent_address", request.agent_address),
            ("master_ip", request.master_ip),
            ("zone", request.zone),
        ):
            validation.check_length(name, text, validation.MAX_HOST_CHARS)
        validation.check_count("devices", len(request.devices), validation.MAX_DEVICES)
        validation.check_count("runs", len(request.runs), validation.MAX_REPORTED_RUNS)
        if len({d.index for d in request.devices}) != len(request.devices):
            raise InvalidRequest("devices: a device index may appear once")
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
        validation.check_count("runs", len(request.runs), validation.MAX_REPORTED_RUNS)
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
        at = validation.check_seconds("reported_at", request.reported_at) or self._s.now()
        _run_ids(request.task_id, request.run_id)
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
        validation.check_length("checkpoint.path", c.path, validation.MAX_PATH_CHARS)
        committed_at = validation.check_seconds("checkpoint.committed_at", c.committed_at) or self._s.now()
        taken_at = validation.check_seconds("checkpoint.taken_at", c.taken_at)
        _run_ids(request.task_id, request.run_id)
        if self._checkpoints is not None:
            uid = await self._s.store.arun(
                lambda s: ops.task_uid_of_run(s, request.node_id, request.task_id, request.run_id), read_only=True
            )
            await self._checkpoints.check(c.path, uid)
        data = {"path": c.path, "step": c.step, "committed_at": committed_at, "taken_at": taken_at}
        await self._s.store.arun(
            lambda s: ops.report_checkpoint(s, request.node_id, request.task_id, request.run_id, data)
        )
        self._s.wake()
        return pb.ReportCheckpointResponse()

    async def UpdateRun(self, request: pb.UpdateRunRequest, context: Context) -> pb.UpdateRunResponse:
        wls = request.whole_life_state if request.HasField("whole_life_state") else None
        watchdog = request.watchdog_time_s if request.HasField("watchdog_time_s") else None
        if watchdog is not None:
            validation.check_seconds("watchdog_time_s", watchdog)
        _run_ids(request.task_id, request.run_id)
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
