"""The node-agent part of ``fireflyer demo``: a 2-node task suspended at a checkpoint, resumed, its log followed.

The agents' nodes, a 2-node task whose ranks print their environment, a suspend that the task answers with a checkpoint
and go_suspend(), its resume from that checkpoint, and a rank's log followed while it runs (what
``hfai logs -f --rank 1`` shows).
"""

from __future__ import annotations

import asyncio
import os
import re
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import hf3fs
from ff_appliance.scheduler_setup import scheduler_address, set_quota
from ff_appliance.scheduler_user import SchedulerUser, user_token
from ff_cluster import MgmtdClient
from fireflyer.scheduler.v1 import scheduler_pb2 as pb

NUM_STEPS = 4
CHECKPOINTS = "/demo-checkpoints"  # in 3FS
USER = "agent-demo"
WAIT_S = 90.0

ENV_SCRIPT = """
import os
keys = ["WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_IP", "MASTER_PORT", "MARSV2_TASK_ID"]
print(" ".join(f"{k}={os.environ[k]}" for k in keys))
"""

# The checkpoint is a file in 3FS (the task's FF_TOKEN is the user's): the scheduler counts a reported checkpoint
# only when it exists there and is the task's user's.
TRAIN_SCRIPT = """
import json, os, sys, time
import hf3fs
from hfai import client
ckpt, rank, local = sys.argv[1], os.environ["RANK"], os.environ["LOCAL_RANK"]
fs = hf3fs.connect()
start = json.loads(fs.open(ckpt, "rb").read())["step"] if fs.exists(ckpt) else 0
resumed = client.get_whole_life_state() > 0  # the number of suspends so far
print(f"start at step {start}, whole_life_state {client.get_whole_life_state()}", flush=True)
for step in range(start, start + 600):
    if rank == "0" and local == "0" and client.receive_suspend_command():
        with fs.open(ckpt + ".tmp", "wb") as f:
            f.write(json.dumps({"step": step}).encode())
        fs.rename(ckpt + ".tmp", ckpt)
        client.set_whole_life_state(client.get_whole_life_state() + 1)
        client.report_checkpoint(ckpt, step)
        print(f"suspend flag seen: checkpoint at step {step}, go_suspend()", flush=True)
        client.go_suspend()
    if resumed and step >= start + 15:
        print(f"finished at step {step}", flush=True)
        break
    if step % 5 == 0:
        print(f"step {step}", flush=True)
    time.sleep(0.1)
"""


class AgentDemoError(Exception):
    """The agents or the scheduler did not do what the demo expects."""


class _User(SchedulerUser):
    def __init__(self, address: str, token: str) -> None:
        super().__init__(address, token, timeout_s=10.0)

    async def wait(self, task_id: int, what: Callable[[pb.Task], bool], why: str) -> pb.Task:
        deadline = time.monotonic() + WAIT_S
        while True:
            task = await self.task(task_id)
            if what(task):
                return task
            if time.monotonic() > deadline:
                raise AgentDemoError(f"task {task_id}: {why} did not happen within {WAIT_S:g} s: {task}")
            await asyncio.sleep(0.2)


def _state(t: pb.Task) -> str:
    return str(pb.TaskState.Name(t.state)).removeprefix("TASK_STATE_").lower()


async def agent_section(
    addresses: Sequence[str],
    admin_token: str,
    step: Callable[[str], None],
    say: Callable[[str], None],
    scratch_dir: Path | None = None,
) -> None:
    """Run the agent steps as the demo's user (``step`` prints a title, ``say`` a result), its quota set as admin.

    Raises:
        AgentDemoError: the agents or the scheduler did not do what the demo shows (each step says which).
    """
    mgmtd = MgmtdClient(list(addresses), token=admin_token)
    try:
        address = await scheduler_address(mgmtd)
        token = await user_token(mgmtd, USER)
    finally:
        await mgmtd.close()
    await set_quota(address, admin_token, USER, 10, 2)
    user = _User(address, token)
    folder = Path(tempfile.mkdtemp(prefix="fireflyer-agent-demo-", dir=scratch_dir))
    # The ranks may run as the demo's user (agents started by root): the folder is theirs to write too.
    os.chmod(folder, 0o1777)
    await asyncio.to_thread(_checkpoint_folder, list(addresses), admin_token)
    try:
        await _nodes(user, step, say)
        await _env_task(user, folder, step, say)
        await _suspend_resume(user, folder, step, say)
    finally:
        await user.close()


def _checkpoint_folder(addresses: list[str], admin_token: str) -> None:
    """The 3FS folder the train task checkpoints into: anyone may make files there (sticky, as /tmp)."""
    with hf3fs.connect(mgmtd=addresses, token=admin_token) as fs:
        fs.makedirs(CHECKPOINTS, exist_ok=True)
        fs.chmod(CHECKPOINTS, 0o1777)


async def _nodes(user: _User, step: Callable[[str], None], say: Callable[[str], None]) -> None:
    step("agents: the nodes they registered (devices are CPU slots on this machine)")
    deadline = time.monotonic() + WAIT_S
    while True:
        nodes = [
            n for n in (await user.scheduler.list_nodes(pb.ListNodesRequest())).nodes if n.state == pb.NODE_STATE_READY
        ]
        if len(nodes) >= 2:
            break
        if time.monotonic() > deadline:
            raise AgentDemoError("fewer than 2 agent nodes are ready")
        await asyncio.sleep(0.2)
    for n in nodes:
        say(
            f"node {n.node_id} {n.hostname}: {len(n.devices)} devices ({n.devices[0].name}), {n.num_cpus} CPUs, "
            f"group {n.node_group}"
        )


async def _env_task(user: _User, folder: Path, step: Callable[[str], None], say: Callable[[str], None]) -> None:
    step(f"{USER} runs a 2-node task; every rank prints its environment")
    script = folder / "env.py"
    script.write_text(ENV_SCRIPT)
    spec = pb.TaskSpec(name="print-env", argv=["python", str(script)], num_nodes=2, priority=10)
    task = (await user.scheduler.submit_task(pb.SubmitTaskRequest(spec=spec))).task
    done = await user.wait(task.task_id, lambda t: t.state >= pb.TASK_STATE_SUCCEEDED, "the end")
    if done.state != pb.TASK_STATE_SUCCEEDED:
        raise AgentDemoError(f"the print-env task ended {_state(done)}: {done.end_message}")
    lines = []
    for node_rank in (0, 1):
        lines += sorted((await user.log(task.task_id, node_rank)).splitlines())
    for line in lines:
        say(line)
    if len(lines) != 4 or not all("WORLD_SIZE=2" in line and "LOCAL_WORLD_SIZE=2" in line for line in lines):
        raise AgentDemoError(f"expected 4 ranks of a 2-node task, got: {lines}")


async def _suspend_resume(user: _User, folder: Path, step: Callable[[str], None], say: Callable[[str], None]) -> None:
    step("suspend a running 2-node task: rank 0 checkpoints and calls go_suspend(); it resumes from there")
    script = folder / "train.py"
    script.write_text(TRAIN_SCRIPT)
    ckpt = f"{CHECKPOINTS}/{folder.name}.json"
    spec = pb.TaskSpec(name="train", argv=["python", str(script), ckpt], num_nodes=2, priority=10)
    task = (await user.scheduler.submit_task(pb.SubmitTaskRequest(spec=spec))).task
    await user.wait(task.task_id, lambda t: t.current_run.state == pb.RUN_STATE_RUNNING, "running")
    deadline = time.monotonic() + WAIT_S
    # Node rank 0's local rank 0 (the rank that checkpoints) made some progress worth checkpointing: its own line
    # (local rank 1 may be steps ahead of it: a checkpoint at step 3 once followed local rank 1's "step 5").
    while not re.search(r"^\[0\] step 5$", await user.log(task.task_id, 0), re.MULTILINE):
        if time.monotonic() > deadline:
            raise AgentDemoError("the train task printed no progress")
        await asyncio.sleep(0.2)
    await user.scheduler.suspend_task(pb.SuspendTaskRequest(task_id=task.task_id))
    say(f"task {task.task_id}: suspend asked")
    started = (pb.RUN_STATE_UNSPECIFIED, pb.RUN_STATE_STARTING)
    resumed = await user.wait(
        task.task_id, lambda t: t.num_runs >= 2 and t.current_run.state not in started, "the resume"
    )
    first = resumed.runs[0]
    stage = str(pb.SuspendStage.Name(first.suspend_stage)).removeprefix("SUSPEND_STAGE_")
    say(
        f"run 0 ended {pb.RunState.Name(first.state).removeprefix('RUN_STATE_').lower()} (stage {stage}); "
        f"checkpoint {first.last_checkpoint.path} at step {first.last_checkpoint.step}"
    )
    say(f"run 1 starts with whole_life_state {resumed.current_run.start_whole_life_state} (suspends so far)")

    step("follow node rank 1's log of the resumed run while it runs (hfai logs -f --rank 1)")
    followed = await user.log(task.task_id, 1, follow=True, run_id=resumed.current_run.run_id)
    for line in followed.splitlines():
        say(line)
    done = await user.wait(task.task_id, lambda t: t.state >= pb.TASK_STATE_SUCCEEDED, "the end")
    say(f"task {task.task_id}: {_state(done)} after {done.num_runs} runs")
    if done.state != pb.TASK_STATE_SUCCEEDED or first.suspend_stage != pb.SUSPEND_STAGE_CAN_SUSPEND:
        raise AgentDemoError(f"expected a go_suspend() suspend and a resumed success: {done}")
    resumed_at = f"start at step {first.last_checkpoint.step}, whole_life_state 1"
    if resumed.current_run.start_whole_life_state != 1 or resumed_at not in followed or first.last_checkpoint.step < 5:
        raise AgentDemoError("the resumed run did not continue from the checkpoint")
