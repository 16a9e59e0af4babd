"""haiscale.checkpoint on a real 3FS cluster (mgmtd, three storage services, meta, as processes) and the real
scheduler's check of reported checkpoints: save and load through the batch API, sharded state, keep-K, a save
SIGKILLed at four moments, and the scheduler counting only a manifest that exists and is the task's user's."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch

from ff_rpc import RpcError
from ff_scheduler.core import priority
from ff_testing import free_port
from ff_testing.cluster import CLUSTER_TOKEN, Cluster, running_cluster
from ff_testing.forkserver import ForkedProcess, ForkServer
from ff_testing.scheduler import AgentDriver, SchedulerClient, set_quota, spec, task_of
from ff_testing.telemetry import TelemetryClient
from ff_testing.waiting import eventually
from fireflyer.common.v1 import common_pb2
from fireflyer.scheduler.v1 import scheduler_pb2 as pb
from fireflyer.telemetry.v1 import telemetry_pb2 as tpb
from haiscale import checkpoint as ckpt
from hfai import runcontrol
from hfai.runcontrol import RunControl

WORKER = Path(__file__).with_name("checkpoint_crash_worker.py")
USERS = {"ck-alice": common_pb2.ROLE_USER, "ck-bob": common_pb2.ROLE_USER, "ck-admin": common_pb2.ROLE_ADMIN}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # (the trainers find the scheduler and the collector through mgmtd, as ranks of a task do)
    asked = {"users": USERS, "meta": {"background_interval_s": 0.5}, "scheduler": {}, "telemetry": {}}
    with running_cluster(tmp_path_factory.mktemp("ckpt-cluster"), **asked) as c:
        c.fs("ck-admin").mkdir("/ck", mode=0o777)
        for name in ("ck-alice", "ck-bob"):
            c.fs(name).mkdir(f"/ck/{name}")
        yield c


def _tensors(value: float) -> dict[str, Any]:
    w, b = torch.full((300, 700), float(value)), torch.arange(5, dtype=torch.int64) * int(value)
    return {"w": w, "b": b, "step": value}


def test_save_and_load_in_3fs_with_shards_and_keep(cluster: Cluster) -> None:
    fs, root = cluster.fs("ck-alice"), "hf3fs:///ck/ck-alice/run1"
    flat = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    for step in (1, 2, 3):
        for rank in (1, 0):  # two ranks in one process, rank 0 (which commits) last
            part = flat[rank * 500 : (rank + 1) * 500] * step
            state = {"model": _tensors(step), "moment": ckpt.Shard(part, (10, 100), rank * 500)}
            handle = ckpt.save(root, state, step=step, keep=2, rank=rank, world_size=2, save_id=f"a{step}", fs=fs)
        assert handle.wait() == f"hf3fs:///ck/ck-alice/run1/step-{step:09d}/{ckpt.MANIFEST}"
    assert sorted(fs.listdir("/ck/ck-alice/run1")) == ["step-000000002", "step-000000003"]
    assert handle.removed_steps == [1]
    one = {
        "model": {"w": torch.zeros(300, 700), "b": torch.zeros(5, dtype=torch.int64), "step": 0.0},
        "moment": ckpt.Shard(torch.zeros(1000), (10, 100), 0),
    }
    loaded = ckpt.load(root, one, fs=fs)  # on one rank: both saved slices
    assert (loaded.step, loaded.world_size, loaded.url) == (3, 2, "hf3fs:///ck/ck-alice/run1/step-000000003")
    assert torch.equal(one["moment"].local, flat * 3) and one["model"]["step"] == 3
    assert torch.equal(one["model"]["w"], torch.full((300, 700), 3.0))
    middle = {"model": _tensors(0), "moment": ckpt.Shard(torch.zeros(200), (10, 100), 400)}
    ckpt.load(root, middle, step=2, fs=fs)  # a slice across the two ranks' parts
    assert torch.equal(middle["moment"].local, flat[400:600] * 2)


def test_load_in_read_calls_of_bounded_size_fills_tensors_in_place(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tensors larger than a read call are read as pieces into their slices, small ones grouped: each byte lands."""
    from haiscale.checkpoint import storage

    fs, root = cluster.fs("ck-alice"), "hf3fs:///ck/ck-alice/pieces"
    g = torch.Generator().manual_seed(4)
    state = {
        "big": torch.randn(300, 701, generator=g),
        "small": {str(i): torch.randn(7, generator=g) for i in range(9)},
    }
    ckpt.save(root, {**state, "step": 5}, step=5, fs=fs, blocking=True)
    calls: list[int] = []
    read_batch_into = fs.read_batch_into

    def counted(reads: Any, buffers: Any) -> list[int]:
        calls.append(sum(n for _, _, n in reads))
        return read_batch_into(reads, buffers)

    monkeypatch.setattr(storage, "READ_CALL_BYTES", 1 << 16)
    monkeypatch.setattr(fs, "read_batch_into", counted)
    target = {"big": torch.zeros(300, 701), "small": {str(i): torch.zeros(7) for i in range(9)}, "step": 0}
    big = target["big"]
    assert ckpt.load(root, target, fs=fs).step == 5
    assert target["big"] is big and torch.equal(big, state["big"]) and target["step"] == 5
    assert all(torch.equal(target["small"][k], v) for k, v in state["small"].items())
    assert max(calls) <= 1 << 16 and sum(calls) >= 300 * 701 * 4 and len(calls) >= 300 * 701 * 4 // (1 << 16)


def test_another_user_loads_a_checkpoint_they_may_read_but_not_write(cluster: Cluster) -> None:
    """The load's lease cannot be written in alice's folder: bob's load goes on without one (and leaves nothing);
    a checkpoint in a folder bob may not read is refused, nothing of his state changed."""
    alice, bob = cluster.fs("ck-alice"), cluster.fs("ck-bob")
    ckpt.save("hf3fs:///ck/ck-alice/shared", _tensors(4), step=4, fs=alice, blocking=True)
    target = {"w": torch.zeros(300, 700), "b": torch.zeros(5, dtype=torch.int64), "step": 0}
    assert ckpt.load("hf3fs:///ck/ck-alice/shared", target, fs=bob).step == 4
    assert torch.equal(target["w"], torch.full((300, 700), 4.0)) and target["step"] == 4
    assert sorted(alice.listdir("/ck/ck-alice/shared/step-000000004"))[0] == ckpt.MANIFEST  # no lease left behind
    alice.mkdir("/ck/ck-alice/closed", mode=0o700)
    ckpt.save("hf3fs:///ck/ck-alice/closed", _tensors(5), step=5, fs=alice, blocking=True)
    mine = {"w": torch.zeros(300, 700), "b": torch.zeros(5, dtype=torch.int64), "step": 0}
    with pytest.raises(PermissionError):
        ckpt.load("hf3fs:///ck/ck-alice/closed", mine, fs=bob)
    assert not mine["w"].any() and mine["step"] == 0


def test_a_folder_of_another_user_in_a_shared_root_does_not_stop_loads_or_saves(cluster: Cluster) -> None:
    """In a root both may write, bob's checkpoint folder alice may not read (umask 077) holds a newer step: alice's
    latest_step and load find her own newest, and her save's keep-K, unable to remove bob's, still commits."""
    alice, bob = cluster.fs("ck-alice"), cluster.fs("ck-bob")
    alice.mkdir("/ck/ck-alice/team", mode=0o777)
    alice.chmod("/ck/ck-alice/team", 0o777)
    root = "hf3fs:///ck/ck-alice/team"
    ckpt.save(root, _tensors(1), step=1, fs=alice, blocking=True)
    ckpt.save(root, _tensors(9), step=9, fs=bob, blocking=True)
    bob.chmod("/ck/ck-alice/team/step-000000009", 0o700)
    assert ckpt.latest_step(root, fs=alice) == 1
    target = {"w": torch.zeros(300, 700), "b": torch.zeros(5, dtype=torch.int64), "step": 0}
    assert ckpt.load(root, target, fs=alice).step == 1 and target["step"] == 1
    handle = ckpt.save(root, _tensors(2), step=2, keep=1, fs=alice, blocking=True)
    assert handle.wait() == f"hf3fs:///ck/ck-alice/team/step-000000002/{ckpt.MANIFEST}"
    assert handle.removed_steps == [1]
    assert sorted(alice.listdir("/ck/ck-alice/team")) == ["step-000000002", "step-000000009"]
    assert ckpt.latest_step(root, fs=bob) == 9  # bob's is his own


@pytest.mark.parametrize(
    ("where", "stage"), [("3fs", "snapshot"), ("3fs", "data"), ("3fs", "manifest"), ("local", "prune")]
)
def test_a_save_killed_midway_leaves_the_previous_checkpoint(
    cluster: Cluster, tmp_path: Path, where: str, stage: str, torch_forks: ForkServer
) -> None:
    fs = cluster.fs("ck-alice")
    root = f"hf3fs:///ck/ck-alice/crash-{stage}" if where == "3fs" else str(tmp_path / "crash")
    env = {**os.environ, "FF_MGMTD_ADDRESSES": cluster.mgmtd, "FF_TOKEN": cluster.tokens["ck-alice"]}
    log = tmp_path / "crash.log"
    with log.open("wb") as out:  # forked with torch imported: the import is not what is tested
        proc = torch_forks.start([sys.executable, str(WORKER), root, stage], env=env, stdout=out, stderr=out)
    assert proc.wait(timeout=120) == -signal.SIGKILL, log.read_text(errors="replace")[-2000:]
    survivor = 2 if stage == "prune" else 1  # killed before its commit, the save never counts
    assert ckpt.latest_step(root, fs=fs) == survivor
    state = {f"t{i}": torch.zeros(1 << 16) for i in range(4)} | {"step": 0}
    assert ckpt.load(root, state, fs=fs).step == survivor
    assert all(bool((t == float(survivor)).all()) for k, t in state.items() if k != "step")
    # the next save commits and clears what the killed one left
    ckpt.save(root, state, step=3, keep=1, fs=fs).wait()
    listing = fs.listdir(f"/ck/ck-alice/crash-{stage}") if where == "3fs" else os.listdir(root)
    assert listing == ["step-000000003"]


def test_a_committed_save_whose_report_fails_succeeds_and_says_it_was_not_reported(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Inside a task whose run folder is gone (the agent cleaned it up, its disk failed), the report after the
    commit raised: wait() raised FileNotFoundError and the next save "the previous save failed", for a checkpoint
    that was committed and that latest_step and load found. Committed is success: the failed report is logged
    and ``reported`` is False."""
    fs, root = cluster.fs("ck-alice"), "hf3fs:///ck/ck-alice/unreported"
    monkeypatch.setenv(runcontrol.RUN_DIR_ENV, str(tmp_path / "gone"))
    handle = ckpt.save(root, _tensors(1), step=1, fs=fs)
    assert handle.wait(60) == f"{root}/step-000000001/{ckpt.MANIFEST}" and not handle.reported
    assert "step 1 is committed, but reporting it to the scheduler failed: FileNotFoundError" in caplog.text
    assert ckpt.save(root, _tensors(2), step=2, fs=fs, report=False, blocking=True).wait() is not None
    assert ckpt.latest_step(root, fs=fs) == 2


async def test_the_scheduler_counts_only_a_manifest_of_the_tasks_user(cluster: Cluster) -> None:
    address = cluster.scheduler.address
    agent = await AgentDriver(address, cluster.mgmtd, CLUSTER_TOKEN, suspend_mode="ack_only").start()
    root = SchedulerClient(address, cluster.tokens["ck-admin"])
    alice = SchedulerClient(address, cluster.tokens["ck-alice"])
    try:
        await set_quota(root, "ck-alice", priority.NORMAL, 1)
        task = (await alice.call(alice.user.SubmitTask, pb.SubmitTaskRequest(spec=spec(1)))).task
        await agent.wait_for(lambda: bool(agent.starts))
        run_id = agent.starts[0].run_id

        async def checkpoint_step() -> int:
            return int((await task_of(alice, task.task_id)).runs[0].last_checkpoint.step)

        mine = ckpt.save("hf3fs:///ck/ck-alice/job", _tensors(7), step=7, fs=cluster.fs("ck-alice")).wait()
        theirs = ckpt.save("hf3fs:///ck/ck-bob/job", _tensors(9), step=9, fs=cluster.fs("ck-bob")).wait()
        assert mine and theirs
        await agent.checkpoint(run_id, 7, path=mine)
        assert await checkpoint_step() == 7
        refused = [
            (mine.replace("000000007", "000000008"), 8, grpc.StatusCode.FAILED_PRECONDITION, "no such file in 3FS"),
            ("/ck/ck-alice/job/step-000000007", 8, grpc.StatusCode.FAILED_PRECONDITION, "not a file"),
            (theirs, 9, grpc.StatusCode.PERMISSION_DENIED, "not by the task's user"),
            ("ck/relative/MANIFEST.json", 10, grpc.StatusCode.INVALID_ARGUMENT, "not an absolute 3FS path"),
        ]
        for path, step, code, words in refused:
            with pytest.raises(RpcError) as err:
                await agent.checkpoint(run_id, step, path=path)
            assert err.value.code == code and words in err.value.details, (path, err.value)
        assert await checkpoint_step() == 7  # none of them was counted
        await eventually(lambda: _running(alice, task.task_id), what="the run still running")
    finally:
        await alice.close()
        await root.close()
        await agent.close()


async def test_the_scheduler_refuses_hostile_reports_with_their_status_and_counts_none(cluster: Cluster) -> None:
    """Reports as a hostile task or user would send them: each gets its own status (never UNAVAILABLE, which the
    agent's client would retry, nor UNKNOWN), and the run's checkpoint stays the last one counted."""
    address = cluster.scheduler.address
    agent = await AgentDriver(address, cluster.mgmtd, CLUSTER_TOKEN, suspend_mode="ack_only").start()
    root = SchedulerClient(address, cluster.tokens["ck-admin"])
    bob = SchedulerClient(address, cluster.tokens["ck-bob"])
    try:
        listed = await root.call(root.user.ListTasks, pb.ListTasksRequest(all_users=True))
        for other in listed.tasks:  # the tests above leave theirs: none may take this agent's node
            await root.call(root.user.StopTask, pb.StopTaskRequest(task_id=other.task_id, reason="next test"))
        await set_quota(root, "ck-bob", priority.NORMAL, 1)
        task = (await bob.call(bob.user.SubmitTask, pb.SubmitTaskRequest(spec=spec(1)))).task
        await agent.wait_for(lambda: any(s.task_id == task.task_id for s in agent.starts))
        run_id = next(s.run_id for s in agent.starts if s.task_id == task.task_id)
        bob_fs, alice_fs = cluster.fs("ck-bob"), cluster.fs("ck-alice")
        mine = ckpt.save("hf3fs:///ck/ck-bob/hostile", _tensors(3), step=3, fs=bob_fs).wait()
        assert mine
        await agent.checkpoint(run_id, 3, path=mine)
        alice_fs.mkdir("/ck/ck-alice/private", mode=0o700)
        bob_fs.symlink("/ck/ck-bob/loop-b", "/ck/ck-bob/loop-a")
        bob_fs.symlink("/ck/ck-bob/loop-a", "/ck/ck-bob/loop-b")
        bob_fs.create("/ck/ck-bob/empty.json")
        with bob_fs.open("/ck/ck-bob/unreadable.json", "wb") as f:
            f.write(b"{}")
        bob_fs.chmod("/ck/ck-bob/unreadable.json", 0o200)
        writing = bob_fs.open("/ck/ck-bob/writing.json", "wb")  # a manifest still being written
        writing.write(b"{}")

        def report(path: str, **ids: int) -> pb.ReportCheckpointRequest:
            return pb.ReportCheckpointRequest(
                node_id=ids.get("node_id", agent.node_id),
                task_id=ids.get("task_id", task.task_id),
                run_id=ids.get("run_id", run_id),
                checkpoint=pb.Checkpoint(path=path, step=99, committed_at=time.time(), taken_at=time.time()),
            )

        assert agent.client is not None
        code = grpc.StatusCode
        refused = [
            ("a path with NUL", agent.client, report("/ck/ck-bob/hostile\0/x"), code.INVALID_ARGUMENT, "NUL"),
            ("a name of 300 bytes", agent.client, report("/ck/ck-bob/" + "x" * 300), code.INVALID_ARGUMENT,
             "component of 300"),
            ("a path of 5000 bytes", agent.client, report("/ck/" + "x/" * 2500), code.INVALID_ARGUMENT,
             "checkpoint.path"),
            ("a symlink loop", agent.client, report("/ck/ck-bob/loop-a"), code.FAILED_PRECONDITION, "loop-a"),
            ("a folder bob cannot reach", agent.client, report("/ck/ck-alice/private/MANIFEST.json"),
             code.PERMISSION_DENIED, "may not reach it"),
            ("a file bob may not read", agent.client, report("/ck/ck-bob/unreadable.json"), code.PERMISSION_DENIED,
             "may not read it"),
            ("an empty file", agent.client, report("/ck/ck-bob/empty.json"), code.FAILED_PRECONDITION, "empty"),
            ("a file still open for writing", agent.client, report("/ck/ck-bob/writing.json"),
             code.FAILED_PRECONDITION, "still open for writing"),
            ("the user's own token", bob, report(mine), code.PERMISSION_DENIED, ""),
            ("another user's task", agent.client, report(mine, task_id=task.task_id + 1000), code.NOT_FOUND, ""),
            ("a run of another node", agent.client, report(mine, node_id=agent.node_id + 1000), code.NOT_FOUND, ""),
        ]  # fmt: skip
        for what, client, request, status, words in refused:
            with pytest.raises(RpcError) as err:
                await client.call(client.agent.ReportCheckpoint, request)
            assert err.value.code == status and words in err.value.details, (what, err.value)
        assert int((await task_of(bob, task.task_id)).runs[0].last_checkpoint.step) == 3  # none counted
        writing.close()
        await agent.checkpoint(run_id, 4, path="/ck/ck-bob/writing.json")  # closed: durable, counted
        assert int((await task_of(bob, task.task_id)).runs[0].last_checkpoint.step) == 4
    finally:
        await bob.close()
        await root.close()
        await agent.close()


async def _running(client: SchedulerClient, task_id: int) -> bool:
    return (await task_of(client, task_id)).current_run.state == pb.RUN_STATE_RUNNING


# ---- the example trainer: data and checkpoints in 3FS, suspended through HAI's run-control protocol ----

EXAMPLE = Path(__file__).parents[4] / "examples" / "gpt"
STEPS = 60
TINY = ["--batch", "4", "--context", "32", "--dim", "32", "--layers", "1", "--heads", "2", "--log-every", "5"]


def _launch(
    forks: ForkServer, cluster: Cluster, args: list[str], env: dict[str, str], logs: Path
) -> list[tuple[ForkedProcess, Path]]:
    """Two ranks of the trainer, torchrun-style, as alice (forked with torch imported; output to ``logs``)."""
    port = str(free_port())
    base = {
        **os.environ,
        "FF_MGMTD_ADDRESSES": cluster.mgmtd,
        "FF_TOKEN": cluster.tokens["ck-alice"],
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": port,
        "WORLD_SIZE": "2",
        "OMP_NUM_THREADS": "1",
        **env,
    }
    procs = []
    for r in (0, 1):
        log = logs.with_name(f"{logs.name}-rank{r}.log")
        with log.open("wb") as out:
            argv = [sys.executable, str(EXAMPLE / "train.py"), *TINY, *args]
            procs.append((forks.start(argv, env={**base, "RANK": str(r)}, stdout=out, stderr=out), log))
    return procs


def _losses(path: Path) -> dict[int, float]:
    lines = path.read_text().splitlines() if path.exists() else []
    return {(d := json.loads(line))["step"]: d["loss"] for line in lines}


def _finish(procs: list[tuple[ForkedProcess, Path]]) -> None:
    for p, log in procs:
        assert p.wait(timeout=300) == 0, log.read_text(errors="replace")[-3000:]


@pytest.mark.timeout(600)  # six trainer processes: about 30 s on a quiet 2-core machine, far more under load
def test_the_example_trainer_resumes_after_a_suspend_with_its_loss_continuing(
    cluster: Cluster, tmp_path: Path, torch_forks: ForkServer
) -> None:
    env = {**os.environ, "FF_MGMTD_ADDRESSES": cluster.mgmtd, "FF_TOKEN": cluster.tokens["ck-alice"]}
    data = "hf3fs:///ck/ck-alice/corpus.txt"
    corpus = torch_forks.start([sys.executable, str(EXAMPLE / "corpus.py"), data, "--mib", "0.25"], env=env)
    assert corpus.wait(timeout=120) == 0
    common = ["--data", data, "--ckpt-every", "10"]
    ref_args = [
        *common,
        "--steps",
        str(STEPS),
        "--ckpt",
        "hf3fs:///ck/ck-alice/gpt-ref",
        "--metrics",
        str(tmp_path / "ref.jsonl"),
    ]
    reference = _launch(torch_forks, cluster, ref_args, {}, tmp_path / "ref")
    run_dir = RunControl(tmp_path / "run").create()
    root, metrics = "hf3fs:///ck/ck-alice/gpt", tmp_path / "run.jsonl"
    first = _launch(
        torch_forks,
        cluster,
        [*common, "--steps", "100000", "--ckpt", root, "--metrics", str(metrics)],  # suspended long before its end
        {"HFAI_RUN_DIR": str(run_dir.folder)},
        tmp_path / "first",
    )
    deadline = time.monotonic() + 400
    while max(_losses(metrics), default=0) < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    run_dir.raise_suspend()  # what the agent does when the scheduler suspends the run
    events: list[Any] = []
    while not any(e.kind == runcontrol.GO_SUSPEND for e in events) and time.monotonic() < deadline:
        events += run_dir.new_events()
        time.sleep(0.05)
    kinds = [e.kind for e in events]
    assert kinds[:2] == [runcontrol.RECEIVED, runcontrol.CHECKPOINT] and kinds[-1] == runcontrol.GO_SUSPEND, kinds
    for p, _ in first:  # the agent stops the run once it called go_suspend()
        p.terminate()
        p.wait(timeout=30)
    suspended_at = int(events[-2].data["step"])  # the last report: the checkpoint taken at the suspend
    assert events[-2].data["path"] == f"/ck/ck-alice/gpt/step-{suspended_at:09d}/{ckpt.MANIFEST}"
    assert 6 <= suspended_at < STEPS - 5 and max(_losses(metrics)) == suspended_at, suspended_at

    _finish(
        _launch(
            torch_forks,
            cluster,
            [*common, "--steps", str(STEPS), "--ckpt", root, "--metrics", str(metrics)],
            {},
            tmp_path / "resumed",
        )
    )
    _finish(reference)
    ref, run = _losses(tmp_path / "ref.jsonl"), _losses(metrics)
    assert sorted(run) == sorted(ref) == list(range(1, STEPS + 1))
    # same data order, RNG, optimizer state and reduction order: equal to fp32 rounding (1e-6 relative)
    for step in range(1, STEPS + 1):
        assert abs(run[step] - ref[step]) <= 1e-6 * abs(ref[step]), (step, run[step], ref[step], suspended_at)
    assert run[STEPS] < run[1] - 0.5  # and it learned something
    # What the ranks reported reached the task's telemetry as alice's: the loss curve and haiscale's own figures.
    series = asyncio.run(_series_of(cluster, "ck-alice"))
    for name in (
        "hfai_loss",
        "hfai_step",
        "hfai_ddp_step_seconds",
        "hfai_ddp_allreduce_bytes",
        "hfai_checkpoint_save_seconds",
        "hfai_checkpoint_load_seconds",
    ):
        assert name in series, (name, sorted(series))
    assert series["hfai_ddp_allreduce_bytes"] > 0 and series["hfai_ddp_step_seconds"] > 0, series
    assert series["hfai_step"] == STEPS  # the newest step reported: the last one
    assert asyncio.run(_series_of(cluster, "ck-bob")) == {}  # another user sees none of it


async def _series_of(cluster: Cluster, user: str) -> dict[str, float]:
    """The newest value of each hfai_* series ``user`` can read (waiting up to 20 s for the pushes to land)."""
    client = TelemetryClient(str(cluster.telemetry.info["grpc"]), cluster.tokens[user])
    try:
        newest: dict[str, float] = {}
        deadline = time.monotonic() + (20 if user == "ck-alice" else 0)
        while True:
            now = time.time()
            listed = await client.call(client.stub.ListSeries, tpb.ListSeriesRequest(start_at=now - 600))
            names = sorted({s.name for s in listed.series if s.name.startswith("hfai_")})
            for name in names:
                got = await client.call(
                    client.stub.QueryRange,
                    tpb.QueryRangeRequest(name=name, start_at=now - 600, end_at=now, step_s=5, lookback_s=600),
                )
                values = [p.value for r in got.series for p in r.points]
                if values:
                    newest[name] = values[-1]
            if newest.get("hfai_step") == STEPS or time.monotonic() > deadline:
                return newest
            await asyncio.sleep(0.5)
    finally:
        await client.close()
