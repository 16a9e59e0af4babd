"""The hfai CLI as a real process: local mode with a simulated suspend, and every user and admin command
against a real mgmtd + scheduler (+ a protocol-level agent driver)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ff_testing.mgmtd import CLUSTER_TOKEN
from ff_testing.mgmtd import start_in_process as start_mgmtd
from ff_testing.scheduler import AgentDriver
from ff_testing.scheduler import start_in_process as start_scheduler
from ff_testing.waiting import eventually
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2

TRAIN = """
import time
from hfai import client
start = client.get_whole_life_state()
print(f"start whole_life_state={start}", flush=True)
for step in range(start, start + 200):
    time.sleep(0.05)
    if client.receive_suspend_command():
        client.set_whole_life_state(step + 1)  # the next step: > 0 even when the flag came before step 1
        print(f"suspending at step {step}", flush=True)
        client.go_suspend()
    if start > 0 and step >= start + 3:
        print("finished", flush=True)
        break
"""


async def hfai(*args: str, env: dict[str, str] | None = None, timeout_s: float = 60) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "hfai",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("HFAI_")}, **(env or {})},
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_local_mode_simulates_a_suspend_and_resumes_with_whole_life_state(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    code, out, err = await hfai("python", str(script), "++", "--suspend-after", "0.5")
    assert code == 0, err
    lines = out.splitlines()
    suspended_at = int(next(line for line in lines if line.startswith("suspending at step")).rsplit(" ", 1)[1])
    assert "start whole_life_state=0" in lines and f"start whole_life_state={suspended_at + 1}" in lines
    assert "finished" in lines and any("suspended (go_suspend())" in line for line in lines)


@pytest.fixture
async def env(tmp_path: Path, sqlite_url: str) -> AsyncIterator[dict[str, Any]]:
    mgmtd = await start_mgmtd(tmp_path, sqlite_url)
    client = mgmtd.client()
    tokens = {}
    for name, role in (("alice", common_pb2.ROLE_USER), ("bob", common_pb2.ROLE_USER), ("root", common_pb2.ROLE_ADMIN)):
        await client.identity.create_user(mgmtd_pb2.CreateUserRequest(name=name, role=role))
        tokens[name] = (await client.identity.issue_token(mgmtd_pb2.IssueTokenRequest(user_name=name))).token
    await client.close()
    scheduler = await start_scheduler(tmp_path, sqlite_url, mgmtd.address, CLUSTER_TOKEN)
    agent = await AgentDriver(scheduler.address, mgmtd.address, CLUSTER_TOKEN).start()
    try:
        yield {
            "tokens": tokens,
            "scheduler": scheduler.address,
            "mgmtd": mgmtd.address,
            "agent": agent,
            "tmp": tmp_path,
        }
    finally:
        await agent.close()
        await scheduler.shutdown()
        await mgmtd.shutdown()


def as_user(env: dict[str, Any], user: str) -> dict[str, str]:
    return {
        "HFAI_SERVER": env["scheduler"],
        "HFAI_TOKEN": env["tokens"][user],
        "HFAI_MGMTD": env["mgmtd"],
        "HFAI_CONFIG": str(env["tmp"] / f"{user}.json"),
    }


async def test_cli_commands_against_a_cluster(env: dict[str, Any]) -> None:
    alice, bob, root = as_user(env, "alice"), as_user(env, "bob"), as_user(env, "root")
    agent: AgentDriver = env["agent"]
    code, out, err = await hfai("whoami", env=alice)
    assert code == 0 and "alice" in out and "no quota" in out, err
    code, _, err = await hfai("admin", "quota", "set", "alice", "30", "1", env=alice)
    assert code == 1 and "PERMISSION_DENIED" in err
    code, out, err = await hfai("admin", "quota", "set", "alice", "high", "1", env=root)
    assert code == 0 and "used 0/1" in out, err
    code, out, err = await hfai(
        "python", "train.py", "--lr", "1", "--", "--nodes", "1", "--priority", "30", "--name", "exp1", env=alice
    )
    assert code == 0, err
    task_id = int(out.split()[2])
    await agent.wait_for(lambda: bool(agent.starts))
    assert list(agent.starts[0].argv) == ["python", "train.py", "--lr", "1"]
    code, out, _ = await hfai("list", env=alice)
    assert "exp1" in out and "HIGH" in out
    code, out, _ = await hfai("list", env=bob)
    assert out.strip() == "no tasks"
    code, _, err = await hfai("stop", str(task_id), env=bob)
    assert code == 1 and "NOT_FOUND" in err
    code, out, _ = await hfai("logs", str(task_id), "--rank", "0", env=alice)
    assert "rank 0 started" in out
    code, out, _ = await hfai("nodes", env=alice)
    assert f"tasks={task_id}" in out
    code, out, _ = await hfai("whoami", env=alice)
    assert "1 running" in out and "used 1/1" in out
    code, out, err = await hfai("suspend", str(task_id), env=alice)
    assert code == 0, err
    await agent.wait_for(lambda: bool(agent.stops))

    async def resumed() -> bool:
        _, status, _ = await hfai("status", str(task_id), env=alice)
        return "run 1 " in status

    await eventually(resumed, timeout_s=20, what="the task resumed")
    code, out, err = await hfai("stop", str(task_id), env=alice)
    assert code == 0 and "exp1" in out, err
    code, out, err = await hfai("admin", "node", "disable", str(agent.node_id), "--reason", "bad fan", env=root)
    assert code == 0 and "err (bad fan)" in out, err
    code, out, err = await hfai("admin", "token", "issue", "bob", env=root)
    assert code == 0 and "token " in out, err
    token_id = out.split()[1]
    code, out, err = await hfai("admin", "token", "revoke", token_id, env=root)
    assert code == 0 and f"token {token_id} revoked" in out, err
    code, out, err = await hfai("admin", "token", "list", "bob", env=root)
    assert code == 0 and f"{token_id}  bob revoked" in out, err
    code, out, err = await hfai("python", "x.py", "--", "--nodes", "0", env=alice)
    assert code == 1 and "INVALID_ARGUMENT" in err


async def test_cli_without_configuration_says_how_to_set_it(tmp_path: Path) -> None:
    code, _, err = await hfai("list", env={"HFAI_CONFIG": str(tmp_path / "none.json")})
    assert code == 2 and "hfai init" in err


async def test_help_of_python_and_bash_lists_the_submit_options() -> None:
    for kind in ("python", "bash"):
        code, out, err = await hfai(kind, "--help")
        assert code == 0, err
        assert f"hfai {kind} SCRIPT [args] -- [options]" in out and "--nodes" in out and "--suspend-after" in out


async def test_init_checks_the_token_before_saving_it(env: dict[str, Any]) -> None:
    conf = env["tmp"] / "init.json"
    where = {"HFAI_CONFIG": str(conf)}
    code, _, err = await hfai("init", "garbage", "--mgmtd", env["mgmtd"], env=where)
    assert code == 2 and "refused this token" in err and "Traceback" not in err, err
    assert not conf.exists()
    code, out, err = await hfai("init", env["tokens"]["alice"], "--mgmtd", env["mgmtd"], env=where)
    assert code == 0 and "token of alice" in out, err
    # Only mgmtd was given: the scheduler is found through it.
    code, out, err = await hfai("whoami", env=where)
    assert code == 0 and out.startswith("alice (uid"), err


async def test_the_cluster_client_variables_are_enough(env: dict[str, Any], tmp_path: Path) -> None:
    ff_only = {
        "FF_MGMTD_ADDRESSES": env["mgmtd"],
        "FF_TOKEN": env["tokens"]["bob"],
        "HFAI_CONFIG": str(tmp_path / "none.json"),
    }
    code, out, err = await hfai("whoami", env=ff_only)
    assert code == 0 and out.startswith("bob (uid"), err


async def test_a_task_bigger_than_the_cluster_is_refused_at_submit(env: dict[str, Any]) -> None:
    alice = as_user(env, "alice")
    code, _, err = await hfai("python", "x.py", "--", "--nodes", "99", env=alice)
    assert code == 1 and "FAILED_PRECONDITION" in err and "has 1: it could never run" in err, err
    code, out, _ = await hfai("list", env=alice)
    assert out.strip() == "no tasks"


async def test_output_into_a_closed_pipe_ends_quietly(env: dict[str, Any]) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line, as `hfai list | head -0` would be
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "hfai",
            "whoami",
            stdout=write_end,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, **as_user(env, "alice")},
        )
    finally:
        os.close(write_end)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 141 and err.decode() == ""
