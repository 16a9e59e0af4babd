"""Hang detection with a real hfreduce group: one rank stops entering collectives; the agent of its node
reads the group's sequence numbers, names that rank, and the scheduler ends the run with it as the cause."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ff_agent.testing import eventually, wait_run_running, wait_task
from ff_mgmtd.testing import CLUSTER_TOKEN
from ff_rpc import RpcClient, open_channel
from ff_scheduler.testing import spec
from fireflyer.agent.v1 import agent_pb2, agent_pb2_grpc
from fireflyer.scheduler.v1 import scheduler_pb2 as pb

ALLREDUCE_LOOP = """
import os, time
import numpy as np
from hfreduce import Group
group = Group.from_env()
buf = np.ones(1024, dtype=np.float32)
stuck = os.environ["RANK"] == "1" and os.environ["LOCAL_RANK"] == "1"
for step in range(100000):
    if stuck and step == 5:
        print("rank 3 stops entering collectives", flush=True)
        time.sleep(600)
    group.allreduce(buf)
    buf[:] = 1.0
    time.sleep(0.02)
"""


async def test_a_rank_that_stops_entering_collectives_is_named_as_hung(cluster: Any, tmp_path: Path) -> None:
    a1 = await cluster.add_agent("a1", hang_threshold_s=3.0)
    a2 = await cluster.add_agent("a2", hang_threshold_s=3.0)
    script = tmp_path / "loop.py"
    script.write_text(ALLREDUCE_LOOP)
    alice = cluster.client("alice")
    task_spec = spec(2, 10, argv=["python", str(script)], max_restarts=0, env={"FF_HFREDUCE_TIMEOUT_S": "120"})
    task = (await alice.call(alice.user.SubmitTask, pb.SubmitTaskRequest(spec=task_spec))).task
    running = await wait_run_running(alice, task.task_id)
    run = running.current_run
    node1 = next(n.node_id for n in run.nodes if n.node_rank == 1)
    agent1 = a1 if a1.node_id == node1 else a2
    channel = open_channel(agent1.address)
    stub = agent_pb2_grpc.AgentServiceStub(channel)
    rpc = RpcClient(token=CLUSTER_TOKEN, timeout_s=10.0)
    try:
        seen: list[agent_pb2.GetCollectiveProgressResponse] = []

        async def progress_shows_the_lag() -> bool:
            resp = await rpc.unary(
                stub.GetCollectiveProgress,
                agent_pb2.GetCollectiveProgressRequest(task_id=task.task_id, run_id=run.run_id),
            )
            seen[:] = [resp]
            ranks = {r.local_rank: r for r in resp.ranks}
            return len(ranks) == 2 and ranks[1].completed_seq == 5 and ranks[0].current_seq == 6

        await eventually(progress_shows_the_lag, timeout_s=60, what="node 1's progress showing local rank 1 behind")
        ranks = {r.local_rank: r for r in seen[0].ranks}
        assert ranks[1].group_rank == 3 and ranks[0].group_rank == 2 and ranks[0].current_op
    finally:
        await channel.close()
    done = await wait_task(alice, task.task_id, pb.TASK_STATE_FAILED, timeout_s=60)
    assert done.current_run.end_reason == pb.RUN_END_REASON_HANG_DETECTED
    failure = done.current_run.failure
    assert failure.hang
    assert failure.node_id == node1 and failure.node_rank == 1 and failure.local_rank == 1
    assert failure.failure_class == pb.FAILURE_CLASS_INFRASTRUCTURE
    assert "hang: rank 3 (node rank 1, local rank 1)" in failure.message, failure
