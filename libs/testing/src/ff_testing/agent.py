"""Helpers to run real agents in tests: in this process (an asyncio task) or as a subprocess (to SIGKILL)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ff_agent.config import AgentSettings
from ff_agent.server import main
from ff_testing.process import ServiceProcess, service_process
from ff_testing.service import InProcessService
from ff_testing.service import start_in_process as start_service
from ff_testing.waiting import eventually
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
    folder: Path, mgmtd_address: str, name: str, scheduler_address: str = "", **overrides: Any
) -> dict[str, Any]:
    return {
        "state_dir": folder / name,
        "mgmtd_addresses": mgmtd_address,
        "scheduler_address": scheduler_address,
        "instance_id": name,
        "hostname": name,
        **FAST,
        **overrides,
    }


@dataclass
class InProcessAgent(InProcessService):
    """An agent serving in this process as an asyncio task (``start_in_process``); ``shutdown`` stops it."""

    state_dir: Path = Path()

    @property
    def node_id(self) -> int:
        """The node id mgmtd gave the agent."""
        return int(self.info["node_id"])


async def start_in_process(
    folder: Path, mgmtd_address: str, cluster_token: str, name: str = "agent1", **overrides: Any
) -> InProcessAgent:
    """Start an agent named ``name`` in this process with the test settings (``FAST``) and return it once ready.

    Its state lives in ``folder / name``; ``overrides`` are settings fields.
    """
    ready = folder / f"{name}.ready.json"
    values = _settings_for(folder, mgmtd_address, name, **overrides)
    settings = AgentSettings(**{**values, "cluster_token": cluster_token, "ready_file": ready})
    started = await start_service(main, settings, ready, timeout_s=60.0)
    return InProcessAgent(started.info, started.stop, started.task, values["state_dir"])


@dataclass
class AgentProcess(ServiceProcess):
    """An agent running as a process (``spawn_process``), so a test can SIGTERM or SIGKILL it."""

    state_dir: Path = Path()

    @property
    def node_id(self) -> int:
        """The node id mgmtd gave the agent, from its ready file (after ``ready``)."""
        return int(self.info["node_id"])

    def terminate(self, timeout_s: float = 30.0, *, wait: bool = True) -> None:
        """SIGTERM (the agent stops its runs first); with ``wait``, until it exited (SIGKILL past ``timeout_s``)."""
        super().terminate(timeout_s, wait=wait)


def spawn_process(
    folder: Path, mgmtd_address: str, cluster_token: str, name: str = "agent1", **overrides: Any
) -> AgentProcess:
    """Start ``python -m ff_agent`` with the test settings, its output in ``folder/<name>.log``; not yet ready.

    The cluster token goes through the environment, not the command line.
    """
    settings = _settings_for(folder, mgmtd_address, name, **overrides)
    proc = service_process("agent", folder, name, cluster_token=cluster_token, settings=settings, kind=AgentProcess)
    proc.state_dir = settings["state_dir"]
    proc.start()
    return proc


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
        await eventually(reached, timeout_s, f"task {task_id} {what}", interval_s=0.1)
    except TimeoutError:
        raise TimeoutError(f"task {task_id} not {what}: {found[0] if found else None}") from None
    return found[0]
