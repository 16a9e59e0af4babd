"""A checkpoint report the scheduler refuses (it checks reported checkpoints in 3FS) is dropped by the agent,
so the events the task wrote after it, go_suspend() here, still reach the scheduler."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ff_testing import free_port
from ff_testing.agent import wait_task
from ff_testing.mgmtd import CLUSTER_TOKEN
from ff_testing.scheduler import spec
from ff_testing.scheduler import start_in_process as start_scheduler
from fireflyer.scheduler.v1 import scheduler_pb2 as pb

TASK = """
from hfai import client
if client.get_whole_life_state() == 0:
    client.set_whole_life_state(1)
    client.report_checkpoint("relative/ckpt.json", 3)  # not a 3FS path: the scheduler refuses it
    client.go_suspend(timeout_s=60)
print("second run", flush=True)
"""


async def test_a_refused_checkpoint_does_not_hold_back_go_suspend(
    cluster: Any, sqlite_url: str, tmp_path: Path
) -> None:
    await cluster.scheduler.shutdown()  # the same database, now checking checkpoints
    cluster.scheduler = await start_scheduler(
        tmp_path,
        sqlite_url,
        cluster.mgmtd.address,
        CLUSTER_TOKEN,
        master_port=free_port(),
        ack_window_s=5.0,
        default_grace_s=10.0,
        term_grace_s=2.0,
        stop_timeout_s=20.0,
        check_checkpoints=True,
    )
    await cluster.add_agent("a1")
    script = tmp_path / "task.py"
    script.write_text(TASK)
    alice = cluster.client("alice")
    resp = await alice.call(alice.user.SubmitTask, pb.SubmitTaskRequest(spec=spec(1, 10, argv=["python", str(script)])))
    done = await wait_task(alice, resp.task.task_id, pb.TASK_STATE_SUCCEEDED, pb.TASK_STATE_FAILED, timeout_s=60)
    assert done.state == pb.TASK_STATE_SUCCEEDED, done
    first = done.runs[0]
    assert first.end_reason == pb.RUN_END_REASON_SUSPENDED_BY_USER, first  # go_suspend() got through
    assert not first.last_checkpoint.path  # and the refused checkpoint was not counted
