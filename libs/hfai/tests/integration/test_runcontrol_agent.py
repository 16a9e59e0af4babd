"""A real agent relaying what a hostile rank wrote to its run-control file: the lines no SDK call writes are
dropped, and the agent goes on supervising (before, one such line failed every tick of the agent: no event after
it was relayed, no run of the node reaped or stopped)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ff_testing import free_port
from ff_testing.agent import InProcessAgent, start_in_process, wait_task
from ff_testing.mgmtd import CLUSTER_TOKEN, running_with_users
from ff_testing.scheduler import SchedulerCluster, running_scheduler, set_quota, spec
from ff_testing.waiting import eventually
from fireflyer.scheduler.v1 import scheduler_pb2 as pb

# check_checkpoints off: no 3FS here; the protocol deadlines short, as the agent's own tests have them
SCHEDULER = {"ack_window_s": 5.0, "default_grace_s": 10.0, "term_grace_s": 2.0, "stop_timeout_s": 20.0}

TASK = """
import json, os
from hfai import client, runcontrol
if client.get_whole_life_state() == 0:
    client.set_whole_life_state(1)
    events = os.path.join(os.environ[runcontrol.RUN_DIR_ENV], runcontrol.EVENTS_FILE)
    with open(events, "ab") as f:  # what no SDK call writes: a step past int64, a megabyte of junk
        f.write(json.dumps({"seq": 1, "kind": "checkpoint", "path": "/x/c", "step": 2**70}).encode() + b"\\n")
        f.write(b"x" * (1 << 20) + b"\\n")
    client.report_checkpoint("/x/ckpt.json", 7)
    client.go_suspend(timeout_s=60)
print("second run", flush=True)
"""


@pytest.fixture
async def cluster(sqlite_url: str, tmp_path: Path) -> AsyncIterator[tuple[SchedulerCluster, InProcessAgent]]:
    async with running_with_users(tmp_path, sqlite_url) as (mgmtd, tokens):
        settings: dict[str, Any] = {"master_port": free_port(), "check_checkpoints": False, **SCHEDULER}
        async with running_scheduler(tmp_path, sqlite_url, mgmtd, tokens, **settings) as c:
            await set_quota(c.client("root"), "alice", 10, 1)
            agent = await start_in_process(
                tmp_path, mgmtd.address, CLUSTER_TOKEN, "a1", scheduler_address=c.scheduler.address
            )
            try:
                root = c.client("root")

                async def ready() -> bool:
                    nodes = (await root.call(root.user.ListNodes, pb.ListNodesRequest())).nodes
                    return any(n.state == pb.NODE_STATE_READY for n in nodes)

                await eventually(ready, what="the agent's node ready")
                yield c, agent
            finally:
                await agent.shutdown()


async def test_a_hostile_event_line_does_not_stop_the_agent_relaying(cluster: Any, tmp_path: Path) -> None:
    c, _ = cluster
    script = tmp_path / "task.py"
    script.write_text(TASK)
    alice = c.client("alice")
    resp = await alice.call(alice.user.SubmitTask, pb.SubmitTaskRequest(spec=spec(1, 10, argv=["python", str(script)])))
    done = await wait_task(alice, resp.task.task_id, pb.TASK_STATE_SUCCEEDED, pb.TASK_STATE_FAILED, timeout_s=60)
    assert done.state == pb.TASK_STATE_SUCCEEDED, done
    first = done.runs[0]
    assert first.end_reason == pb.RUN_END_REASON_SUSPENDED_BY_USER, first  # go_suspend() came after the junk
    assert (first.last_checkpoint.path, first.last_checkpoint.step) == ("/x/ckpt.json", 7)  # and the good report
