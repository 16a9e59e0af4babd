"""Hostile input against a real scheduler process: every RPC with boundary and oversized values (2^64-1
ids, out-of-range and NaN numbers, huge strings, huge repeated fields and maps, repeated entries,
malformed bytes), each answered with its intended status within the time and memory bounds, and the
scheduler still serving after each."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message

from ff_rpc import RpcClient, open_channel
from ff_testing.hostile import MALFORMED_MESSAGES, Hostile, check_hostile
from ff_testing.mgmtd import CLUSTER_TOKEN, running_with_users
from ff_testing.scheduler import SchedulerProcess, spawn_process
from fireflyer.scheduler.v1 import scheduler_pb2 as pb
from fireflyer.scheduler.v1 import scheduler_pb2_grpc

C = grpc.StatusCode
S, A = "/fireflyer.scheduler.v1.SchedulerService/", "/fireflyer.scheduler.v1.SchedulerAgentService/"
U64, U32, I32 = 2**64 - 1, 2**32 - 1, 2**31 - 1
HUGE = "x" * (1 << 20)  # 1 MiB: under the 4 MiB request limit, far over any field's
MANY = 50_000
NAN, INF = float("nan"), float("inf")
ALICE, ROOT = "alice", "root"  # replaced by their tokens


def _case(
    what: str, method: str, request: Message | bytes, code: grpc.StatusCode, token: str = ALICE, **kw: Any
) -> Hostile:
    data = request if isinstance(request, bytes) else request.SerializeToString()
    return Hostile(what, method, data, code, token, **kw)


def _submit(**spec: Any) -> pb.SubmitTaskRequest:
    return pb.SubmitTaskRequest(spec=pb.TaskSpec(**{"argv": ["python", "t.py"], "num_nodes": 1, **spec}))


def _spec(what: str, code: grpc.StatusCode = C.INVALID_ARGUMENT, **spec: Any) -> Hostile:
    return _case(f"submit: {what}", S + "SubmitTask", _submit(**spec), code)


CASES = [
    *[_case(f"malformed bytes {i} to {m}", p + m, bad, C.INVALID_ARGUMENT, token)
      for i, bad in enumerate(MALFORMED_MESSAGES)
      for p, m, token in ((S, "SubmitTask", ALICE), (S, "ListTasks", ALICE), (A, "RegisterNode", CLUSTER_TOKEN))],
    _case("a request over 4 MiB", S + "SubmitTask", _submit(name="y" * (5 << 20)), C.RESOURCE_EXHAUSTED),
    # submit
    _spec("2^32-1 nodes", num_nodes=U32),
    _spec("priority 2^31-1", priority=I32),
    _spec("priority -2^31", priority=-(2**31)),
    _spec("NaN watchdog", watchdog_time_s=NAN),
    _spec("infinite watchdog", watchdog_time_s=INF),
    _spec("NaN suspend grace", suspend_grace_s=NAN),
    _spec("negative suspend grace", suspend_grace_s=-1.0),
    _spec("2^32-1 restarts", max_restarts=U32),
    _spec("2^32-1 ranks per node", ranks_per_node=U32),
    _spec("100,000 arguments", argv=["ab"] * 2 * MANY),
    _spec("1 MiB argument", argv=["python", HUGE]),
    _spec("50,000 variables", env={f"V{i}": "1" for i in range(MANY)}),
    _spec("50,000 tags", tags={f"t{i}": "1" for i in range(MANY)}),
    _spec("1 MiB tag", tags={"t": HUGE}),
    _spec("1 MiB name", name=HUGE),
    _spec("1 MiB working folder", working_dir="/" + HUGE),
    _spec("1 MiB image name", image=HUGE),
    _spec("1 MiB node group", node_group=HUGE),
    _case("submit: 1 MiB request id", S + "SubmitTask", pb.SubmitTaskRequest(spec=_submit().spec, request_id=HUGE),
          C.INVALID_ARGUMENT),
    # reading and acting on tasks
    _case("list: page size 2^32-1", S + "ListTasks", pb.ListTasksRequest(page_size=U32), C.INVALID_ARGUMENT),
    _case("list: page token past 2^63", S + "ListTasks", pb.ListTasksRequest(page_token=str(U64)),
          C.INVALID_ARGUMENT),
    _case("list: 1 MiB page token", S + "ListTasks", pb.ListTasksRequest(page_token=HUGE), C.INVALID_ARGUMENT),
    _case("list: state 2^31-1", S + "ListTasks", pb.ListTasksRequest(states=[I32]), C.INVALID_ARGUMENT),
    _case("list: 50,000 states", S + "ListTasks", pb.ListTasksRequest(states=[1] * MANY), C.INVALID_ARGUMENT),
    _case("list: 1 MiB name filter", S + "ListTasks", pb.ListTasksRequest(name_contains=HUGE), C.INVALID_ARGUMENT),
    _case("get task 2^64-1", S + "GetTask", pb.GetTaskRequest(task_id=U64), C.NOT_FOUND),
    _case("get task 2^63", S + "GetTask", pb.GetTaskRequest(task_id=2**63), C.NOT_FOUND),
    _case("stop task 2^64-1", S + "StopTask", pb.StopTaskRequest(task_id=U64), C.NOT_FOUND),
    _case("suspend task 2^64-1", S + "SuspendTask", pb.SuspendTaskRequest(task_id=U64), C.NOT_FOUND),
    _case("priority of task 2^64-1", S + "SetTaskPriority", pb.SetTaskPriorityRequest(task_id=U64, priority=10),
          C.NOT_FOUND),
    _case("priority 2^31-1", S + "SetTaskPriority", pb.SetTaskPriorityRequest(task_id=1, priority=I32),
          C.INVALID_ARGUMENT),
    _case("logs of task 2^64-1, run 2^64-1, offset 2^64-1", S + "StreamLogs",
          pb.StreamLogsRequest(task_id=U64, run_id=U64, offset_bytes=U64, tail_bytes=U64), C.NOT_FOUND,
          response_stream=True),
    _case("nodes: 1 MiB group", S + "ListNodes", pb.ListNodesRequest(node_group=HUGE), C.INVALID_ARGUMENT),
    _case("nodes: state 2^31-1", S + "ListNodes", pb.ListNodesRequest(states=[I32]), C.INVALID_ARGUMENT),
    # admin
    _case("quota of 2^32-1 nodes", S + "SetQuota",
          pb.SetQuotaRequest(quota=pb.Quota(user_name="alice", priority=10, node_group="default", max_nodes=U32)),
          C.INVALID_ARGUMENT, ROOT),
    _case("quota of a user named 1 MiB", S + "SetQuota",
          pb.SetQuotaRequest(quota=pb.Quota(user_name=HUGE, priority=10, node_group="default", max_nodes=1)),
          C.INVALID_ARGUMENT, ROOT),
    _case("quotas of a user named 1 MiB", S + "ListQuotas", pb.ListQuotasRequest(user_name=HUGE),
          C.INVALID_ARGUMENT, ROOT),
    _case("enable node 2^32-1", S + "SetNodeEnabled", pb.SetNodeEnabledRequest(node_id=U32, enabled=True),
          C.NOT_FOUND, ROOT),
    _case("disable with a 1 MiB reason", S + "SetNodeEnabled", pb.SetNodeEnabledRequest(node_id=1, reason=HUGE),
          C.INVALID_ARGUMENT, ROOT),
    _case("validate 500,000 nodes", S + "ValidateNodes", pb.ValidateNodesRequest(node_ids=range(1, 500_001)),
          C.INVALID_ARGUMENT, ROOT),
    _case("validate with 50,000 checks", S + "ValidateNodes", pb.ValidateNodesRequest(checks=["gemm"] * MANY),
          C.INVALID_ARGUMENT, ROOT),
    # agents
    _case("register node 2^32-1 with a 1 MiB hostname", A + "RegisterNode",
          pb.RegisterNodeRequest(node_id=U32, hostname=HUGE, agent_address="127.0.0.1:1"), C.INVALID_ARGUMENT,
          CLUSTER_TOKEN),
    _case("register a node with 50,000 devices", A + "RegisterNode",
          pb.RegisterNodeRequest(node_id=77, hostname="h", agent_address="127.0.0.1:1",
                                 devices=[pb.Device(index=i) for i in range(MANY)]), C.INVALID_ARGUMENT,
          CLUSTER_TOKEN),
    _case("register a node with a device twice", A + "RegisterNode",
          pb.RegisterNodeRequest(node_id=77, hostname="h", agent_address="127.0.0.1:1",
                                 devices=[pb.Device(index=0), pb.Device(index=0)]), C.INVALID_ARGUMENT,
          CLUSTER_TOKEN),
    _case("register a node reporting 50,000 runs", A + "RegisterNode",
          pb.RegisterNodeRequest(node_id=77, hostname="h", agent_address="127.0.0.1:1",
                                 runs=[pb.RunReport(task_id=i + 1, run_id=i + 1) for i in range(MANY)]),
          C.INVALID_ARGUMENT, CLUSTER_TOKEN),
    _case("report 50,000 runs of an unknown node", A + "ReportRunStatus",
          pb.ReportRunStatusRequest(node_id=U32, runs=[pb.RunReport(task_id=U64, run_id=U64)] * MANY),
          C.INVALID_ARGUMENT, CLUSTER_TOKEN),
    _case("suspend stage of run 2^64-1", A + "ReportSuspendStage",
          pb.ReportSuspendStageRequest(node_id=U32, task_id=U64, run_id=U64, stage=pb.SUSPEND_STAGE_RECEIVED,
                                       reported_at=NAN), C.INVALID_ARGUMENT, CLUSTER_TOKEN),
    _case("checkpoint with a 1 MiB path", A + "ReportCheckpoint",
          pb.ReportCheckpointRequest(node_id=1, task_id=1, run_id=1, checkpoint=pb.Checkpoint(path=HUGE)),
          C.INVALID_ARGUMENT, CLUSTER_TOKEN),
    _case("update run 2^64-1 with a NaN watchdog", A + "UpdateRun",
          pb.UpdateRunRequest(node_id=1, task_id=U64, run_id=U64, watchdog_time_s=NAN), C.INVALID_ARGUMENT,
          CLUSTER_TOKEN),
    _case("health of node 2^32-1", A + "ReportNodeHealth", pb.ReportNodeHealthRequest(node_id=U32), C.NOT_FOUND,
          CLUSTER_TOKEN),
]  # fmt: skip


@pytest.fixture
async def served(sqlite_url: str, tmp_path: Path) -> AsyncIterator[tuple[SchedulerProcess, dict[str, str]]]:
    async with running_with_users(tmp_path, sqlite_url) as (mgmtd, tokens):
        scheduler = await spawn_process(tmp_path, sqlite_url, mgmtd.address, CLUSTER_TOKEN).ready()
        try:
            yield scheduler, tokens
        finally:
            scheduler.proc.send_signal(signal.SIGTERM)
            scheduler.proc.wait(timeout=20)


async def test_hostile_input_gets_its_status_within_bounds_and_the_scheduler_keeps_serving(served: Any) -> None:
    scheduler, tokens = served
    channel = open_channel(scheduler.address)
    user = scheduler_pb2_grpc.SchedulerServiceStub(channel)
    rpc = RpcClient(token=tokens[ALICE], timeout_s=5.0)

    async def still_serving() -> None:
        await rpc.unary(user.WhoAmI, pb.WhoAmIRequest())

    problems: list[str] = []
    try:
        for case in CASES:
            hostile = replace(case, token=tokens.get(case.token, case.token))
            problems += await check_hostile(channel, scheduler.proc.pid, hostile, still_serving)
        listed = await rpc.unary(user.ListTasks, pb.ListTasksRequest(all_users=False))
    finally:
        await channel.close()
    assert not problems, "\n".join(problems)
    assert not listed.tasks  # no hostile submission was taken
