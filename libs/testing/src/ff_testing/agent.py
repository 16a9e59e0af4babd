"""Helpers to run real agents in tests: in this process (an asyncio task) or as a subprocess (to SIGKILL)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ff_agent.config import AgentSettings
from ff_agent.server import main
from ff_testing.process import Process, spawn, wait_ready
from fireflyer.scheduler.v1 import scheduler_pb2 as pb

# Short intervals so tests take seconds.
FAST: dict[str, Any] = {
    "poll_interval_s": 0.1,
    "report_interval_s": 0.5,
    "term_grace_s": 2.0,
    "hang_check_interval_s": 0.5,
    "validator_interval_s": 0.0,
    "detect_gpus": False,
    "num_device_slots": 2,
    "token_cache_ttl_s": 0.5,
    "grace_s": 0.5,
    "metrics_address": "",
    "validator_memory_bytes": 8 << 20,
    "validator_disk_bytes": 4 << 20,
    "validator_gemm_size": 128,
    # Test clusters live in pytest's private folders (0700) with a single OS user; the tests of running
    # ranks as their task's user pass ranks_run_as="task-user" with a folder everyone can traverse.
    "ranks_run_as": "agent-user",
}


def _settings_for(
    folder: Path, mgmtd_address: str, cluster_token: str, name: str, scheduler_address: str = "", **overrides: Any
) -> dict[str, Any]:
    return {
        "state_dir": folder / name,
        "mgmtd_addresses": mgmtd_address,
        "scheduler_address": scheduler_address,
        "cluster_token": cluster_token,
        "ready_file": folder / f"{name}.ready.json",
        "instance_id": name,
        "hostname": name,
        **FAST,
        **overrides,
    }


@dataclass
class InProcessAgent:
    """An agent serving in this process as an asyncio task (``start_in_process``); ``shutdown`` stops it."""

    address: str
    node_id: int
    state_dir: Path
    stop: asyncio.Event
    task: asyncio.Task[None]

    async def shutdown(self) -> None:
        """Stop the agent (it stops its runs first) and wait up to 30 s for it to finish."""
        self.stop.set()
        await asyncio.wait_for(self.task, timeout=30)


async def start_in_process(
    folder: Path, mgmtd_address: str, cluster_token: str, name: str = "agent1", **overrides: Any
) -> InProcessAgent:
    """Start an agent named ``name`` in this process with the test settings (``FAST``) and return it once ready.

    Its state lives in ``folder / name``; ``overrides`` are settings fields.
    """
    values = _settings_for(folder, mgmtd_address, cluster_token, name, **overrides)
    values["ready_file"].unlink(missing_ok=True)
    stop = asyncio.Event()
    task = asyncio.create_task(main(AgentSettings(**values), stop))
    try:
        info = await wait_ready(values["ready_file"])
    except Exception:
        stop.set()
        await task
        raise
    return InProcessAgent(info["grpc"], int(info["node_id"]), values["state_dir"], stop, task)


@dataclass
class AgentProcess:
    """An agent running as a subprocess (``spawn_process``), so a test can SIGTERM or SIGKILL it."""

    proc: Process
    ready_file: Path
    state_dir: Path
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def address(self) -> str:
        """The agent's gRPC address, from its ready file (after ``ready``)."""
        return str(self.info["grpc"])

    @property
    def node_id(self) -> int:
        """The node id mgmtd gave the agent, from its ready file (after ``ready``)."""
        return int(self.info["node_id"])

    async def ready(self) -> AgentProcess:
        """Wait for the agent's ready file and return this process; raises if the process exits first."""
        self.info = await wait_ready(self.ready_file, self.proc)
        return self

    def terminate(self, *, wait: bool = True) -> None:
        """SIGTERM; with ``wait``, until it exited (``wait_stopped``)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            if wait:
                self.wait_stopped()

    def wait_stopped(self, timeout_s: float = 30.0) -> None:
        """Wait for the process to exit after its SIGTERM (it stops its runs first); SIGKILL past ``timeout_s``."""
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def spawn_process(
    folder: Path, mgmtd_address: str, cluster_token: str, name: str = "agent1", **overrides: Any
) -> AgentProcess:
    """Start ``python -m ff_agent`` with the test settings, its output in ``folder/<name>.log``; not yet ready.

    The cluster token goes through the environment, not the command line.
    """
    values = _settings_for(folder, mgmtd_address, cluster_token, name, **overrides)
    values["ready_file"].unlink(missing_ok=True)
    token = values.pop("cluster_token")
    args = [sys.executable, "-m", "ff_agent"]
    for key, value in values.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    env = {**os.environ, "FF_AGENT_CLUSTER_TOKEN": token}
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / f"{name}.log").open("ab") as out:
        proc = spawn(args, log=out, env=env)
    return AgentProcess(proc, values["ready_file"], values["state_dir"])


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 60.0, what: str = "condition") -> None:
    """Poll ``check`` every 0.1 s until it returns True.

    Raises:
        TimeoutError: ``check`` did not return True within ``timeout_s`` (the message names ``what``).
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"timed out waiting for {what}")


async def wait_task(client: Any, task_id: int, *states: int, timeout_s: float = 60.0) -> pb.Task:
    """The task once it is in one of ``states`` (``client``: a SchedulerService caller with ``call``/``user``)."""
    return await _wait_for_task(client, task_id, lambda t: t.state in states, f"in {states}", timeout_s)


async def wait_run_running(client: Any, task_id: int, timeout_s: float = 60.0) -> pb.Task:
    """The task once its current run is RUNNING on every node.

    A task is RUNNING as soon as it is scheduled, before any agent has started its run: this waits for the run.
    """
    return await _wait_for_task(
        client, task_id, lambda t: t.current_run.state == pb.RUN_STATE_RUNNING, "with its run running", timeout_s
    )


async def _wait_for_task(
    client: Any, task_id: int, condition: Callable[[pb.Task], bool], what: str, timeout_s: float
) -> pb.Task:
    found: list[pb.Task] = []

    async def reached() -> bool:
        resp = await client.call(client.user.GetTask, pb.GetTaskRequest(task_id=task_id, include_runs=True))
        found[:] = [resp.task]
        return condition(resp.task)

    try:
        await eventually(reached, timeout_s, f"task {task_id} {what}")
    except TimeoutError:
        raise TimeoutError(f"task {task_id} not {what}: {found[0] if found else None}") from None
    return found[0]
