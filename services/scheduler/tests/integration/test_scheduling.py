"""Submit, schedule, suspend (acknowledged or not), early eviction on a committed checkpoint, re-queue and
resume with whole_life_state: real gRPC both ways (users -> scheduler -> agent drivers -> scheduler)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ff_scheduler.core import priority as p
from ff_testing.scheduler import IGNORE, set_quota, spec, task_of
from ff_testing.waiting import eventually
from fireflyer.scheduler.v1 import scheduler_pb2 as pb


async def test_preempt_suspend_requeue_and_resume_with_whole_life_state(cluster: Any) -> None:
    a1, a2 = await cluster.add_agent(), await cluster.add_agent()
    root, alice, bob = cluster.client("root"), cluster.client("alice"), cluster.client("bob")
    await set_quota(root, "alice", p.LOW, 2)
    await set_quota(root, "bob", p.HIGH, 2)
    low = (await alice.call(alice.user.SubmitTask, pb.SubmitTaskRequest(spec=spec(2, p.LOW)))).task
    assert low.state == pb.TASK_STATE_QUEUED and low.priority == p.LOW

    async def running(task_id: int, client: object = alice) -> bool:
        t = await task_of(alice if client is alice else bob, task_id)
        return t.state == pb.TASK_STATE_RUNNING and t.current_run.state == pb.RUN_STATE_RUNNING

    await eventually(lambda: running(low.task_id), what="the LOW task running")
    starts = sorted(a1.starts + a2.starts, key=lambda s: s.node_rank)
    assert [(s.node_rank, s.num_nodes, s.whole_life_state) for s in starts] == [(0, 2, 0), (1, 2, 0)]
    assert {s.master_ip for s in starts} == {"127.0.0.1"} and starts[0].master_port == 2222
    # One request per run copied per node: what differs per node is its rank and its own devices.
    assert [list(s.device_indices) for s in starts] == [[0, 1], [0, 1]]
    assert {(s.task_id, s.user_name, tuple(s.argv), s.priority) for s in starts} == {
        (low.task_id, "alice", ("python", "train.py"), p.LOW)
    }
    first_run = starts[0].run_id
    agent0 = a1 if a1.starts and a1.starts[0].node_rank == 0 else a2
    await agent0.update_run(first_run, whole_life_state=42)

    high = (await bob.call(bob.user.SubmitTask, pb.SubmitTaskRequest(spec=spec(2, p.HIGH)))).task
    await eventually(lambda: running(high.task_id, bob), what="the HIGH task running")
    assert {s.run_id for s in a1.suspends + a2.suspends} == {first_run}
    assert {s.run_id for s in a1.stops + a2.stops} == {first_run}
    suspended = await task_of(alice, low.task_id)
    assert suspended.state == pb.TASK_STATE_SUSPENDED and suspended.whole_life_state == 42
    assert suspended.runs[0].end_reason == pb.RUN_END_REASON_PREEMPTED
    assert suspended.runs[0].state == pb.RUN_STATE_SUSPENDED

    high_run = (await task_of(bob, high.task_id)).current_run.run_id
    for agent in (a1, a2):
        await agent.report(high_run, pb.NODE_RUN_PHASE_EXITED)
    await eventually(lambda: running(low.task_id), what="the LOW task resumed")
    done = await task_of(bob, high.task_id)
    assert done.state == pb.TASK_STATE_SUCCEEDED and done.end_reason == pb.RUN_END_REASON_COMPLETED
    resumed = await task_of(alice, low.task_id)
    assert resumed.num_runs == 2 and resumed.current_run.run_index == 1
    assert resumed.current_run.start_whole_life_state == 42
    second = [s for s in a1.starts + a2.starts if s.run_id == resumed.current_run.run_id]
    assert len({s.node_rank for s in second}) == 2 and {s.whole_life_state for s in second} == {42}


async def test_suspend_without_acknowledgment_is_forced_after_the_window(cluster: Any) -> None:
    agent = await cluster.add_agent(suspend_mode=IGNORE)
    root, alice = cluster.client("root"), cluster.client("alice")
    await set_quota(root, "alice", p.NORMAL, 1)
    task = (await alice.call(alice.user.SubmitTask, pb.SubmitTaskRequest(spec=spec(1)))).task
    await agent.wait_for(lambda: bool(agent.starts))
    await eventually(lambda: _run_state(alice, task.task_id, pb.RUN_STATE_RUNNING))
    resp = await alice.call(alice.user.SuspendTask, pb.SuspendTaskRequest(task_id=task.task_id))
    assert resp.task.current_run.state == pb.RUN_STATE_SUSPENDING
    await agent.wait_for(lambda: bool(agent.suspends))
    assert agent.suspends[0].ack_window_s == 1.0 and not agent.stops
    await agent.wait_for(lambda: bool(agent.stops), timeout_s=5)
    back = await task_of(alice, task.task_id)
    assert "not acknowledged" in back.runs[0].end_message
    await eventually(lambda: _run_state(alice, task.task_id, pb.RUN_STATE_RUNNING, run_index=1), what="resumed")
    assert (await task_of(alice, task.task_id)).runs[0].end_reason == pb.RUN_END_REASON_SUSPENDED_BY_USER


async def test_checkpoint_taken_after_the_flag_evicts_before_the_grace_ends(cluster: Any) -> None:
    await cluster.restart_scheduler(check_checkpoints=False)  # no 3FS here (haiscale's tests check with one)
    agent = await cluster.add_agent(suspend_mode="ack_only")
    root, alice = cluster.client("root"), cluster.client("alice")
    await set_quota(root, "alice", p.NORMAL, 1)
    spec_ = spec(1, suspend_grace_s=10.0)  # the task asks for a long grace
    task = (await alice.call(alice.user.SubmitTask, pb.SubmitTaskRequest(spec=spec_))).task
    await eventually(lambda: _run_state(alice, task.task_id, pb.RUN_STATE_RUNNING))
    await alice.call(alice.user.SuspendTask, pb.SuspendTaskRequest(task_id=task.task_id))
    await agent.wait_for(lambda: bool(agent.suspends))
    assert agent.suspends[0].grace_s == 10.0
    run_id = agent.suspends[0].run_id
    await eventually(lambda: _stage(alice, task.task_id, pb.SUSPEND_STAGE_RECEIVED), what="acknowledged")
    # A periodic save begun before rank 0 read the flag commits now: it lacks the steps since, so it must not
    # end the run (the task is saving again). Several ticks (0.1 s apart) see it; none stops the run.
    await agent.checkpoint(run_id, step=90, taken_at=time.time() - 5)
    assert (await task_of(alice, task.task_id)).current_run.last_checkpoint.step == 90
    await asyncio.sleep(0.5)
    assert not agent.stops and (await task_of(alice, task.task_id)).current_run.state == pb.RUN_STATE_SUSPENDING
    await agent.checkpoint(run_id, step=100)  # taken now: after the flag was read
    await agent.wait_for(lambda: bool(agent.stops), timeout_s=3)  # well within the 10 s grace
    t = await task_of(alice, task.task_id)
    assert t.runs[0].last_checkpoint.step == 100
    assert "checkpoint committed" in t.runs[0].end_message


async def test_go_suspend_without_a_pending_suspend_requeues_the_task(cluster: Any) -> None:
    agent = await cluster.add_agent()
    root, alice = cluster.client("root"), cluster.client("alice")
    await set_quota(root, "alice", p.NORMAL, 1)
    task = (await alice.call(alice.user.SubmitTask, pb.SubmitTaskRequest(spec=spec(1)))).task
    await eventually(lambda: _run_state(alice, task.task_id, pb.RUN_STATE_RUNNING))
    await agent.suspend_stage(agent.starts[0].run_id, pb.SUSPEND_STAGE_CAN_SUSPEND)
    await eventually(lambda: _run_state(alice, task.task_id, pb.RUN_STATE_RUNNING, run_index=1), what="re-run")
    assert (await task_of(alice, task.task_id)).runs[0].end_reason == pb.RUN_END_REASON_SUSPENDED_BY_USER


async def _run_state(client: object, task_id: int, state: int, run_index: int = 0) -> bool:
    t = await task_of(client, task_id)  # type: ignore[arg-type]
    return t.current_run.state == state and t.current_run.run_index == run_index


async def _stage(client: object, task_id: int, stage: int) -> bool:
    return (await task_of(client, task_id)).current_run.suspend_stage == stage  # type: ignore[arg-type]
