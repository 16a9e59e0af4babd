"""The scheduler process killed mid-run and started again on the same database: no task lost, none run twice."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

from ff_scheduler.core import priority as p
from ff_testing.mgmtd import CLUSTER_TOKEN
from ff_testing.scheduler import AgentDriver, SchedulerClient, set_quota, spawn_process, spec, task_of
from ff_testing.waiting import eventually
from fireflyer.scheduler.v1 import scheduler_pb2 as pb


async def test_restart_mid_run_loses_no_task_and_runs_none_twice(
    db_url: str, tmp_path: Path, registry: Any, unused_tcp_port: int
) -> None:
    mgmtd, tokens = registry
    listen = f"127.0.0.1:{unused_tcp_port}"
    proc = await spawn_process(tmp_path, db_url, mgmtd.address, CLUSTER_TOKEN, listen_address=listen).ready()
    agent = await AgentDriver(listen, mgmtd.address, CLUSTER_TOKEN).start()
    alice, root = SchedulerClient(listen, tokens["alice"]), SchedulerClient(listen, tokens["root"])
    try:
        await set_quota(root, "alice", p.NORMAL, 1)
        first = (await alice.call(alice.user.SubmitTask, pb.SubmitTaskRequest(spec=spec(1)))).task
        second = (await alice.call(alice.user.SubmitTask, pb.SubmitTaskRequest(spec=spec(1)))).task

        async def running() -> bool:
            return (await task_of(alice, first.task_id)).current_run.state == pb.RUN_STATE_RUNNING

        await eventually(running, what="the first task running")
        run_id = agent.starts[0].run_id
        proc.proc.send_signal(signal.SIGKILL)
        proc.proc.wait(timeout=10)

        proc = await spawn_process(
            tmp_path, db_url, mgmtd.address, CLUSTER_TOKEN, name="s2", listen_address=listen
        ).ready()
        t = await task_of(alice, first.task_id)
        assert t.state == pb.TASK_STATE_RUNNING and t.current_run.run_id == run_id and t.num_runs == 1
        assert (await task_of(alice, second.task_id)).state == pb.TASK_STATE_QUEUED
        await agent.report(run_id, pb.NODE_RUN_PHASE_EXITED)

        async def both_done() -> bool:
            a, b = await task_of(alice, first.task_id), await task_of(alice, second.task_id)
            if b.current_run.state == pb.RUN_STATE_RUNNING:
                await agent.report(b.current_run.run_id, pb.NODE_RUN_PHASE_EXITED)
            return a.state == pb.TASK_STATE_SUCCEEDED and b.state == pb.TASK_STATE_SUCCEEDED

        await eventually(both_done, what="both tasks done")
        assert {s.task_id: s.run_id for s in agent.starts} == {
            first.task_id: run_id,
            second.task_id: agent.starts[-1].run_id,
        }
        assert (await task_of(alice, first.task_id)).num_runs == 1
        assert (await task_of(alice, second.task_id)).num_runs == 1
    finally:
        await agent.close()
        await alice.close()
        await root.close()
        proc.proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(proc.proc.wait, 15)  # off the loop: mgmtd here answers the scheduler's last calls
