"""Real processes through the real scheduler: suspend by a higher-priority task and resume from the
checkpoint and whole_life_state; a task that ignores SIGTERM is still killed with nothing left behind;
`hfai logs -f --rank 1` shows that node's output while it runs."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ff_agent import procs
from ff_testing.agent import wait_task
from ff_testing.scheduler import spec
from ff_testing.waiting import eventually
from fireflyer.scheduler.v1 import scheduler_pb2 as pb

TRAIN = """
import json, os, sys, time
from hfai import client
out, rank, local = sys.argv[1], os.environ["RANK"], os.environ["LOCAL_RANK"]
run_id = os.environ["MARSV2_RUN_ID"]
ckpt = os.path.join(out, "ckpt.json")
start = json.load(open(ckpt))["step"] if os.path.exists(ckpt) else 0
wls = client.get_whole_life_state()
with open(os.path.join(out, f"tmp-{rank}-{local}"), "w") as f:
    json.dump({"start": start, "wls": wls}, f)
os.replace(os.path.join(out, f"tmp-{rank}-{local}"), os.path.join(out, f"started-{run_id}-{rank}-{local}.json"))
print(f"rank {rank} local {local} starts at step {start} (whole_life_state {wls})")
for step in range(start, start + 2000):
    if rank == "0" and local == "0" and client.receive_suspend_command():
        with open(ckpt + ".tmp", "w") as f:
            json.dump({"step": step}, f)
        os.replace(ckpt + ".tmp", ckpt)
        client.set_whole_life_state(step + 1)
        client.report_checkpoint(ckpt, step)
        print(f"checkpoint at step {step}; go_suspend()")
        client.go_suspend()
    if wls and step >= start + 10:
        print(f"rank {rank} local {local} done at step {step}")
        sys.exit(0)
    time.sleep(0.05)
sys.exit(3)
"""


async def _submit(client: Any, task_spec: pb.TaskSpec) -> pb.Task:
    resp = await client.call(client.user.SubmitTask, pb.SubmitTaskRequest(spec=task_spec))
    return resp.task  # type: ignore[no-any-return]


def _read_json_files(folder: Path, prefix: str) -> dict[str, Any]:
    return {p.name: json.loads(p.read_text()) for p in folder.glob(f"{prefix}*")}


async def test_preempted_task_checkpoints_suspends_and_resumes_where_it_stopped(cluster: Any, tmp_path: Path) -> None:
    for name in ("a1", "a2"):
        await cluster.add_agent(name)
    script, out = tmp_path / "train.py", tmp_path / "out"
    script.write_text(TRAIN)
    out.mkdir()
    alice, bob = cluster.client("alice"), cluster.client("bob")
    low = await _submit(alice, spec(2, 10, name="low", argv=["python", str(script), str(out)]))
    await wait_task(alice, low.task_id, pb.TASK_STATE_RUNNING)

    async def all_started() -> bool:
        return len(await asyncio.to_thread(_read_json_files, out, "started-")) == 4

    await eventually(all_started, what="4 ranks started")
    high = await _submit(bob, spec(2, 30, name="high", argv=["python", "-c", "print('high priority ran')"]))
    done_high = await wait_task(bob, high.task_id, pb.TASK_STATE_SUCCEEDED, pb.TASK_STATE_FAILED)
    assert done_high.state == pb.TASK_STATE_SUCCEEDED, done_high
    done = await wait_task(alice, low.task_id, pb.TASK_STATE_SUCCEEDED, pb.TASK_STATE_FAILED, timeout_s=90)
    assert done.state == pb.TASK_STATE_SUCCEEDED, done
    first, second = done.runs[0], done.runs[-1]
    assert first.state == pb.RUN_STATE_SUSPENDED and first.end_reason == pb.RUN_END_REASON_PREEMPTED
    assert first.suspend_stage == pb.SUSPEND_STAGE_CAN_SUSPEND, first  # rank 0 read the flag and called go_suspend()
    step = json.loads((out / "ckpt.json").read_text())["step"]
    assert first.last_checkpoint.path == str(out / "ckpt.json") and first.last_checkpoint.step == step
    assert len(done.runs) == 2 and second.start_whole_life_state == step + 1
    resumed = await asyncio.to_thread(_read_json_files, out, f"started-{second.run_id}-")
    assert len(resumed) == 4 and all(v == {"start": step, "wls": step + 1} for v in resumed.values()), resumed


IGNORE_TERM = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
# A child in its own process group that ignores SIGTERM too: only the session finds it.
child = subprocess.Popen([sys.executable, "-c",
    "import os, signal, time; os.setpgid(0, 0); signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
with open(os.path.join(sys.argv[1], f"pids-{os.environ['LOCAL_RANK']}"), "w") as f:
    f.write(f"{os.getpid()} {child.pid}")
print("ignoring SIGTERM", flush=True)
time.sleep(600)
"""


async def test_a_task_that_ignores_sigterm_is_killed_after_the_grace_with_nothing_left(
    cluster: Any, tmp_path: Path
) -> None:
    await cluster.add_agent("a1")
    script, out = tmp_path / "stubborn.py", tmp_path / "out"
    script.write_text(IGNORE_TERM)
    out.mkdir()
    alice = cluster.client("alice")
    task = await _submit(alice, spec(1, 10, argv=["python", str(script), str(out)]))

    async def pids_written() -> bool:  # both files, each whole (a rank's pid, then its child's)
        return sum(len(f.read_text().split()) for f in out.glob("pids-*")) == 4

    await eventually(pids_written, what="both ranks and their children started")
    pids = [int(p) for f in sorted(out.glob("pids-*")) for p in f.read_text().split()]
    assert len(pids) == 4 and all(procs.alive(p) for p in pids)
    await alice.call(alice.user.StopTask, pb.StopTaskRequest(task_id=task.task_id))
    await asyncio.sleep(0.5)  # time passing inside the grace is the point: the stop's SIGTERM must not end them
    assert all(procs.alive(p) for p in pids)  # SIGTERM was ignored: they are still there within the grace
    done = await wait_task(alice, task.task_id, pb.TASK_STATE_STOPPED)
    assert done.current_run.state == pb.RUN_STATE_STOPPED
    assert not any(procs.alive(p) for p in pids), [p for p in pids if procs.alive(p)]
    assert procs.session_members(pids[0::2]) == {}  # each rank leads its own session


STREAM = """
import os, sys, time
rank, local = os.environ["RANK"], os.environ["LOCAL_RANK"]
for i in range(1000):
    print(f"node {rank} local {local} line {i}")
    if os.path.exists(sys.argv[1]):
        break
    time.sleep(0.1)
"""


async def test_hfai_logs_follow_shows_one_node_ranks_output_live(cluster: Any, tmp_path: Path) -> None:
    for name in ("a1", "a2"):
        await cluster.add_agent(name)
    script, release = tmp_path / "stream.py", tmp_path / "release"
    script.write_text(STREAM)
    alice = cluster.client("alice")
    task = await _submit(alice, spec(2, 10, argv=["python", str(script), str(release)]))
    await wait_task(alice, task.task_id, pb.TASK_STATE_RUNNING)
    env = {
        **os.environ,
        "HFAI_SERVER": cluster.scheduler.address,
        "HFAI_TOKEN": cluster.tokens["alice"],
        "HFAI_CONFIG": str(tmp_path / "no-conf.json"),
    }
    cli = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "hfai",
        "logs",
        str(task.task_id),
        "-f",
        "--rank",
        "1",
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert cli.stdout is not None
        seen = []
        while len(seen) < 6:  # lines arrive while the task still runs (it waits for `release`)
            line = (await asyncio.wait_for(cli.stdout.readline(), 30)).decode()
            assert line, (await cli.stderr.read()).decode() if cli.stderr else ""
            seen.append(line)
        assert not release.exists()
        assert all(line.startswith(("[0] node 1 local 0 line", "[1] node 1 local 1 line")) for line in seen), seen
        release.write_text("go")
        rest, _ = await asyncio.wait_for(cli.communicate(), 60)
        assert cli.returncode == 0
        text = "".join(seen) + rest.decode()
        assert "[1] node 1 local 1 line" in text and "node 0" not in text
    finally:
        if cli.returncode is None:
            cli.kill()
            await cli.wait()
    done = await wait_task(alice, task.task_id, pb.TASK_STATE_SUCCEEDED, pb.TASK_STATE_FAILED)
    assert done.state == pb.TASK_STATE_SUCCEEDED
