"""``fireflyer demo --quick`` on a fresh cluster: the facts behind what it prints, read from the services. The
trainer ran on 2 nodes, was preempted with a checkpoint in 3FS that is its user's and lost no step to it,
resumed from that checkpoint's step, its loss series in telemetry is steps 1..N without a gap, and another
user can read neither its checkpoint nor its data. (The faults of the full demo are tested at the service
level: services/agent/tests/integration/test_hang.py and test_faults.py.)"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

import hf3fs
from ff_appliance.demo_train import NUM_STEPS, TASK_NAME, TRAINER, URGENT, read_series
from ff_appliance.scheduler_setup import scheduler_address
from ff_appliance.scheduler_user import SchedulerUser, user_token
from ff_appliance.telemetry_setup import telemetry_endpoints
from ff_cluster import MgmtdClient
from fireflyer.scheduler.v1 import scheduler_pb2 as pb

from .conftest import Appliance

DEMO_TIMEOUT_S = 360.0  # about 100 s on a quiet 2-core machine


async def _facts(mgmtd: list[str], admin_token: str) -> dict[str, Any]:
    """The training task with its runs (as admin), the users' tokens, the telemetry address, node 0's log."""
    client = MgmtdClient(mgmtd, token=admin_token)
    try:
        address = await scheduler_address(client)
        http = (await telemetry_endpoints(client))["http"]
        tokens = {name: await user_token(client, name) for name in (TRAINER, URGENT)}
    finally:
        await client.close()
    admin = SchedulerUser(address, admin_token, timeout_s=10.0)
    trainer = SchedulerUser(address, tokens[TRAINER], timeout_s=10.0)
    try:
        listed = await admin.call("ListTasks", pb.ListTasksRequest(all_users=True, name_contains=TASK_NAME))
        (found,) = [t for t in listed.tasks if t.spec.name == TASK_NAME]
        request = pb.GetTaskRequest(task_id=found.task_id, include_runs=True)
        task = (await trainer.call("GetTask", request)).task
        logs = {}
        for run in task.runs:
            log = pb.StreamLogsRequest(task_id=task.task_id, node_rank=0, run_id=run.run_id)
            logs[run.run_id] = b"".join([c.data async for c in trainer.rpc.stream(trainer.stub.StreamLogs, log)])
    finally:
        await admin.close()
        await trainer.close()
    return {"task": task, "tokens": tokens, "http": http, "logs": logs}


@pytest.mark.timeout(DEMO_TIMEOUT_S + 120)
def test_demo_quick_trains_through_a_preemption(appliance: Appliance) -> None:
    appliance.ok("demo", "--quick", "--train-only", timeout_s=DEMO_TIMEOUT_S)
    plan = json.loads((appliance.state_dir / "plan.json").read_text())
    mgmtd = [f"{i['host']}:{i['grpc_port']}" for i in plan["instances"] if i["service"] == "mgmtd"]
    admin_token = (appliance.state_dir / "secrets" / "admin_token").read_text().strip()
    facts = asyncio.run(_facts(mgmtd, admin_token))
    task, tokens = facts["task"], facts["tokens"]

    assert task.user_name == TRAINER and task.state == pb.TASK_STATE_SUCCEEDED and len(task.runs) == 2, task
    first, second = task.runs
    assert len({n.node_id for n in first.nodes}) == 2 and len({n.node_id for n in second.nodes}) == 2
    assert first.end_reason == pb.RUN_END_REASON_PREEMPTED and first.suspend_requested_at > 0, first
    ck = first.last_checkpoint
    assert 0 < ck.step < NUM_STEPS and ck.path.endswith("MANIFEST.json"), ck

    # The checkpoint is in 3FS, its user's; another user reads neither it nor the training data.
    argv = list(task.spec.argv)
    data = argv[argv.index("--data") + 1].removeprefix("hf3fs://")
    with hf3fs.connect(mgmtd=mgmtd, token=tokens[TRAINER]) as fs:
        assert fs.stat(ck.path).uid == task.uid and fs.stat(data).uid == task.uid
        with fs.open(ck.path, "rb") as manifest:
            assert json.loads(manifest.read())  # the manifest the resumed run loaded
    with hf3fs.connect(mgmtd=mgmtd, token=tokens[URGENT]) as other:
        for path in (ck.path, data):
            with pytest.raises(PermissionError), other.open(path, "rb") as f:
                f.read()

    # The resumed run started from the checkpoint's step (its log says so, its first loss is the next step).
    assert f"resumed from step {ck.step}".encode() in facts["logs"][second.run_id], facts["logs"][second.run_id]
    series = read_series(facts["http"], tokens[TRAINER], task.task_id, "loss")
    steps = {run_id: [s for s, _, _ in points] for run_id, points in series.items()}
    # The suspend ended on the checkpoint it asked for (taken after rank 0 read the flag), or on go_suspend():
    # run 0 trained nothing past its checkpoint (no steps lost).
    assert steps[first.run_id] == list(range(1, ck.step + 1)), (steps[first.run_id], ck.step)
    assert steps[second.run_id] == list(range(ck.step + 1, NUM_STEPS + 1)), steps[second.run_id]
    losses = [v for run_id in (first.run_id, second.run_id) for _, v, _ in series[run_id]]
    assert losses[-1] < losses[0] - 1.0  # it learned
