"""One run whose SDK events cannot be relayed (its rank put a directory where its event file goes, so reading
it raises) does not stop the agent supervising its other runs: before, the exception left ``tick`` at that run
on every tick, so no run after it was reaped, stopped or ended.

The agent gets its start orders straight from the test, with no scheduler (one would stop runs it does not know):
relaying the good run's events fails on the link and is retried, as it always is."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ff_rpc import RpcClient, open_channel
from ff_testing.agent import InProcessAgent, start_in_process
from ff_testing.mgmtd import CLUSTER_TOKEN, running_with_users
from ff_testing.waiting import eventually
from fireflyer.agent.v1 import agent_pb2, agent_pb2_grpc
from fireflyer.scheduler.v1 import scheduler_pb2 as pb

# The rank replaces its event file with a directory, says so in the file named by its argument, and lives on.
BREAKS_ITS_EVENTS = """
import os, sys, time
events = os.path.join(os.environ["HFAI_RUN_DIR"], "events.jsonl")
if os.path.isfile(events):
    os.remove(events)
os.makedirs(events, exist_ok=True)
open(sys.argv[1], "w").close()
time.sleep(120)
"""


def _order(run_id: int, device: int, argv: list[str], token: str) -> agent_pb2.StartRunRequest:
    return agent_pb2.StartRunRequest(
        task_id=run_id,
        run_id=run_id,
        argv=[sys.executable, *argv],
        node_rank=0,
        num_nodes=1,
        master_ip="127.0.0.1",
        master_port=2222,
        token=token,
        device_indices=[device],
    )


@pytest.fixture
async def agent(sqlite_url: str, tmp_path: Path) -> AsyncIterator[tuple[InProcessAgent, dict[str, str]]]:
    """A real agent in this process, with mgmtd (identities, tokens) and no scheduler; and the users' tokens."""
    async with running_with_users(tmp_path, sqlite_url) as (mgmtd, tokens):
        started = await start_in_process(tmp_path, mgmtd.address, CLUSTER_TOKEN, "a1", scheduler_address="127.0.0.1:9")
        try:
            yield started, tokens
        finally:
            await started.shutdown()


async def _until_exited(rpc: RpcClient, stub: Any, run_id: int) -> agent_pb2.WatchRunsResponse:
    """The first report of ``run_id`` ended on this node (its ranks reaped), within a generous bound."""
    async with asyncio.timeout(60):
        async for msg in rpc.stream(stub.WatchRuns, agent_pb2.WatchRunsRequest(run_id=run_id)):
            if msg.run.phase == pb.NODE_RUN_PHASE_EXITED:
                return msg
    raise AssertionError(f"the agent's report stream of run {run_id} ended before the run did")


async def test_a_run_whose_events_cannot_be_read_leaves_the_others_supervised(
    agent: tuple[InProcessAgent, dict[str, str]], tmp_path: Path
) -> None:
    served, tokens = agent
    channel = open_channel(served.address)
    stub = agent_pb2_grpc.AgentServiceStub(channel)
    rpc = RpcClient(token=CLUSTER_TOKEN, timeout_s=10.0)
    marker = tmp_path / "broken"
    alice = tokens["alice"]  # the run token a scheduler would send
    try:
        await rpc.unary(stub.StartRun, _order(1, 0, ["-c", BREAKS_ITS_EVENTS, str(marker)], alice))

        async def broken() -> bool:
            return marker.exists()

        await eventually(broken, what="the first run's event file replaced by a directory")
        await asyncio.sleep(0.5)  # several ticks (0.1 s apart) in which relaying run 1's events raises
        await rpc.unary(stub.StartRun, _order(2, 1, ["-c", "print('second run')"], alice))
        second = await _until_exited(rpc, stub, 2)
        assert [(r.exit_code, r.signal) for r in second.run.ranks] == [(0, 0)], second
        # the broken run itself is still supervised: a stop ends it, its rank reaped after SIGTERM
        await rpc.unary(stub.StopRun, agent_pb2.StopRunRequest(task_id=1, run_id=1, term_grace_s=2.0))
        first = await _until_exited(rpc, stub, 1)
        assert [r.signal for r in first.run.ranks] in ([15], [9]), first
    finally:
        await channel.close()
