"""Failures: lease loss re-queues (then the restart limit fails the task), the watchdog, err_nodes."""

from __future__ import annotations

from typing import Any

import pytest

from ff_scheduler.core import priority as p
from ff_testing.scheduler import set_quota, spec, task_of
from ff_testing.waiting import eventually
from fireflyer.scheduler.v1 import scheduler_pb2 as pb


@pytest.fixture
def mgmtd_settings() -> dict[str, Any]:
    """A 2 s node lease (the suite's is 4 s): the lease-loss test waits for two of them to lapse; heartbeats
    every 0.25 s still leave 8 beats a lease, as the storage tests' 2 s lease does."""
    return {"lease_duration_s": 2.0}


async def test_lease_loss_requeues_on_a_healthy_node_then_the_restart_limit_fails_it(cluster: Any) -> None:
    first = await cluster.add_agent()
    root, alice = cluster.client("root"), cluster.client("alice")
    await set_quota(root, "alice", p.NORMAL, 1)
    task = (await alice.call(alice.user.SubmitTask, pb.SubmitTaskRequest(spec=spec(1, max_restarts=1)))).task
    await first.wait_for(lambda: bool(first.starts))
    second = await cluster.add_agent()
    first.lose_lease()  # mgmtd declares it dead after its 2 s lease

    async def on_second() -> bool:
        t = await task_of(alice, task.task_id)
        return t.current_run.run_index == 1 and t.current_run.state == pb.RUN_STATE_RUNNING

    await eventually(on_second, timeout_s=20, what="the task re-run on the healthy node")
    t = await task_of(alice, task.task_id)
    assert t.num_restarts == 1 and t.runs[0].end_reason == pb.RUN_END_REASON_NODE_LOST
    assert t.runs[0].failure.node_id == first.node_id and [n.node_id for n in t.current_run.nodes] == [second.node_id]
    nodes = {n.node_id: n for n in (await root.call(root.user.ListNodes, pb.ListNodesRequest())).nodes}
    assert nodes[first.node_id].state == pb.NODE_STATE_OFFLINE

    second.lose_lease()

    async def failed() -> bool:
        return (await task_of(alice, task.task_id)).state == pb.TASK_STATE_FAILED

    await eventually(failed, timeout_s=20, what="the task failed")
    t = await task_of(alice, task.task_id)
    assert t.end_reason == pb.RUN_END_REASON_NODE_LOST and "restart limit 1 reached" in t.end_message


async def test_silent_task_fails_by_watchdog(cluster: Any) -> None:
    agent = await cluster.add_agent()
    root, alice = cluster.client("root"), cluster.client("alice")
    await set_quota(root, "alice", p.NORMAL, 1)
    task = (await alice.call(alice.user.SubmitTask, pb.SubmitTaskRequest(spec=spec(1, watchdog_time_s=1.0)))).task
    await agent.wait_for(lambda: bool(agent.stops), timeout_s=10)
    assert agent.stops[0].reason == pb.RUN_END_REASON_WATCHDOG_TIMEOUT

    async def failed() -> bool:
        return (await task_of(alice, task.task_id)).state == pb.TASK_STATE_FAILED

    await eventually(failed, what="the watchdog failure")
    t = await task_of(alice, task.task_id)
    assert t.end_reason == pb.RUN_END_REASON_WATCHDOG_TIMEOUT and "no log output for 1 s" in t.end_message
    assert t.num_runs == 1  # no restart after a watchdog failure


async def test_node_failing_runs_repeatedly_goes_to_err_nodes_and_admin_enable_brings_it_back(cluster: Any) -> None:
    agent = await cluster.add_agent()
    root, alice = cluster.client("root"), cluster.client("alice")
    await set_quota(root, "alice", p.NORMAL, 1)
    task = (await alice.call(alice.user.SubmitTask, pb.SubmitTaskRequest(spec=spec(1, max_restarts=5)))).task
    for attempt in range(3):  # threshold 3: infrastructure failures in a row on this node
        await agent.wait_for(lambda n=attempt: len({s.run_id for s in agent.starts}) > n)
        run_id = agent.starts[-1].run_id
        await eventually(lambda r=run_id: _has_phase(agent, r))
        await agent.report(run_id, pb.NODE_RUN_PHASE_EXITED, exit_code=1, failure_class=pb.FAILURE_CLASS_INFRASTRUCTURE)

    async def err() -> bool:
        nodes = (await root.call(root.user.ListNodes, pb.ListNodesRequest())).nodes
        return nodes[0].state == pb.NODE_STATE_ERR

    await eventually(err, what="the node in err_nodes")
    node = (await root.call(root.user.ListNodes, pb.ListNodesRequest())).nodes[0]
    assert "3 runs failed on it in a row" in node.state_reason
    t = await task_of(alice, task.task_id)
    assert t.state == pb.TASK_STATE_SUSPENDED and t.num_restarts == 3

    async def waiting() -> bool:
        return (await task_of(alice, task.task_id)).queue_reason == pb.QUEUE_REASON_WAITING_FOR_NODES

    await eventually(waiting, what="the task waiting for nodes")

    resp = await root.call(root.user.SetNodeEnabled, pb.SetNodeEnabledRequest(node_id=agent.node_id, enabled=True))
    assert resp.node.state == pb.NODE_STATE_READY
    await agent.wait_for(lambda: len({s.run_id for s in agent.starts}) == 4)


async def test_admin_disables_a_busy_node_its_run_is_suspended(cluster: Any) -> None:
    agent = await cluster.add_agent()
    root, alice = cluster.client("root"), cluster.client("alice")
    await set_quota(root, "alice", p.NORMAL, 1)
    task = (await alice.call(alice.user.SubmitTask, pb.SubmitTaskRequest(spec=spec(1)))).task
    await agent.wait_for(lambda: bool(agent.starts))
    resp = await root.call(root.user.SetNodeEnabled, pb.SetNodeEnabledRequest(node_id=agent.node_id, enabled=False))
    assert resp.node.state == pb.NODE_STATE_ERR and resp.node.state_reason == "manually disabled by root"
    await agent.wait_for(lambda: bool(agent.stops))

    async def queued() -> bool:
        t = await task_of(alice, task.task_id)
        return t.state == pb.TASK_STATE_SUSPENDED

    await eventually(queued, what="the task queued again")


def _has_phase(agent: Any, run_id: int) -> Any:
    async def check() -> bool:
        return run_id in agent.phases

    return check()
