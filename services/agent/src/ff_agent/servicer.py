"""Thin gRPC adapter of AgentService: protobuf in, NodeRuns / Validator calls, protobuf out."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from typing import Any

import grpc

from ff_agent.app import Agent
from ff_agent.core.errors import Busy, InvalidRequest
from ff_agent.core.launch import StartOrder
from ff_agent.runs import Run
from ff_agent.validator import ALL_CHECKS
from fireflyer.agent.v1 import agent_pb2, agent_pb2_grpc
from fireflyer.scheduler.v1 import scheduler_pb2 as pb

# What grpc.aio hands each RPC; the request and response types are the RPC's own, hence Any here.
Context = grpc.aio.ServicerContext[Any, Any]
LOG_CHUNK_BYTES = 64 * 1024


def _order_from_proto(r: agent_pb2.StartRunRequest) -> StartOrder:
    return StartOrder(
        task_id=r.task_id,
        run_id=r.run_id,
        run_index=r.run_index,
        user_name=r.user_name,
        argv=tuple(r.argv),
        env=dict(r.env),
        working_dir=r.working_dir,
        node_rank=r.node_rank,
        num_nodes=r.num_nodes,
        master_ip=r.master_ip,
        master_port=r.master_port,
        ranks_per_node=r.ranks_per_node,
        device_indices=tuple(r.device_indices),
        whole_life_state=r.whole_life_state,
        token=r.token,
        priority=r.priority,
    )


class AgentServicer(agent_pb2_grpc.AgentServiceServicer):
    """AgentService over one ``Agent``; domain errors become status codes in ``ff_agent.errors``."""

    def __init__(self, agent: Agent) -> None:
        self._a = agent

    def _report(self, run: Run | None) -> pb.RunReport:
        return run.report(self._a.node_id) if run is not None else pb.RunReport()

    async def StartRun(self, request: agent_pb2.StartRunRequest, context: Context) -> agent_pb2.StartRunResponse:
        if request.image:
            raise InvalidRequest("image: this agent runs ranks directly (no container mode)")
        run = await self._a.start_run(_order_from_proto(request))
        await self._a.runs.mark_changed()
        return agent_pb2.StartRunResponse(run=self._report(run))

    async def SuspendRun(self, request: agent_pb2.SuspendRunRequest, context: Context) -> agent_pb2.SuspendRunResponse:
        if not all(math.isfinite(t) and t >= 0 for t in (request.ack_window_s, request.grace_s, request.term_grace_s)):
            raise InvalidRequest("ack_window_s, grace_s and term_grace_s must be finite and >= 0")
        run = self._a.runs.suspend(request.run_id, request.ack_window_s, request.grace_s, request.term_grace_s)
        await self._a.runs.mark_changed()
        raised = run.suspend is not None and run.suspend.flag_node
        return agent_pb2.SuspendRunResponse(flag_raised=raised, run=self._report(run))

    async def StopRun(self, request: agent_pb2.StopRunRequest, context: Context) -> agent_pb2.StopRunResponse:
        if not math.isfinite(request.term_grace_s) or request.term_grace_s < 0:
            raise InvalidRequest("term_grace_s must be finite and >= 0")
        if request.reason not in pb.RunEndReason.values():
            raise InvalidRequest(f"reason {request.reason} is not a known RunEndReason")
        reason = pb.RunEndReason.Name(request.reason) if request.reason else "stop order"
        run = self._a.runs.stop(request.run_id, request.term_grace_s, f"the scheduler ordered a stop ({reason})")
        await self._a.runs.mark_changed()
        return agent_pb2.StopRunResponse(run=self._report(run))

    async def WatchRuns(
        self, request: agent_pb2.WatchRunsRequest, context: Context
    ) -> AsyncIterator[agent_pb2.WatchRunsResponse]:
        sent: dict[int, tuple[Any, ...]] = {}
        runs = self._a.runs
        if request.run_id:
            runs.get(request.run_id)  # one run that is not here: NOT_FOUND now, not a watch that never ends
        while True:
            for run in list(runs.runs.values()):
                if request.run_id and run.order.run_id != request.run_id:
                    continue
                report = run.report(self._a.node_id)
                sig = (report.phase, report.suspend_stage, tuple((r.state, r.exit_code) for r in report.ranks))
                if sent.get(run.order.run_id) != sig:
                    sent[run.order.run_id] = sig
                    yield agent_pb2.WatchRunsResponse(run=report)
            async with runs.changed:
                await runs.changed.wait()

    async def ReadLogs(
        self, request: agent_pb2.ReadLogsRequest, context: Context
    ) -> AsyncIterator[agent_pb2.ReadLogsResponse]:
        run = self._a.runs.get(request.run_id)
        path = run.log_path(request.local_rank if request.HasField("local_rank") else None)
        offset = request.offset_bytes
        if request.tail_bytes:
            size = path.stat().st_size if path.exists() else 0
            offset = max(0, size - request.tail_bytes)
        while True:
            ended = run.exited  # read before the data: everything written before the end is then sent
            data = await asyncio.to_thread(_read, path, offset, LOG_CHUNK_BYTES)
            if data:
                last = ended and len(data) < LOG_CHUNK_BYTES
                yield agent_pb2.ReadLogsResponse(offset_bytes=offset, data=data, end_of_log=last)
                offset += len(data)
                if last:
                    return
                continue
            if ended or not request.follow:
                yield agent_pb2.ReadLogsResponse(offset_bytes=offset, end_of_log=ended)
                return
            await asyncio.sleep(self._a.settings.poll_interval_s)

    async def ValidateNode(
        self, request: agent_pb2.ValidateNodeRequest, context: Context
    ) -> agent_pb2.ValidateNodeResponse:
        if len(request.checks) > len(ALL_CHECKS) or len(set(request.checks)) != len(request.checks):
            raise InvalidRequest(f"checks: each of {list(ALL_CHECKS)} at most once")
        if self._a.runs.active and not request.force:
            raise Busy(f"{len(self._a.runs.active)} runs are active on this node (use force to validate anyway)")
        validation = await self._a.validate(list(request.checks))
        return agent_pb2.ValidateNodeResponse(validation=validation)

    async def GetCollectiveProgress(
        self, request: agent_pb2.GetCollectiveProgressRequest, context: Context
    ) -> agent_pb2.GetCollectiveProgressResponse:
        run = self._a.runs.get(request.run_id)
        sampled_at, ranks = await self._a.progress(run)
        mine = [r for r in ranks if r.node_rank == run.order.node_rank]
        return agent_pb2.GetCollectiveProgressResponse(
            sampled_at=sampled_at,
            ranks=[
                agent_pb2.RankProgress(
                    local_rank=r.local_rank,
                    group_rank=r.rank,
                    completed_seq=r.done,
                    current_seq=r.seq if r.seq > r.done else 0,
                    current_op=r.op if r.seq > r.done else "",
                    current_op_started_at=r.since if r.seq > r.done else 0.0,
                    last_progress_at=r.since,
                )
                for r in mine
            ],
        )


def _read(path: Any, offset: int, size: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(size)
    except FileNotFoundError:
        return b""
