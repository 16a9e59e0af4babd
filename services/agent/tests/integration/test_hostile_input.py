"""Hostile input against a real agent process: every RPC with boundary and oversized values (2^64-1 ids,
NaN and infinite durations, unknown enums, huge strings, huge repeated fields and maps, repeated entries,
malformed bytes), each answered with its intended status within the time and memory bounds, nothing
launched, and the agent still serving after each."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ff_rpc import open_channel
from ff_testing.agent import AgentProcess, spawn_process
from ff_testing.hostile import MALFORMED_MESSAGES, Hostile, check_hostile
from ff_testing.mgmtd import CLUSTER_TOKEN, running_with_users
from fireflyer.agent.v1 import agent_pb2 as pb

C = grpc.StatusCode
A = "/fireflyer.agent.v1.AgentService/"
U64, U32, I32 = 2**64 - 1, 2**32 - 1, 2**31 - 1
HUGE = "x" * (1 << 20)  # 1 MiB: under the 4 MiB request limit, far over any field's
MANY = 50_000
NAN, INF = float("nan"), float("inf")
ALICE = "<alice>"  # replaced by a real token of alice (the run token a scheduler would send)


def _case(
    what: str, method: str, request: Message | bytes, code: grpc.StatusCode, token: str = CLUSTER_TOKEN, **kw: Any
) -> Hostile:
    data = request if isinstance(request, bytes) else request.SerializeToString()
    return Hostile(what, A + method, data, code, token, **kw)


_run_ids = iter(range(100, 10_000))


def _start(what: str, code: grpc.StatusCode = C.INVALID_ARGUMENT, **order: Any) -> Hostile:
    """A start order that would launch but for ``order``; each its own run id (a start is idempotent)."""
    base: dict[str, Any] = {
        "task_id": 9,
        "run_id": next(_run_ids),
        "user_name": "alice",
        "node_rank": 0,
        "num_nodes": 1,
        "argv": [sys.executable, "-c", "pass"],
        "master_ip": "127.0.0.1",
        "master_port": 2222,
        "token": ALICE,
    }
    return _case(f"start: {what}", "StartRun", pb.StartRunRequest(**{**base, **order}), code)


CASES = [
    *[_case(f"malformed bytes {i} to {m}", m, bad, C.INVALID_ARGUMENT, response_stream=m in ("WatchRuns", "ReadLogs"))
      for i, bad in enumerate(MALFORMED_MESSAGES) for m in ("StartRun", "StopRun", "WatchRuns", "ReadLogs")],
    _start("a request over 4 MiB", C.RESOURCE_EXHAUSTED, argv=["y" * (5 << 20)]),
    _start("2^32-1 nodes, node rank 2^32-2, port 2^32-1", num_nodes=U32, node_rank=U32 - 1, master_port=U32),
    _start("2^32-1 ranks per node", ranks_per_node=U32),
    _start("50,000 devices", device_indices=range(MANY)),
    _start("a device twice", device_indices=[0, 0]),
    _start("50,000 variables of 20 bytes", env={f"VARIABLE_{i:08d}": "1" for i in range(MANY)}),
    _start("a 1 MiB argument", argv=[sys.executable, "-c", "pass", HUGE]),
    _start("a 1 MiB master address", master_ip=HUGE),
    _start("a 1 MiB working folder", working_dir="/" + HUGE),
    _start("a 1 MiB token", token=HUGE),
    _start("the token of another user than the task's", user_name="bob"),
    _start("the cluster token as the run's token", token=CLUSTER_TOKEN),
    _case("suspend run 2^64-1", "SuspendRun", pb.SuspendRunRequest(task_id=U64, run_id=U64), C.NOT_FOUND),
    _case("suspend with a NaN grace", "SuspendRun", pb.SuspendRunRequest(run_id=1, grace_s=NAN), C.INVALID_ARGUMENT),
    _case("suspend with an infinite window", "SuspendRun", pb.SuspendRunRequest(run_id=1, ack_window_s=INF),
          C.INVALID_ARGUMENT),
    # A stop of a run that is not here is done already (idempotent): OK, nothing to stop.
    _case("stop run 2^64-1", "StopRun", pb.StopRunRequest(task_id=U64, run_id=U64), C.OK),
    _case("stop with reason 2^31-1", "StopRun", pb.StopRunRequest(run_id=1, reason=I32), C.INVALID_ARGUMENT),
    _case("stop with a NaN grace", "StopRun", pb.StopRunRequest(run_id=1, term_grace_s=NAN), C.INVALID_ARGUMENT),
    _case("watch run 2^64-1", "WatchRuns", pb.WatchRunsRequest(run_id=U64), C.NOT_FOUND, response_stream=True),
    _case("logs of run 2^64-1 from 2^64-1", "ReadLogs",
          pb.ReadLogsRequest(task_id=U64, run_id=U64, local_rank=U32, offset_bytes=U64, tail_bytes=U64),
          C.NOT_FOUND, response_stream=True),
    _case("validate with 50,000 checks", "ValidateNode", pb.ValidateNodeRequest(checks=["gemm"] * MANY),
          C.INVALID_ARGUMENT),
    _case("validate a check named 1 MiB", "ValidateNode", pb.ValidateNodeRequest(checks=[HUGE]), C.INVALID_ARGUMENT),
    _case("progress of run 2^64-1", "GetCollectiveProgress",
          pb.GetCollectiveProgressRequest(task_id=U64, run_id=U64), C.NOT_FOUND),
]  # fmt: skip


@pytest.fixture
async def served(sqlite_url: str, tmp_path: Path) -> AsyncIterator[tuple[AgentProcess, dict[str, str]]]:
    async with running_with_users(tmp_path, sqlite_url) as (mgmtd, tokens):
        agent = await spawn_process(tmp_path, mgmtd.address, CLUSTER_TOKEN, scheduler_address="127.0.0.1:9").ready()
        try:
            yield agent, tokens
        finally:
            agent.proc.send_signal(signal.SIGTERM)
            await asyncio.to_thread(agent.proc.wait, 30)  # off the loop: mgmtd here answers the agent's last calls


async def test_hostile_input_gets_its_status_within_bounds_and_the_agent_keeps_serving(served: Any) -> None:
    agent, tokens = served
    channel = open_channel(agent.address)
    health = health_pb2_grpc.HealthStub(channel)

    async def still_serving() -> None:
        answer = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING

    problems: list[str] = []
    try:
        for case in CASES:
            hostile = replace(case, token=tokens["alice"] if case.token == ALICE else case.token)
            if case.what.startswith("start:"):
                order = pb.StartRunRequest.FromString(case.request)
                if order.token == ALICE:
                    order.token = tokens["alice"]
                    hostile = replace(hostile, request=order.SerializeToString())
            problems += await check_hostile(channel, agent.proc.pid, hostile, still_serving)
    finally:
        await channel.close()
    assert not problems, "\n".join(problems)
    assert not list((agent.state_dir / "runs").iterdir())  # nothing was launched
