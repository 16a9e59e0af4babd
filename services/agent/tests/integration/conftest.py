"""A real cluster for agent tests: mgmtd and the scheduler in this event loop on a SQLite file, users
with tokens, and real agents (in this process, or as subprocesses) launching real rank processes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ff_testing import free_port
from ff_testing.agent import AgentProcess, InProcessAgent, spawn_process, start_in_process
from ff_testing.mgmtd import CLUSTER_TOKEN, running_with_users
from ff_testing.scheduler import SchedulerCluster, running_scheduler, set_quota
from ff_testing.waiting import eventually
from fireflyer.scheduler.v1 import scheduler_pb2 as pb

# The scheduler's short protocol deadlines for these tests (the agents' are in ff_testing.agent.FAST).
# check_checkpoints off: these clusters have no 3FS, the test tasks checkpoint to files on this machine
SCHEDULER = {
    "ack_window_s": 5.0,
    "default_grace_s": 10.0,
    "term_grace_s": 2.0,
    "stop_timeout_s": 20.0,
    "check_checkpoints": False,
}


@dataclass
class Cluster(SchedulerCluster):
    agents: list[InProcessAgent] = field(default_factory=list)
    processes: list[AgentProcess] = field(default_factory=list)

    async def add_agent(self, name: str, **overrides: Any) -> InProcessAgent:
        agent = await start_in_process(
            self.folder, self.mgmtd.address, CLUSTER_TOKEN, name, scheduler_address=self.scheduler.address, **overrides
        )
        self.agents.append(agent)
        await self.wait_nodes(len(self.agents) + len(self.processes))
        return agent

    async def add_agent_process(self, name: str, **overrides: Any) -> AgentProcess:
        proc = spawn_process(
            self.folder, self.mgmtd.address, CLUSTER_TOKEN, name, scheduler_address=self.scheduler.address, **overrides
        )
        self.processes.append(proc)
        await proc.ready()
        await self.wait_nodes(len(self.agents) + len(self.processes))
        return proc

    async def nodes(self) -> list[pb.Node]:
        root = self.client("root")
        resp = await root.call(root.user.ListNodes, pb.ListNodesRequest())
        return list(resp.nodes)

    async def wait_nodes(self, count: int) -> None:
        async def ready() -> bool:
            return sum(n.state == pb.NODE_STATE_READY for n in await self.nodes()) >= count

        await eventually(ready, what=f"{count} ready nodes")

    async def close(self) -> None:
        for proc in self.processes:  # all at once: each stops its runs first, which takes seconds
            proc.terminate(wait=False)
        for proc in self.processes:  # off the loop: mgmtd and the scheduler here answer their final calls
            await asyncio.to_thread(proc.wait_stopped)
        for agent in self.agents:
            await agent.shutdown()
        await super().close()


@pytest.fixture
def mgmtd_settings() -> dict[str, Any]:
    """Settings overrides for the cluster's mgmtd; a module that waits for leases to lapse overrides this fixture."""
    return {}


@pytest.fixture
async def cluster(sqlite_url: str, tmp_path: Path, mgmtd_settings: dict[str, Any]) -> AsyncIterator[Cluster]:
    async with running_with_users(tmp_path, sqlite_url, **mgmtd_settings) as (mgmtd, tokens):
        # A free MASTER_PORT: ranks that build an hfreduce group serve its control plane there.
        settings = {"master_port": free_port(), **SCHEDULER}
        async with running_scheduler(tmp_path, sqlite_url, mgmtd, tokens, kind=Cluster, **settings) as c:
            root = c.client("root")
            for level in (10, 30):
                await set_quota(root, "alice", level, 3)
                await set_quota(root, "bob", level, 3)
            yield c
