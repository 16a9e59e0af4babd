"""``fireflyer demo --train-only`` with all its faults on a fresh cluster: the facts behind what it prints, read from
the services. The trainer ran on 2 of 3 nodes and was preempted with a checkpoint in 3FS that is its user's,
losing no step to it; it resumed from that checkpoint's step. Then, in that resumed run, a storage service was
SIGKILLed and restarted: the run went on training through it and every chain ended with all its targets serving;
the agent of one of its nodes was SIGKILLed: the scheduler ended the run NODE_LOST on that node, and the task
resumed from that run's newest checkpoint once the agent was back; in that run one rank was stopped (SIGSTOP):
the run ended HANG_DETECTED naming that rank, its node was cordoned, the task resumed on the other two nodes from
the newest checkpoint, and a validator run returned the node. The task ends with the parameters of the
uninterrupted reference run on the same data order: its checkpoints in 3FS and the reference's hold equal
parameters at every step both saved, and every loss any of its runs reported equals the reference's at that step.
Another user can read neither its checkpoint nor its data."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch

import hf3fs
from ff_appliance.demo_faults import HUNG_LOCAL_RANK, HUNG_NODE_RANK
from ff_appliance.demo_train import NUM_STEPS_WITH_FAULTS as NUM_STEPS
from ff_appliance.demo_train import REFERENCE_NAME, TASK_NAME, TRAINER, URGENT, read_series
from ff_appliance.scheduler_setup import scheduler_address
from ff_appliance.scheduler_user import SchedulerUser, user_token
from ff_appliance.telemetry_setup import telemetry_endpoints
from ff_cluster import MgmtdClient
from fireflyer.mgmtd.v1 import mgmtd_pb2
from fireflyer.scheduler.v1 import scheduler_pb2 as pb
from haiscale import checkpoint as ckpt

from .conftest import Appliance

DEMO_TIMEOUT_S = 600.0  # the demo: about 115 s with the agent fault alone at load 4-6 on 2 cores, 246 s at load 9-16
pytestmark = pytest.mark.timeout(DEMO_TIMEOUT_S + 120)  # the first test also brings the cluster up and trains

# The tolerance on the fp32 parameters and the losses: none, they must be bit-identical. The interrupted task
# and the reference do the same float operations in the same order: the same seed and data order, the same
# world size and hfreduce trees (a fixed reduction order over global ranks), one thread per rank; a resumed run
# restores the exact bytes of the model, the optimizer's moments, the RNG states and the data position.
# Measured: a difference of exactly 0 at every checkpoint and every step. A slack of a few ulps would buy
# nothing: a last-bit difference early on is expected to grow with the steps after it, so no slack could tell
# noise from a bug, while a step trained on other data or from another state moves a parameter by ~lr = 1e-2.
RTOL, ATOL = 0.0, 0.0


@dataclass(frozen=True)
class Trained:
    """What the demo left, read back from the services after it."""

    mgmtd: list[str]
    task: pb.Task  # with its runs
    reference: pb.Task
    tokens: dict[str, str]
    http: str
    logs: dict[int, bytes]  # run id -> node rank 0's log
    agent_ready_at: dict[int, float]  # node id -> when its agent last registered (its ready file; this machine's clock)
    storage_ready_at: dict[int, float]  # node id -> when its storage service last registered (as agent_ready_at)
    routing: mgmtd_pb2.RoutingInfo  # mgmtd's routing once the demo ended
    nodes: dict[int, pb.Node]  # the scheduler's nodes once the demo ended


async def _facts(mgmtd: list[str], admin_token: str) -> dict[str, Any]:
    """The training task and its reference with their runs, the users' tokens, the telemetry address, node 0's logs."""
    client = MgmtdClient(mgmtd, token=admin_token)
    try:
        address = await scheduler_address(client)
        http = (await telemetry_endpoints(client))["http"]
        tokens = {name: await user_token(client, name) for name in (TRAINER, URGENT)}
        routing = (await client.mgmtd.get_routing_info(mgmtd_pb2.GetRoutingInfoRequest())).routing_info
    finally:
        await client.close()
    admin = SchedulerUser(address, admin_token, timeout_s=10.0)
    trainer = SchedulerUser(address, tokens[TRAINER], timeout_s=10.0)
    try:
        listed = await admin.scheduler.list_tasks(pb.ListTasksRequest(all_users=True, name_contains=TASK_NAME))
        tasks = {}
        for name in (TASK_NAME, REFERENCE_NAME):
            (found,) = [t for t in listed.tasks if t.spec.name == name]
            request = pb.GetTaskRequest(task_id=found.task_id, include_runs=True)
            tasks[name] = (await trainer.scheduler.get_task(request)).task
        task = tasks[TASK_NAME]
        nodes = {n.node_id: n for n in (await admin.scheduler.list_nodes(pb.ListNodesRequest())).nodes}
        logs = {}
        for run in task.runs:
            log = pb.StreamLogsRequest(task_id=task.task_id, node_rank=0, run_id=run.run_id)
            logs[run.run_id] = b"".join([c.data async for c in trainer.scheduler.stream_logs(log)])
    finally:
        await admin.close()
        await trainer.close()
    return {
        "task": task,
        "reference": tasks[REFERENCE_NAME],
        "tokens": tokens,
        "http": http,
        "logs": logs,
        "routing": routing,
        "nodes": nodes,
    }


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Trained]:
    """One cluster for the module: the demo's training with its three faults and the reference run."""
    app = Appliance(tmp_path_factory.mktemp("demo-train") / "state")
    try:
        app.ok("demo", "--train-only", "--faults", "storage,agent,hang", timeout_s=DEMO_TIMEOUT_S)
        plan = json.loads((app.state_dir / "plan.json").read_text())
        mgmtd = [f"{i['host']}:{i['grpc_port']}" for i in plan["instances"] if i["service"] == "mgmtd"]
        admin_token = (app.state_dir / "secrets" / "admin_token").read_text().strip()
        facts = asyncio.run(_facts(mgmtd, admin_token))
        ready = {service: {i["node_id"]: (app.state_dir / "run" / f"{i['name']}.ready.json").stat().st_mtime
                           for i in plan["instances"] if i["service"] == service}
                 for service in ("agent", "storage")}  # fmt: skip
        yield Trained(mgmtd=mgmtd, agent_ready_at=ready["agent"], storage_ready_at=ready["storage"], **facts)
    finally:
        if app.state_dir.exists():
            app.down_and_check()


def _steps(trained: Trained) -> dict[int, list[int]]:
    series = read_series(trained.http, trained.tokens[TRAINER], trained.task.task_id, "loss")
    return {run_id: [s for s, _, _ in points] for run_id, points in series.items()}


def test_preempted_with_a_checkpoint_and_resumed_from_it(trained: Trained) -> None:
    task, tokens, mgmtd = trained.task, trained.tokens, trained.mgmtd
    # Four runs: preempted; then the storage fault (which ends nothing) and the agent's loss; then the hang; then
    # the last, to the end.
    assert task.user_name == TRAINER and task.state == pb.TASK_STATE_SUCCEEDED and len(task.runs) == 4, task
    first, second, _, _ = task.runs
    assert all(len({n.node_id for n in run.nodes}) == 2 for run in task.runs), task.runs
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
    assert f"resumed from step {ck.step}".encode() in trained.logs[second.run_id], trained.logs[second.run_id]
    steps = _steps(trained)
    # The suspend ended on the checkpoint it asked for (taken after rank 0 read the flag), or on go_suspend():
    # run 0 trained nothing past its checkpoint (no steps lost).
    assert steps[first.run_id] == list(range(1, ck.step + 1)), (steps[first.run_id], ck.step)
    assert steps[second.run_id][0] == ck.step + 1, steps[second.run_id]


def test_a_storage_service_killed_and_restarted_while_the_run_trained_on(trained: Trained) -> None:
    run = trained.task.runs[1]
    # One storage service registered again while this run trained (the demo killed and restarted it): the run went
    # on to the agent fault, which is what ended it, and trained steps after the storage service was back.
    (restarted,) = [node for node, at in trained.storage_ready_at.items() if run.started_at < at < run.ended_at]
    assert run.end_reason == pb.RUN_END_REASON_NODE_LOST and run.failure.node_id != restarted, run
    series = read_series(trained.http, trained.tokens[TRAINER], trained.task.task_id, "loss")
    back_at = trained.storage_ready_at[restarted]
    assert [s for s, _, at in series[run.run_id] if at > back_at], (back_at, series[run.run_id][-3:])

    # Every chain ended whole: all its targets serving, the restarted node's among them (they resynced).
    routing = trained.routing
    alive = {n.node_id for n in routing.nodes if n.status == mgmtd_pb2.NODE_STATUS_ALIVE}
    assert restarted in alive, routing.nodes
    assert routing.chains and any(t.node_id == restarted for c in routing.chains for t in c.targets)
    for chain in routing.chains:
        states = [t.public_state for t in chain.targets]
        assert len(states) == 3 and set(states) == {mgmtd_pb2.PUBLIC_TARGET_STATE_SERVING}, chain


def test_node_lost_and_resumed_from_the_newest_checkpoint(trained: Trained) -> None:
    task = trained.task
    _, lost, after, _ = task.runs
    # The agent the demo killed is the one that registered again after the run ended (it was restarted).
    (restarted,) = [node for node, at in trained.agent_ready_at.items() if at > lost.ended_at]
    killed_rank = next(n.node_rank for n in lost.nodes if n.node_id == restarted)
    assert killed_rank == HUNG_NODE_RANK, lost.nodes
    assert lost.end_reason == pb.RUN_END_REASON_NODE_LOST and lost.failure.node_id == restarted, lost
    assert lost.started_at < lost.failure.failed_at <= lost.ended_at, lost

    # The task was re-queued and resumed from the lost run's newest checkpoint (its own, written after the
    # preemption's resume), on two nodes again.
    ck = lost.last_checkpoint
    assert task.runs[0].last_checkpoint.step < ck.step < NUM_STEPS, ck
    assert after.started_at > lost.ended_at and len(after.nodes) == 2, after
    assert f"resumed from step {ck.step}".encode() in trained.logs[after.run_id], trained.logs[after.run_id]
    assert _steps(trained)[after.run_id][0] == ck.step + 1


def test_a_stopped_rank_is_named_its_node_cordoned_then_validated_back(trained: Trained) -> None:
    task = trained.task
    _, _, hung, last = task.runs
    failure = hung.failure
    assert hung.end_reason == pb.RUN_END_REASON_HANG_DETECTED and failure.hang, hung
    assert (failure.node_rank, failure.local_rank) == (HUNG_NODE_RANK, HUNG_LOCAL_RANK), failure
    assert failure.node_id == next(n.node_id for n in hung.nodes if n.node_rank == HUNG_NODE_RANK), hung.nodes
    assert hung.started_at < failure.failed_at <= hung.ended_at, hung

    # Cordoned: the task resumed on the two other nodes, from the hung run's newest checkpoint, to the end.
    assert failure.node_id not in {n.node_id for n in last.nodes} and len(last.nodes) == 2, last.nodes
    ck = hung.last_checkpoint
    assert task.runs[1].last_checkpoint.step < ck.step < NUM_STEPS, ck
    assert last.end_reason == pb.RUN_END_REASON_COMPLETED and last.started_at > hung.ended_at, last
    assert f"resumed from step {ck.step}".encode() in trained.logs[last.run_id], trained.logs[last.run_id]
    steps = _steps(trained)
    assert steps[last.run_id] == list(range(ck.step + 1, NUM_STEPS + 1)), (steps[last.run_id], ck.step)
    # Every step 1..N was trained by some run; each lost run's steps after its checkpoint were trained again.
    assert sorted({s for run_steps in steps.values() for s in run_steps}) == list(range(1, NUM_STEPS + 1))

    # A validator run after the hang passed, and the scheduler returned the node.
    node = trained.nodes[failure.node_id]
    assert node.state == pb.NODE_STATE_READY, node
    assert node.last_validation.passed and node.last_validation.finished_at > hung.ended_at, node.last_validation


def _checkpoints(fs: Any, root: str) -> list[int]:
    """The steps of the committed checkpoints under ``root`` in 3FS (a committed one has its manifest)."""
    names = [n for n in fs.listdir(root) if n.startswith("step-")]
    return sorted(int(n.removeprefix("step-")) for n in names if fs.exists(f"{root}/{n}/{ckpt.MANIFEST}"))


def _parameters(fs: Any, root: str, step: int) -> dict[str, torch.Tensor]:
    state: dict[str, Any] = {}
    ckpt.load(f"hf3fs://{root}", state, step=step, allocate_missing=True, fs=fs)
    params: dict[str, torch.Tensor] = state["model"]
    return params


def _ckpt_root(task: pb.Task) -> str:
    argv = list(task.spec.argv)
    return argv[argv.index("--ckpt") + 1].removeprefix("hf3fs://")


def test_ends_with_the_uninterrupted_reference_runs_parameters(trained: Trained) -> None:
    task, reference = trained.task, trained.reference
    assert reference.state == pb.TASK_STATE_SUCCEEDED and len(reference.runs) == 1, reference
    assert list(reference.spec.argv) == [a.replace(_ckpt_root(task), _ckpt_root(reference)) for a in task.spec.argv]
    with hf3fs.connect(mgmtd=trained.mgmtd, token=trained.tokens[TRAINER]) as fs:
        ours, theirs = _checkpoints(fs, _ckpt_root(task)), _checkpoints(fs, _ckpt_root(reference))
        both = sorted(set(ours) & set(theirs))
        # Among them: the newest checkpoints of the runs the node loss and the hang ended (each resumed from one),
        # and the final one (after every interruption).
        ended = {task.runs[1].last_checkpoint.step, task.runs[2].last_checkpoint.step, NUM_STEPS}
        assert ended <= set(both), (ours, theirs)
        for step in both:
            mine, ref = _parameters(fs, _ckpt_root(task), step), _parameters(fs, _ckpt_root(reference), step)
            assert mine.keys() == ref.keys() and mine, step
            for name, value in mine.items():
                torch.testing.assert_close(value, ref[name], rtol=RTOL, atol=ATOL, msg=f"step {step} {name}")

    # Every loss any run of the task reported (steps trained twice included) equals the reference's at that step.
    series = read_series(trained.http, trained.tokens[TRAINER], task.task_id, "loss")
    (ref_points,) = read_series(trained.http, trained.tokens[TRAINER], reference.task_id, "loss").values()
    ref_loss = {s: v for s, v, _ in ref_points}
    assert sorted(ref_loss) == list(range(1, NUM_STEPS + 1))
    for run_id, points in series.items():
        for step, loss, _ in points:
            assert loss == pytest.approx(ref_loss[step], rel=RTOL, abs=ATOL), (run_id, step, loss, ref_loss[step])
