"""The service preempts the cheapest victim: the running task whose reported checkpoint leaves the least work at
risk, not HAI's latest submitted; real gRPC both ways (users -> scheduler -> agent drivers -> scheduler)."""

from __future__ import annotations

import asyncio
from typing import Any

from ff_scheduler.core import priority as p
from ff_testing.scheduler import set_quota, spec, task_of
from ff_testing.waiting import eventually
from fireflyer.scheduler.v1 import scheduler_pb2 as pb


async def _three_low_tasks_one_checkpointed(cluster: Any) -> tuple[list[int], int]:
    """Alice's LOW tasks A, B, C on one node each; B reports a checkpoint taken now, A and C none.

    Returns:
        The task ids A, B, C and the id of bob's HIGH task submitted then (it needs one node: none is free).
    """
    agents = [await cluster.add_agent(num_devices=1) for _ in range(3)]
    root, alice, bob = cluster.client("root"), cluster.client("alice"), cluster.client("bob")
    await set_quota(root, "alice", p.LOW, 3)
    await set_quota(root, "bob", p.HIGH, 1)
    ids = []
    for name in "ABC":
        task = (await alice.call(alice.user.SubmitTask, pb.SubmitTaskRequest(spec=spec(1, p.LOW, name=name)))).task
        ids.append(task.task_id)

    async def all_running() -> bool:
        tasks = [await task_of(alice, t) for t in ids]
        return all(t.current_run.state == pb.RUN_STATE_RUNNING for t in tasks)

    await eventually(all_running, what="A, B and C running")
    await asyncio.sleep(1.0)  # A and C have a second of work at risk; B's checkpoint leaves none
    b_run = (await task_of(alice, ids[1])).current_run.run_id
    (agent_of_b,) = [a for a in agents if b_run in a.task_of]
    await agent_of_b.checkpoint(b_run, step=10)
    high = (await bob.call(bob.user.SubmitTask, pb.SubmitTaskRequest(spec=spec(1, p.HIGH)))).task
    return ids, high.task_id


async def _preempted(cluster: Any, ids: list[int], high_id: int) -> set[int]:
    alice, bob = cluster.client("alice"), cluster.client("bob")

    async def high_running() -> bool:
        return (await task_of(bob, high_id)).current_run.state == pb.RUN_STATE_RUNNING

    await eventually(high_running, what="the HIGH task running")
    preempted = set()
    for task_id in ids:
        task = await task_of(alice, task_id)
        if any(r.end_reason == pb.RUN_END_REASON_PREEMPTED for r in task.runs):
            preempted.add(task_id)
    return preempted


async def test_the_service_preempts_the_task_that_just_checkpointed(cluster: Any) -> None:
    # no 3FS here (haiscale's tests check with one)
    await cluster.restart_scheduler(check_checkpoints=False, victim_choice="cheapest")
    ids, high_id = await _three_low_tasks_one_checkpointed(cluster)
    assert await _preempted(cluster, ids, high_id) == {ids[1]}


async def test_by_default_hai_order_preempts_the_latest_submitted(cluster: Any) -> None:
    await cluster.restart_scheduler(check_checkpoints=False)
    ids, high_id = await _three_low_tasks_one_checkpointed(cluster)
    assert await _preempted(cluster, ids, high_id) == {ids[2]}
