"""The validator on a real node: a healthy node passes every check; a check forced to fail by the test
switch moves the node to err_nodes and new tasks avoid it; only admins (or the scheduler) may run it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from typing import Any

import grpc
import pytest

from ff_agent.validator import ALL_CHECKS
from ff_rpc import RpcClient, RpcError, open_channel
from ff_testing.agent import start_in_process, wait_run_running, wait_task
from ff_testing.mgmtd import CLUSTER_TOKEN
from ff_testing.scheduler import spec
from ff_testing.waiting import eventually
from fireflyer.agent.v1 import agent_pb2, agent_pb2_grpc
from fireflyer.scheduler.v1 import scheduler_pb2 as pb


async def test_validation_passes_on_a_healthy_node_and_a_forced_fault_sends_a_node_to_err_nodes(cluster: Any) -> None:
    good = await cluster.add_agent("good")
    bad = await cluster.add_agent("bad", validator_force_fail="memory_pattern")
    env = {
        **os.environ,
        "HFAI_SERVER": cluster.scheduler.address,
        "HFAI_TOKEN": cluster.tokens["root"],
        "HFAI_CONFIG": str(cluster.folder / "no-hfai-conf.json"),
    }
    cli = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hfai", "validate", env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    printed = (await cli.communicate())[0].decode()
    assert cli.returncode == 0, printed
    assert f"validating nodes {sorted([good.node_id, bad.node_id])}" in printed

    async def validated() -> bool:
        return all(n.last_validation.finished_at > 0 for n in await cluster.nodes())

    await eventually(validated, timeout_s=120, what="both nodes validated")
    nodes = {n.node_id: n for n in await cluster.nodes()}
    ok, broken = nodes[good.node_id], nodes[bad.node_id]
    assert ok.last_validation.passed and ok.state == pb.NODE_STATE_READY
    assert [c.name for c in ok.last_validation.checks] == list(ALL_CHECKS)
    assert all(c.passed and c.duration_s > 0 for c in ok.last_validation.checks), ok.last_validation
    figures = {c.name: c for c in ok.last_validation.checks}
    assert figures["memory_bandwidth"].value > 0 and figures["disk_throughput"].value > 0
    assert figures["allreduce"].value == 0.0 and figures["memory_pattern"].value == 0.0
    assert not broken.last_validation.passed and broken.state == pb.NODE_STATE_ERR
    failed = [c for c in broken.last_validation.checks if not c.passed]
    assert [c.name for c in failed] == ["memory_pattern"] and "test switch" in failed[0].message

    alice = cluster.client("alice")
    for _ in range(2):
        task = (
            await alice.call(
                alice.user.SubmitTask, pb.SubmitTaskRequest(spec=spec(1, 10, argv=["python", "-c", "print(1)"]))
            )
        ).task
        done = await wait_task(alice, task.task_id, pb.TASK_STATE_SUCCEEDED)
        assert [n.node_id for n in done.current_run.nodes] == [good.node_id]


async def test_validate_node_is_for_admins_and_refused_while_a_run_is_active(cluster: Any, tmp_path: Any) -> None:
    agent = await cluster.add_agent("a1")
    channel = open_channel(agent.address)
    stub = agent_pb2_grpc.AgentServiceStub(channel)
    try:
        user = RpcClient(token=cluster.tokens["alice"], timeout_s=60.0)
        with pytest.raises(RpcError) as denied:
            await user.unary(stub.ValidateNode, agent_pb2.ValidateNodeRequest(checks=["cpu_stress"]))
        assert denied.value.code == grpc.StatusCode.PERMISSION_DENIED
        admin = RpcClient(token=cluster.tokens["root"], timeout_s=60.0)
        with pytest.raises(RpcError) as unknown:
            await admin.unary(stub.ValidateNode, agent_pb2.ValidateNodeRequest(checks=["no_such_check"]))
        assert unknown.value.code == grpc.StatusCode.INVALID_ARGUMENT
        alice = cluster.client("alice")
        task = (
            await alice.call(
                alice.user.SubmitTask,
                pb.SubmitTaskRequest(spec=spec(1, 10, argv=[sys.executable, "-c", "import time; time.sleep(60)"])),
            )
        ).task
        await wait_run_running(alice, task.task_id)
        with pytest.raises(RpcError) as busy:
            await admin.unary(stub.ValidateNode, agent_pb2.ValidateNodeRequest(checks=["cpu_stress"]))
        assert busy.value.code == grpc.StatusCode.FAILED_PRECONDITION
        forced = await admin.unary(stub.ValidateNode, agent_pb2.ValidateNodeRequest(checks=["cpu_stress"], force=True))
        assert [c.name for c in forced.validation.checks] == ["cpu_stress"] and forced.validation.passed
        await alice.call(alice.user.StopTask, pb.StopTaskRequest(task_id=task.task_id))
        await wait_task(alice, task.task_id, pb.TASK_STATE_STOPPED)
    finally:
        await channel.close()


async def test_the_scheduled_validation_reports_by_itself(cluster: Any) -> None:
    agent = await start_in_process(
        cluster.folder,
        cluster.mgmtd.address,
        CLUSTER_TOKEN,
        "sched",
        scheduler_address=cluster.scheduler.address,
        validate_at_start=True,
        validator_force_fail="gemm",
    )
    cluster.agents.append(agent)

    async def in_err_nodes() -> bool:
        nodes = {n.node_id: n for n in await cluster.nodes()}
        node = nodes.get(agent.node_id)
        return node is not None and node.state == pb.NODE_STATE_ERR and node.last_validation.finished_at > 0

    await eventually(in_err_nodes, timeout_s=120, what="the node in err_nodes after its own validation")
    node = next(n for n in await cluster.nodes() if n.node_id == agent.node_id)
    assert [c.name for c in node.last_validation.checks if not c.passed] == ["gemm"]
    assert "validation" in node.state_reason
