"""Ranks run as their task's user: uid, gid and groups from the identity registry (the agent is root
here), so one user's rank cannot signal another's; the run's token and mgmtd addresses reach every
client through the cluster's client variables."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ff_agent.config import AgentSettings
from ff_agent.core.launch import RanksRunAs
from ff_agent.server import ranks_run_as_at_start
from ff_testing.agent import wait_task
from ff_testing.scheduler import spec
from ff_testing.waiting import eventually
from fireflyer.scheduler.v1 import scheduler_pb2 as pb

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching a rank's uid needs the agent to run as root")
# The ranks' interpreter must be one every uid may run (this test's own may live under /root, 0700).
OPEN_PYTHON = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.access(p, os.X_OK)), "")

# Alice's rank: writes who it is, then waits to be signalled.
VICTIM = """
import json, os, sys, time
json.dump({"pid": os.getpid(), "uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(),
           "groups": os.getgroups(), "FF_TOKEN": os.environ.get("FF_TOKEN", ""),
           "FF_MGMTD_ADDRESSES": os.environ.get("FF_MGMTD_ADDRESSES", ""), "HOME": os.environ.get("HOME")},
          open("me.json", "w"))
time.sleep(120)
"""
# Bob's rank: tries to signal the pid it is given; writes what the kernel said.
ATTACKER = """
import os, signal, sys
try:
    os.kill(int(sys.argv[1]), signal.SIGKILL)
    said = "killed"
except PermissionError:
    said = "EPERM"
open("said.txt", "w").write(said)
"""


@pytest.fixture
def open_folder() -> Iterator[Path]:
    """A folder every uid can traverse (pytest's own are 0700): the agent's state and the scripts."""
    folder = Path(tempfile.mkdtemp(prefix="ff-agent-users-", dir="/tmp"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _script(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    path.chmod(0o644)
    return path


async def _submit(cluster: Any, user: str, argv: list[str]) -> pb.Task:
    client = cluster.client(user)
    return (await client.call(client.user.SubmitTask, pb.SubmitTaskRequest(spec=spec(1, 10, argv=argv)))).task


def _proc_ids(pid: int) -> tuple[int, int]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(fields["Uid"].split()[0]), int(fields["Gid"].split()[0])


@pytest.mark.skipif(not OPEN_PYTHON, reason="no system python3 that every user may run")
async def test_ranks_run_as_their_user_and_cannot_signal_another_users_ranks(cluster: Any, open_folder: Path) -> None:
    as_users = {"ranks_run_as": "task-user", "num_device_slots": 1, "python_executable": OPEN_PYTHON}
    agent = await cluster.add_agent("a1", state_dir=open_folder / "a1", **as_users)
    victim, attacker = _script(open_folder, "victim.py", VICTIM), _script(open_folder, "attacker.py", ATTACKER)
    alice = cluster.client("alice")
    alice_uid = (await alice.call(alice.user.WhoAmI, pb.WhoAmIRequest())).principal.uid
    task = await _submit(cluster, "alice", ["python", str(victim)])
    run_dir = agent.state_dir / "runs"

    written: list[dict[str, Any]] = []

    def read_me() -> None:  # the whole file, once the rank has written it: it may be caught half-written
        with contextlib.suppress(ValueError):
            written[:] = [json.loads(found.read_text()) for found in run_dir.glob(f"{task.task_id}-*/work/me.json")]

    async def wrote() -> bool:
        await asyncio.to_thread(read_me)
        return bool(written)

    await eventually(wrote, timeout_s=30, what="alice's rank wrote me.json")
    me = written[0]
    assert (me["uid"], me["euid"]) == (alice_uid, alice_uid) and alice_uid != 0
    assert _proc_ids(me["pid"])[0] == alice_uid  # the kernel's view of the running rank
    assert me["gid"] == alice_uid and me["groups"] == []  # alice is in no group: her private group only
    assert me["FF_TOKEN"].startswith("fft_") and me["FF_MGMTD_ADDRESSES"] == cluster.mgmtd.address

    # Bob's rank (with the other device slot taken: one slot, so his task waits) runs once alice's ends;
    # run it on a second agent instead, beside hers.
    agent2 = await cluster.add_agent("a2", state_dir=open_folder / "a2", **as_users)
    bob_task = await _submit(cluster, "bob", ["python", str(attacker), str(me["pid"])])
    bob = cluster.client("bob")
    done = await wait_task(bob, bob_task.task_id, pb.TASK_STATE_SUCCEEDED, pb.TASK_STATE_FAILED)
    assert done.state == pb.TASK_STATE_SUCCEEDED, done
    said = next((agent2.state_dir / "runs").glob(f"{bob_task.task_id}-*/work/said.txt")).read_text()
    assert said == "EPERM"
    assert _proc_ids(me["pid"])[0] == alice_uid  # alice's rank is still there
    await alice.call(alice.user.StopTask, pb.StopTaskRequest(task_id=task.task_id))
    await wait_task(alice, task.task_id, pb.TASK_STATE_STOPPED, pb.TASK_STATE_FAILED, pb.TASK_STATE_SUCCEEDED)


@pytest.mark.skipif(not OPEN_PYTHON, reason="no system python3 that every user may run")
def test_auto_runs_ranks_as_their_user_only_where_users_can_reach_the_run_folders(
    open_folder: Path, tmp_path: Path
) -> None:
    def settings(state_dir: Path, **kw: Any) -> AgentSettings:
        return AgentSettings(
            state_dir=state_dir, mgmtd_addresses="127.0.0.1:1", cluster_token="t", python_executable=OPEN_PYTHON, **kw
        )

    assert ranks_run_as_at_start(settings(open_folder / "a", ranks_run_as="auto")) is RanksRunAs.TASK_USER
    closed = tmp_path / "a"  # pytest's own folders are 0700
    assert ranks_run_as_at_start(settings(closed, ranks_run_as="auto")) is RanksRunAs.AGENT_USER
    with pytest.raises(RuntimeError, match="keeps task users out"):
        ranks_run_as_at_start(settings(closed, ranks_run_as="task-user"))
