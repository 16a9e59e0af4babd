"""Launch through the real scheduler: every rank of a 2-node task gets the right environment; bad start
orders are refused with a clear error and launch nothing."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest

from ff_agent import procs
from ff_rpc import RpcClient, RpcError, open_channel
from ff_testing.agent import wait_task
from ff_testing.mgmtd import CLUSTER_TOKEN
from ff_testing.scheduler import spec
from fireflyer.agent.v1 import agent_pb2, agent_pb2_grpc
from fireflyer.scheduler.v1 import scheduler_pb2 as pb

ENV_SCRIPT = """
import json, os, sys
keys = ["WORLD_SIZE", "RANK", "MASTER_IP", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MARSV2_TASK_ID",
        "MARSV2_RUN_ID", "MARSV2_WHOLE_LIFE_STATE", "HFAI_TOKEN", "HFAI_RUN_DIR", "FF_DEVICE_INDEX", "MY_VAR",
        "FF_TOKEN", "FF_MGMTD_ADDRESSES"]
env = {k: os.environ.get(k) for k in keys}
env["private"] = sorted(k for k in os.environ if k.startswith("FF_AGENT_"))
env["cwd"] = os.getcwd()
with open(os.path.join(sys.argv[1], f"env-{env['RANK']}-{env['LOCAL_RANK']}.json"), "w") as f:
    json.dump(env, f)
print("rank", env["RANK"], env["LOCAL_RANK"], "done")
"""


async def test_two_node_task_runs_with_the_hai_environment_on_every_rank(cluster: Any, tmp_path: Path) -> None:
    for name in ("a1", "a2"):
        await cluster.add_agent(name)
    script, out = tmp_path / "env.py", tmp_path / "out"
    script.write_text(ENV_SCRIPT)
    out.mkdir()
    alice = cluster.client("alice")
    task = (
        await alice.call(
            alice.user.SubmitTask,
            pb.SubmitTaskRequest(
                spec=spec(2, 10, argv=["python", str(script), str(out)], env={"MY_VAR": "x", "RANK": "no"})
            ),
        )
    ).task
    done = await wait_task(alice, task.task_id, pb.TASK_STATE_SUCCEEDED, pb.TASK_STATE_FAILED)
    assert done.state == pb.TASK_STATE_SUCCEEDED, done
    run = done.current_run
    envs = {p.name: json.loads(p.read_text()) for p in out.iterdir()}
    assert sorted(envs) == ["env-0-0.json", "env-0-1.json", "env-1-0.json", "env-1-1.json"]
    tokens, dirs = set(), []
    for name, env in envs.items():
        _, node_rank, local_rank = name.removesuffix(".json").split("-")
        assert env["WORLD_SIZE"] == "2" and env["RANK"] == node_rank  # the agent's variables win
        assert env["LOCAL_RANK"] == local_rank and env["LOCAL_WORLD_SIZE"] == "2"
        assert env["FF_DEVICE_INDEX"] == local_rank
        assert f"{env['MASTER_IP']}:{env['MASTER_PORT']}" == run.master_address
        assert env["MARSV2_TASK_ID"] == str(task.task_id) and env["MARSV2_RUN_ID"] == str(run.run_id)
        assert env["MARSV2_WHOLE_LIFE_STATE"] == "0" and env["MY_VAR"] == "x"
        assert env["private"] == []  # nothing of the agent's own settings (its cluster token) leaks
        # The cluster's client variables (hf3fs.connect(), hf3fs, fireflyer, hfai): the run's token, the cluster.
        assert env["FF_TOKEN"] == env["HFAI_TOKEN"] and env["FF_MGMTD_ADDRESSES"] == cluster.mgmtd.address
        dirs += [env["HFAI_RUN_DIR"], env["cwd"]]
        tokens.add(env["HFAI_TOKEN"])
    assert all(await asyncio.to_thread(lambda: [os.path.isdir(d) for d in dirs]))
    assert len(tokens) == 1 and "" not in tokens and CLUSTER_TOKEN not in tokens  # one token per run
    # The run's token (alice's while the run runs: services/scheduler/tests/integration/test_run_tokens.py) is
    # revoked once the run has ended.
    as_task = cluster.client("alice")
    as_task.rpc = RpcClient(token=tokens.pop(), timeout_s=10.0)
    deadline = asyncio.get_running_loop().time() + 20
    while True:
        try:
            await as_task.call(as_task.user.GetTask, pb.GetTaskRequest(task_id=task.task_id))
        except RpcError as err:
            assert err.code is grpc.StatusCode.UNAUTHENTICATED, err
            break
        assert asyncio.get_running_loop().time() < deadline, "the ended run's token still works"
        await asyncio.sleep(0.2)


def _start(agent_pb: type, **kw: object) -> agent_pb2.StartRunRequest:
    base: dict[str, object] = dict(
        task_id=9,
        run_id=99,
        argv=[sys.executable, "-c", "import time; time.sleep(60)"],
        node_rank=0,
        num_nodes=1,
        master_ip="127.0.0.1",
        master_port=2222,
        token="t",
    )
    base.update(kw)
    return agent_pb2.StartRunRequest(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"device_indices": [0, 5]}, "no devices [5]"),
        ({"argv": ["/no/such/program"]}, "command not found"),
        ({"argv": ["no-such-program-xyz"]}, "command not found"),
        ({"argv": []}, "command is empty"),
        ({"token": ""}, "no token"),
        ({"node_rank": 2, "num_nodes": 2}, "node_rank"),
        ({"working_dir": "/no/such/dir"}, "working_dir"),
    ],
)
async def test_bad_start_orders_are_refused_and_launch_nothing(
    cluster: Any, change: dict[str, object], says: str
) -> None:
    agent = await cluster.add_agent("a1")
    channel = open_channel(agent.address)
    stub = agent_pb2_grpc.AgentServiceStub(channel)
    rpc = RpcClient(token=CLUSTER_TOKEN, timeout_s=10.0)
    try:
        with pytest.raises(RpcError) as err:
            await rpc.unary(stub.StartRun, _start(agent_pb2, **change))
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert says in err.value.details
        assert not list((agent.state_dir / "runs").iterdir())  # nothing launched, no run folder
        # A user's token may not give orders to an agent.
        user = RpcClient(token=cluster.tokens["alice"], timeout_s=10.0)
        with pytest.raises(RpcError) as denied:
            await user.unary(stub.StartRun, _start(agent_pb2))
        assert denied.value.code == grpc.StatusCode.PERMISSION_DENIED
        assert not list((agent.state_dir / "runs").iterdir())
        assert procs.session_members([]) == {}
    finally:
        await channel.close()
