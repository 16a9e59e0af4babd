"""Hang detection with a real hfreduce group and three agents: one rank stops itself (SIGSTOP) in the middle
of training; the group's sequence numbers show it behind, the agent of its node sees its process stopped and
names that rank (after half the 6 s threshold), the scheduler
ends the run with it as the cause, cordons its node (err_nodes, the run and rank named) and places the
task's next run on the two other nodes; a passing validation returns the node."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ff_rpc import RpcClient, open_channel
from ff_testing.agent import wait_run_running, wait_task
from ff_testing.mgmtd import CLUSTER_TOKEN
from ff_testing.scheduler import spec
from ff_testing.waiting import eventually
from fireflyer.agent.v1 import agent_pb2, agent_pb2_grpc
from fireflyer.scheduler.v1 import scheduler_pb2 as pb
from hfai.cli import render_node

# Rank 3 (node rank 1, local rank 1) of the first run stops itself after 5 collectives; the next run does not.
ALLREDUCE_LOOP = """
import os, signal, sys, time
import numpy as np
from hfreduce import Group
group = Group.from_env()
buf = np.ones(1024, dtype=np.float32)
marker = os.path.join(sys.argv[1], "stopped")
stuck = os.environ["RANK"] == "1" and os.environ["LOCAL_RANK"] == "1" and not os.path.exists(marker)
for step in range(100000):
    if stuck and step == 5:
        open(marker, "w").close()
        print("rank 3 stops itself (SIGSTOP)", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
    group.allreduce(buf)
    buf[:] = 1.0
    time.sleep(0.02)
"""


async def test_a_rank_stopped_with_sigstop_is_named_its_node_cordoned_and_the_task_moves(
    cluster: Any, tmp_path: Path
) -> None:
    agents = [await cluster.add_agent(name, hang_threshold_s=6.0) for name in ("a1", "a2", "a3")]
    script = tmp_path / "loop.py"
    script.write_text(ALLREDUCE_LOOP)
    alice, root = cluster.client("alice"), cluster.client("root")
    argv = ["python", str(script), str(tmp_path)]
    task_spec = spec(2, 10, argv=argv, max_restarts=1, env={"FF_HFREDUCE_TIMEOUT_S": "120"})
    task = (await alice.call(alice.user.SubmitTask, pb.SubmitTaskRequest(spec=task_spec))).task
    running = await wait_run_running(alice, task.task_id)
    run = running.current_run
    node1 = next(n.node_id for n in run.nodes if n.node_rank == 1)
    await _progress_shows_the_lag(next(a for a in agents if a.node_id == node1).address, task.task_id, run.run_id)

    # The run ends with the hung rank as its cause; the task is queued again (a restart) and runs elsewhere.
    moved: list[pb.Task] = []

    async def second_run_running() -> bool:
        resp = await alice.call(alice.user.GetTask, pb.GetTaskRequest(task_id=task.task_id, include_runs=True))
        t: pb.Task = resp.task
        moved[:] = [t]
        return t.current_run.run_index == 1 and t.current_run.state == pb.RUN_STATE_RUNNING

    await eventually(second_run_running, timeout_s=60, what="the task's next run running")
    first, second = moved[0].runs[0], moved[0].current_run
    assert first.run_id == run.run_id and first.end_reason == pb.RUN_END_REASON_HANG_DETECTED
    failure = first.failure
    assert failure.hang and failure.failure_class == pb.FAILURE_CLASS_INFRASTRUCTURE
    assert failure.node_id == node1 and failure.node_rank == 1 and failure.local_rank == 1
    assert "hang: rank 3 (node rank 1, local rank 1) is stopped" in failure.message, failure
    assert moved[0].num_restarts == 1
    assert node1 not in {n.node_id for n in second.nodes} and len(second.nodes) == 2

    nodes = {n.node_id: n for n in (await root.call(root.user.ListNodes, pb.ListNodesRequest())).nodes}
    cordoned = nodes[node1]
    assert cordoned.state == pb.NODE_STATE_ERR
    assert cordoned.state_reason.startswith(f"cordoned: task {task.task_id} run {run.run_id}: hang: rank 3 ")
    assert [n.state for i, n in sorted(nodes.items()) if i != node1] == [pb.NODE_STATE_READY] * 2
    assert f"err (cordoned: task {task.task_id} run {run.run_id}: hang: rank 3" in render_node(cordoned)  # hfai nodes

    # A passing validation of the cordoned node returns it to scheduling.
    validating = await root.call(root.user.ValidateNodes, pb.ValidateNodesRequest(node_ids=[node1], checks=["gemm"]))
    assert list(validating.node_ids) == [node1]

    async def returned() -> bool:
        back = await root.call(root.user.ListNodes, pb.ListNodesRequest())
        node = next(n for n in back.nodes if n.node_id == node1)
        return node.state == pb.NODE_STATE_READY and node.last_validation.passed and not node.state_reason

    await eventually(returned, timeout_s=30, what="the cordoned node back after a passing validation")
    await alice.call(alice.user.StopTask, pb.StopTaskRequest(task_id=task.task_id))
    await wait_task(alice, task.task_id, pb.TASK_STATE_STOPPED)


async def _progress_shows_the_lag(agent_address: str, task_id: int, run_id: int) -> None:
    """The agent of node rank 1 shows its local rank 1 (group rank 3) stuck after collective 5."""
    channel = open_channel(agent_address)
    stub = agent_pb2_grpc.AgentServiceStub(channel)
    rpc = RpcClient(token=CLUSTER_TOKEN, timeout_s=10.0)
    try:
        seen: list[agent_pb2.GetCollectiveProgressResponse] = []

        async def lagging() -> bool:
            resp = await rpc.unary(
                stub.GetCollectiveProgress, agent_pb2.GetCollectiveProgressRequest(task_id=task_id, run_id=run_id)
            )
            seen[:] = [resp]
            ranks = {r.local_rank: r for r in resp.ranks}
            return len(ranks) == 2 and ranks[1].completed_seq == 5 and ranks[0].current_seq == 6

        await eventually(lagging, timeout_s=60, what="node 1's progress showing local rank 1 behind")
        ranks = {r.local_rank: r for r in seen[0].ranks}
        assert ranks[1].group_rank == 3 and ranks[0].group_rank == 2 and ranks[0].current_op
    finally:
        await channel.close()
