"""Fixtures that run mgmtd for real (see ff_testing.mgmtd)."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ff_testing.mgmtd import InProcessMgmtd, MgmtdProcess, spawn_process, start_in_process

StartMgmtd = Callable[..., Awaitable[InProcessMgmtd]]
SpawnMgmtd = Callable[..., MgmtdProcess]


@pytest.fixture
async def start_mgmtd(tmp_path: Path) -> AsyncIterator[StartMgmtd]:
    """Start mgmtd in this event loop on a given database; every instance is stopped after the test."""
    running: list[InProcessMgmtd] = []

    async def start(database_url: str, name: str = "m1", **overrides: Any) -> InProcessMgmtd:
        instance = await start_in_process(tmp_path, database_url, name, **overrides)
        running.append(instance)
        return instance

    yield start
    for instance in running:
        if not instance.task.done():
            await instance.shutdown()


@pytest.fixture
async def mgmtd(db_url: str, start_mgmtd: StartMgmtd) -> InProcessMgmtd:
    """One mgmtd on SQLite, and again on PostgreSQL (the db_url parameters).

    Tests that take a database fixture and start_mgmtd name the database first, so it is set up first
    and dropped last, after every mgmtd on it has stopped.
    """
    return await start_mgmtd(db_url)


@pytest.fixture
def spawn_mgmtd(tmp_path: Path) -> Iterator[SpawnMgmtd]:
    """Start mgmtd as a real process; every one still running is killed after the test."""
    procs: list[MgmtdProcess] = []

    def spawn(database_url: str, name: str, **overrides: Any) -> MgmtdProcess:
        handle = spawn_process(tmp_path, database_url, name, **overrides)
        procs.append(handle)
        return handle

    yield spawn
    for p in procs:
        if p.proc.poll() is None:
            p.proc.send_signal(signal.SIGKILL)
            p.proc.wait(timeout=10)
