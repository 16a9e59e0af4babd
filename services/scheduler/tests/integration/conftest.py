"""A real cluster for scheduler tests: mgmtd and the scheduler in this event loop on one database
(SQLite and PostgreSQL), users with tokens in mgmtd's registry, and protocol-level agent drivers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ff_testing.mgmtd import CLUSTER_TOKEN, InProcessMgmtd, running_with_users
from ff_testing.scheduler import AgentDriver, SchedulerCluster, running_scheduler, start_in_process


@dataclass
class Cluster(SchedulerCluster):
    agents: list[AgentDriver] = field(default_factory=list)

    async def add_agent(self, **kw: Any) -> AgentDriver:
        agent = await AgentDriver(self.scheduler.address, self.mgmtd.address, CLUSTER_TOKEN, **kw).start()
        self.agents.append(agent)
        return agent

    async def restart_scheduler(self, **overrides: Any) -> None:
        await self.scheduler.shutdown()
        self.scheduler = await start_in_process(
            self.folder, self.db_url, self.mgmtd.address, CLUSTER_TOKEN, **overrides
        )
        for agent in self.agents:  # their reports go to the new scheduler, not the old one's closed port
            await agent.follow(self.scheduler.address)

    async def close(self) -> None:
        for agent in self.agents:
            await agent.close()
        await super().close()


@pytest.fixture
def mgmtd_settings() -> dict[str, Any]:
    """Settings overrides for the test's mgmtd; a module that waits for leases to lapse overrides this fixture."""
    return {}


@pytest.fixture
async def registry(
    db_url: str, tmp_path: Path, mgmtd_settings: dict[str, Any]
) -> AsyncIterator[tuple[InProcessMgmtd, dict[str, str]]]:
    """mgmtd on the test's database with users alice, bob (users) and root (admin) and their tokens."""
    async with running_with_users(tmp_path, db_url, **mgmtd_settings) as registry:
        yield registry


@pytest.fixture
async def cluster(
    db_url: str, tmp_path: Path, registry: tuple[InProcessMgmtd, dict[str, str]]
) -> AsyncIterator[Cluster]:
    async with running_scheduler(tmp_path, db_url, *registry, kind=Cluster) as c:
        yield c
