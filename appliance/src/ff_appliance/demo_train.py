"""The training part of ``fireflyer demo``: a tiny GPT preempted by another user, resumed from its checkpoint.

A user trains the tiny GPT on the cluster, with its data and checkpoints in 3FS; another user's higher-priority task
preempts it; it resumes from its checkpoint. The full demo then injects faults (``demo_faults``): a storage service and
an agent SIGKILLed, a rank SIGSTOPped. Every figure printed is read back from the scheduler, mgmtd, telemetry or 3FS
(the trainer's own log lines come through StreamLogs).

The trainer is ``examples/gpt`` of this checkout (or ``--example DIR``): its path is given to the agents, which
run on this machine. A pip-installed appliance has no checkout: it passes ``--example`` with a folder that every
agent's node can read (a copy of the example, or a 3FS FUSE mount holding it).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import hf3fs
from ff_appliance.demo_faults import (
    FAULT_AFTER_STEPS,
    FAULT_KINDS,
    ClusterHandle,
    FaultError,
    FaultRecord,
    Faults,
    fault_rows,
)
from ff_appliance.scheduler_setup import scheduler_address, set_quota
from ff_appliance.scheduler_user import SchedulerUser, user_token
from ff_appliance.telemetry_setup import telemetry_endpoints
from ff_cluster import MgmtdClient
from ff_rpc import RpcError
from fireflyer.scheduler.v1 import scheduler_pb2 as pb

TRAINER = "demo-trainer"  # submits the training task
URGENT = "demo-urgent"  # another user, whose higher-priority task preempts it
TRAIN_ROOT = "/demo-train"  # in 3FS: one folder per user, only theirs (0700)
TASK_NAME = "gpt-demo"
REFERENCE_NAME = TASK_NAME + "-reference"  # the uninterrupted run on the same data order (when there are faults)
URGENT_NAME = "urgent-eval"
NORMAL, HIGH = 10, 30
NUM_NODES = 2
# Tiny enough that 4 ranks on 2 cores take a few steps a second.
MODEL_ARGS = ["--batch", "4", "--context", "32", "--dim", "32", "--layers", "1", "--heads", "2", "--lr", "1e-2"]
CORPUS_MIB = 0.25
NUM_STEPS = 240  # about 15 steps/s on a quiet 2-core machine; enough for the agent fault alone
# With the storage or the hang fault: the trainer must still be training after the storage fault (a restart and
# a resync, a few seconds in which it trains on) and two restarts. The faults that end a run cost no steps while
# they last (the ranks stop), only those since the run's newest checkpoint.
NUM_STEPS_WITH_FAULTS = 800
NUM_AGENTS_WITH_FAULTS = 3  # a cordoned node leaves 2 for the task
# The ranks wait this long in a collective before they give up on a peer: longer than the appliance's hang
# threshold, so a stopped rank is named by hang detection rather than by its peers timing out.
HFREDUCE_TIMEOUT_S = 120
PREEMPT_AT_STEP = 110  # the urgent task comes once the trainer reached this step (not at a periodic checkpoint)
CKPT_EVERY = 40
URGENT_SECONDS = 3  # how long the urgent task holds the nodes
CLI_TIMEOUT_S = 120.0
WAIT_S = 300.0  # any one wait (a loaded CI runner is many times slower than a quiet machine)
POLL_S = 1.0
BAR_WIDTH = 24
LOG_EVERY = 20
STEP_LINE = re.compile(r"^step (\d+) loss ([0-9.naninf+-]+) tokens/s (\d+)")


class TrainDemoError(Exception):
    """The cluster did not do what the training demo expects."""


@dataclass(frozen=True, kw_only=True)
class TrainPlan:
    """What the demo runs: steps, when the preemption comes, the faults after it, and the example's folder.

    No faults (``--quick``) means no reference run either.
    """

    example: Path
    num_steps: int
    preempt_at_step: int
    ckpt_every: int
    faults: tuple[str, ...] = ()  # of FAULT_KINDS, in that order

    @property
    def quick(self) -> bool:
        """``--quick``: no faults, and no reference run to compare the final loss with."""
        return not self.faults

    @classmethod
    def for_demo(cls, example: Path, *, faults: Sequence[str]) -> TrainPlan:
        """The demo's plan with ``faults`` (each of FAULT_KINDS; injected in that order whatever the order given)."""
        unknown = set(faults) - set(FAULT_KINDS)
        if unknown:
            raise TrainDemoError(f"no such fault: {', '.join(sorted(unknown))} (the faults: {', '.join(FAULT_KINDS)})")
        kinds = tuple(k for k in FAULT_KINDS if k in faults)
        steps = NUM_STEPS_WITH_FAULTS if {"storage", "hang"} & set(kinds) else NUM_STEPS
        return cls(
            example=example, num_steps=steps, preempt_at_step=PREEMPT_AT_STEP, ckpt_every=CKPT_EVERY, faults=kinds
        )


@dataclass
class _Run:
    """One submitted training task, as the demo follows it."""

    task_id: int
    dashboard_url: str
    printed: set[tuple[int, int]] = field(default_factory=set)  # (run_id, step) lines shown
    newest_step: int = 0
    newest_by_run: dict[int, int] = field(default_factory=dict)  # run id -> the newest step shown of it
    log_read: dict[int, int] = field(default_factory=dict)  # run id -> bytes of its log already shown


def find_example(given: str | None) -> Path:
    """``given``, else ``examples/gpt`` of the checkout this package is installed from (editable)."""
    import ff_appliance

    checkout = Path(ff_appliance.__file__).resolve().parents[3]  # <checkout>/appliance/src/ff_appliance
    folder = Path(given).expanduser().resolve() if given else checkout / "examples" / "gpt"
    if not (folder / "train.py").is_file() or not (folder / "corpus.py").is_file():
        raise TrainDemoError(
            f"no tiny-GPT example (train.py, corpus.py) in {folder}: pass --example DIR (a folder every agent can read)"
        )
    return folder


class TrainDemo:
    """The training part of ``fireflyer demo``; ``step`` and ``say`` print (numbered titles, indented lines)."""

    def __init__(
        self,
        addresses: Sequence[str],
        admin_token: str,
        plan: TrainPlan,
        step: Callable[[str], None],
        say: Callable[[str], None],
    ) -> None:
        self.addresses, self.admin_token, self.plan = list(addresses), admin_token, plan
        self.step, self.say = step, say
        self.folder = f"{TRAIN_ROOT}/{TRAINER}/run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        self.tokens: dict[str, str] = {}
        self.http = ""
        self.scheduler = ""

    # ---- set-up: users, quotas, 3FS folders ----

    async def setup(self) -> None:
        """Both users' tokens and quotas (the trainer at NORMAL, the urgent user at HIGH), the trainer's 3FS folder."""
        mgmtd = MgmtdClient(self.addresses, token=self.admin_token)
        try:
            self.scheduler = await scheduler_address(mgmtd)
            for name in (TRAINER, URGENT):
                self.tokens[name] = await user_token(mgmtd, name)
            self.http = (await telemetry_endpoints(mgmtd)).get("http", "")
        finally:
            await mgmtd.close()
        await set_quota(self.scheduler, self.admin_token, TRAINER, NORMAL, NUM_NODES)
        await set_quota(self.scheduler, self.admin_token, URGENT, HIGH, NUM_NODES)
        await asyncio.to_thread(self._folders)

    def _folders(self) -> None:
        with self.fs(None) as fs:
            fs.makedirs(TRAIN_ROOT, exist_ok=True)
            fs.chmod(TRAIN_ROOT, 0o1777)  # anyone makes their own folder there (sticky, as /tmp)
        with self.fs(TRAINER) as fs:
            if not fs.exists(f"{TRAIN_ROOT}/{TRAINER}"):
                fs.mkdir(f"{TRAIN_ROOT}/{TRAINER}", mode=0o700)
            fs.mkdir(self.folder, mode=0o700)

    def fs(self, user: str | None) -> Any:
        """A 3FS client as ``user`` (None: the admin); close it."""
        return hf3fs.connect(mgmtd=self.addresses, token=self.tokens[user] if user else self.admin_token)

    def _env(self, user: str) -> dict[str, str]:
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("FF_", "HFAI_"))}
        return {
            **clean,
            "FF_MGMTD_ADDRESSES": ",".join(self.addresses),
            "FF_TOKEN": self.tokens[user],
            # hfai reads these over ~/.hfai/conf.json: the CLI runs as this user whatever the machine's config says
            "HFAI_SERVER": self.scheduler,
            "HFAI_TOKEN": self.tokens[user],
        }

    def _cli(self, user: str, *argv: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [sys.executable, *argv],
            capture_output=True,
            text=True,
            env=self._env(user),
            timeout=CLI_TIMEOUT_S,
            check=False,
        )
        if proc.returncode != 0:
            raise TrainDemoError(f"{' '.join(argv[1:3])} exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
        return proc

    # ---- the story ----

    async def nodes(self) -> int:
        """How many ranks per node: the agents' device slots, as the scheduler lists them."""
        self.step("the nodes the agents registered with the scheduler (devices are CPU slots here)")
        user = SchedulerUser(self.scheduler, self.tokens[TRAINER], timeout_s=10.0)
        try:
            deadline = time.monotonic() + WAIT_S
            while True:
                listed = (await user.scheduler.list_nodes(pb.ListNodesRequest())).nodes
                ready = [n for n in listed if n.state == pb.NODE_STATE_READY]
                if len(ready) >= NUM_NODES or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.5)
        finally:
            await user.close()
        for n in listed:
            state = str(pb.NodeState.Name(n.state)).removeprefix("NODE_STATE_").lower()
            self.say(f"node {n.node_id} {n.hostname}: {state}, {len(n.devices)} devices, {n.num_cpus} CPUs")
        if len(ready) < NUM_NODES:
            raise TrainDemoError(f"{len(ready)} ready nodes; the demo trains on {NUM_NODES}")
        per_node = min(len(n.devices) for n in ready[:NUM_NODES])
        if per_node < 1:
            raise TrainDemoError("the ready nodes list no devices")
        self.say(
            f"the trainer runs on {NUM_NODES} nodes x {per_node} ranks (one per device slot): "
            f"world size {NUM_NODES * per_node}"
        )
        return per_node

    async def data(self) -> str:
        """The corpus, generated here and copied into the trainer's 3FS folder with ``hf3fs cp``; its URL."""
        self.step(f"{TRAINER} copies the tiny-GPT corpus into 3FS with `hf3fs cp`")
        return await asyncio.to_thread(self._copy_corpus)

    def _copy_corpus(self) -> str:
        target = f"{self.folder}/corpus.txt"
        with tempfile.TemporaryDirectory() as tmp:
            local = Path(tmp) / "corpus.txt"
            self._cli(TRAINER, str(self.plan.example / "corpus.py"), str(local), "--mib", str(CORPUS_MIB))
            proc = self._cli(TRAINER, "-m", "hf3fs", "cp", "--progress", str(local), f"hf3fs:{target}")
        self.say(f"$ hf3fs cp --progress corpus.txt hf3fs:{target}")
        bar = proc.stderr.replace("\r", "\n").strip().splitlines()
        if bar:
            self.say(f"  {bar[-1].strip()}")
        with self.fs(TRAINER) as fs:
            st = fs.stat(target)
            mode = oct(fs.stat(self.folder).mode & 0o777)
        self.say(f"in 3FS: {target}, {st.size} bytes, owner uid {st.uid}; its folder is mode {mode} (only {TRAINER})")
        return f"hf3fs://{target}"

    def _trainer_argv(self, data: str, ckpt: str, metrics_steps: int) -> list[str]:
        """``train.py`` and its options: ``metrics_steps`` steps on ``data``, every checkpoint kept under ``ckpt``."""
        return [
            str(self.plan.example / "train.py"),
            "--data", data,
            "--ckpt", ckpt,
            "--steps", str(metrics_steps),
            "--ckpt-every", str(self.plan.ckpt_every),
            "--log-every", str(LOG_EVERY),
            "--keep", str(self.plan.num_steps // self.plan.ckpt_every + 1),  # every checkpoint kept
            *MODEL_ARGS,
        ]  # fmt: skip

    async def submit(self, data: str, ckpt: str, name: str) -> _Run:
        """``hfai python train.py ... -- --nodes 2`` as the trainer; the task as the scheduler took it."""
        script = self._trainer_argv(data, ckpt, self.plan.num_steps)
        opts = [
            "--nodes", str(NUM_NODES),
            "--priority", str(NORMAL),
            "--name", name,
            "-e", "OMP_NUM_THREADS=1",
            "-e", f"FF_HFREDUCE_TIMEOUT_S={HFREDUCE_TIMEOUT_S}",
        ]  # fmt: skip
        proc = await asyncio.to_thread(self._cli, TRAINER, "-m", "hfai", "python", *script, "--", *opts)
        self.say(f"$ hfai python {' '.join(script)} -- {' '.join(opts)}")
        for line in proc.stdout.splitlines():
            self.say(f"  {line}")
        found = re.search(r"submitted task (\d+)", proc.stdout)
        if found is None:
            raise TrainDemoError(f"hfai python did not say which task it submitted: {proc.stdout!r}")
        task_id = int(found.group(1))
        url = f"http://{self.http}/tasks/{task_id}" if self.http else "(no telemetry dashboard registered)"
        self.say(f"its dashboard page (loss curve, log; log in with {TRAINER}'s token): {url}")
        return _Run(task_id, url)

    # ---- following a task ----

    async def poll(self, user: SchedulerUser, run: _Run) -> pb.Task:
        """The task now, after printing node rank 0's new progress lines (a bar per ``step`` line)."""
        task = await user.task(run.task_id)
        current = task.current_run
        if current.run_id and current.state != pb.RUN_STATE_UNSPECIFIED:
            read = run.log_read.get(current.run_id, 0)
            try:
                new = await user.log_bytes(run.task_id, 0, run_id=current.run_id, offset=read)
            except RpcError:  # no log yet: the run is starting
                new = b""
            whole = new[: new.rfind(b"\n") + 1]  # complete lines; a line still being written comes next time
            run.log_read[current.run_id] = read + len(whole)
            self._show(run, current.run_id, current.run_index, whole.decode(errors="replace"))
        return task

    async def follow(self, user: SchedulerUser, run: _Run, done: Callable[[pb.Task, _Run], bool], why: str) -> pb.Task:
        """Print node rank 0's new progress lines until ``done``; the task then."""
        deadline = time.monotonic() + WAIT_S
        while True:
            task = await self.poll(user, run)
            if done(task, run):
                return task
            if time.monotonic() > deadline:
                raise TrainDemoError(f"task {run.task_id}: {why} did not happen within {WAIT_S:g} s")
            await asyncio.sleep(POLL_S)

    def _show(self, run: _Run, run_id: int, run_index: int, text: str) -> None:
        for raw in text.splitlines():
            if raw.startswith("[") and not raw.startswith("[0] "):
                continue  # another local rank's line
            line = raw.removeprefix("[0] ")
            m = STEP_LINE.match(line)
            key = (run_id, int(m.group(1)) if m else -hash(line))
            if key in run.printed or not (m or line.startswith(("rank 0 of", "suspending at", "done at"))):
                continue
            run.printed.add(key)
            if m is None:
                self.say(f"[run {run_index}] {line}")  # as the summary counts runs: 0, 1, ...
                continue
            step = int(m.group(1))
            run.newest_step = max(run.newest_step, step)
            run.newest_by_run[run_id] = max(run.newest_by_run.get(run_id, 0), step)
            filled = BAR_WIDTH * min(step, self.plan.num_steps) // self.plan.num_steps
            bar = "#" * filled + "." * (BAR_WIDTH - filled)
            self.say(f"[{bar}] step {step:>4}/{self.plan.num_steps} loss {float(m.group(2)):.4f} tokens/s {m.group(3)}")

    # ---- preemption ----

    async def preempt(self, run: _Run) -> int:
        """Another user's higher-priority task needs every node; the task id of that task."""
        self.step(f"{URGENT} submits a priority-{HIGH} task on {NUM_NODES} nodes: the scheduler preempts the trainer")
        urgent = SchedulerUser(self.scheduler, self.tokens[URGENT], timeout_s=10.0)
        try:
            spec = pb.TaskSpec(
                name=URGENT_NAME,
                argv=["python", "-c", f"import time; time.sleep({URGENT_SECONDS})"],
                num_nodes=NUM_NODES,
                priority=HIGH,
            )
            task = (await urgent.scheduler.submit_task(pb.SubmitTaskRequest(spec=spec))).task
        finally:
            await urgent.close()
        self.say(
            f"task {task.task_id} {URGENT_NAME!r} of {URGENT}: {NUM_NODES} nodes at priority {task.priority}, "
            f"{_name(pb.TaskState, task.state)}"
        )
        return int(task.task_id)


def _name(enum: Any, value: int) -> str:
    name = str(enum.Name(value))
    for prefix in ("TASK_STATE_", "RUN_STATE_", "RUN_END_REASON_", "SUSPEND_STAGE_"):
        name = name.removeprefix(prefix)
    return name.lower()


def _suspended(task: pb.Task, run: _Run) -> bool:
    return len(task.runs) >= 1 and task.runs[0].ended_at > 0


def _resumed(task: pb.Task, run: _Run) -> bool:
    """A run after the preempted one is running and has trained a step.

    Not necessarily run 1: a resume that failed to start (a port taken, for instance) is followed by another.
    """
    return any(
        r.state == pb.RUN_STATE_RUNNING and any(k[0] == r.run_id and k[1] > 0 for k in run.printed)
        for r in task.runs[1:]
    )


def _finished(task: pb.Task, run: _Run) -> bool:
    return task.state >= pb.TASK_STATE_SUCCEEDED


def _at_step(step: int) -> Callable[[pb.Task, _Run], bool]:
    def done(task: pb.Task, run: _Run) -> bool:
        if task.state >= pb.TASK_STATE_SUCCEEDED:
            raise TrainDemoError(
                f"task {run.task_id} ended {_name(pb.TaskState, task.state)} before step {step}: "
                f"{task.current_run.end_message}"
            )
        return run.newest_step >= step

    return done


# ---- reading the facts back ----


def read_series(http: str, token: str, task_id: int, metric: str) -> dict[int, list[tuple[int, float, float]]]:
    """Each run's ``hfai_<metric>`` samples of rank 0 from telemetry: run id -> [(step, value, at)] as reported.

    Read through the dashboard's JSON API, as the task's user.
    """
    url = f"http://{http}/api/tasks/{task_id}/series?metric={metric}"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        body = json.loads(resp.read())
    runs: dict[int, list[tuple[int, float, float]]] = {}
    for series in body["series"]:
        if series["labels"].get("rank", "0") != "0":
            continue
        points = [(int(p[0]), float(p[1]), float(p[2])) for p in series["points"] if p[0] is not None]
        runs.setdefault(int(series["labels"]["run_id"]), []).extend(points)
    return runs


async def wait_series(
    http: str, token: str, task_id: int, last_step: int, num_runs: int
) -> dict[int, list[tuple[int, float, float]]]:
    """The loss series once telemetry has the last step and every run (ranks push in the background)."""
    deadline = time.monotonic() + 60.0
    while True:
        runs = await asyncio.to_thread(read_series, http, token, task_id, "loss")
        steps = [s for points in runs.values() for s, _, _ in points]
        if (max(steps, default=0) >= last_step and len(runs) >= num_runs) or time.monotonic() > deadline:
            return runs
        await asyncio.sleep(0.5)


def _fmt_s(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds >= 0 else "?"


async def train_section(
    addresses: Sequence[str],
    admin_token: str,
    plan: TrainPlan,
    step: Callable[[str], None],
    say: Callable[[str], None],
    cluster: ClusterHandle | None = None,
) -> None:
    """The whole training story on the running cluster (see the module docstring); the faults need ``cluster``."""
    demo = TrainDemo(addresses, admin_token, plan, step, say)
    await demo.setup()
    await demo.nodes()
    data = await demo.data()
    step(f"{TRAINER} submits the example trainer with hfai (data and checkpoints in 3FS) and the terminal follows it")
    ckpt = f"hf3fs://{demo.folder}/ckpt"
    run = await demo.submit(data, ckpt, TASK_NAME)
    user = SchedulerUser(demo.scheduler, demo.tokens[TRAINER], timeout_s=10.0)
    try:
        await demo.follow(user, run, _at_step(plan.preempt_at_step), f"step {plan.preempt_at_step}")
        urgent_id = await demo.preempt(run)
        task = await demo.follow(user, run, _suspended, "the suspend")
        first = task.runs[0]
        say(
            f"run {first.run_index} {_name(pb.RunState, first.state)} ({_name(pb.RunEndReason, first.end_reason)}: "
            f"{first.end_message}); suspend stage {_name(pb.SuspendStage, first.suspend_stage)}"
        )
        owner = await asyncio.to_thread(_owner, demo, first.last_checkpoint.path)
        say(
            f"its checkpoint, as the scheduler counted it: {first.last_checkpoint.path} at step "
            f"{first.last_checkpoint.step}; in 3FS, owner uid {owner}"
        )
        step(f"{URGENT}'s task runs; then the trainer resumes from its checkpoint and continues its loss curve")
        task = await demo.follow(user, run, _resumed, "the resume")
        faults: list[FaultRecord] = []
        if plan.faults:
            if cluster is None:
                raise TrainDemoError("the faults need the appliance's state folder")
            faults = await _inject_faults(demo, cluster, user, run, plan.faults)
        task = await demo.follow(user, run, _finished, "the end")
        say(f"task {run.task_id}: {_name(pb.TaskState, task.state)} after {task.num_runs} runs")
        if task.state != pb.TASK_STATE_SUCCEEDED:
            raise TrainDemoError(
                f"the training task ended {_name(pb.TaskState, task.state)}: {task.current_run.end_message}"
            )
        urgent_task = await _task_as(demo, URGENT, urgent_id)
        reference = None
        if plan.faults:
            step("an uninterrupted reference run of the same trainer (same data order and seed)")
            ref_run = await demo.submit(data, f"hf3fs://{demo.folder}/ckpt-reference", REFERENCE_NAME)
            await demo.follow(user, ref_run, _finished, "the reference's end")
            reference = await wait_series(demo.http, demo.tokens[TRAINER], ref_run.task_id, plan.num_steps, 1)
    finally:
        await user.close()
    series = await wait_series(demo.http, demo.tokens[TRAINER], run.task_id, plan.num_steps, task.num_runs)
    step("summary (read back from the scheduler, telemetry and 3FS)")
    for line in summary(task, urgent_task, series, reference, owner, plan, faults):
        say(line)
    if plan.quick:
        say("--quick: faults skipped")


async def _inject_faults(
    demo: TrainDemo, cluster: ClusterHandle, user: SchedulerUser, run: _Run, kinds: Sequence[str]
) -> list[FaultRecord]:
    """The faults ``kinds``, one after the other, each once the run it hits has trained a little.

    A fault that ends the run also waits for a checkpoint of the run's own. Then a node the hang fault cordoned is
    validated back into scheduling.
    """
    mgmtd = MgmtdClient(demo.addresses, token=demo.admin_token)
    admin = SchedulerUser(demo.scheduler, demo.admin_token, timeout_s=10.0)
    faults = Faults(
        cluster,
        mgmtd,
        admin,
        lambda: demo.poll(user, run),
        lambda rid: run.newest_by_run.get(rid, 0),
        demo.step,
        demo.say,
    )
    records = []
    try:
        for kind, inject in zip(FAULT_KINDS, (faults.storage, faults.agent, faults.hang), strict=True):
            if kind not in kinds:
                continue
            task, at_step = await faults.trained(FAULT_AFTER_STEPS)
            if kind != "storage":  # it ends the run: the task resumes from the run's own newest checkpoint
                task, at_step = await faults.checkpointed()
            records.append(await inject(task, at_step))
        for rec in records:
            if rec.kind == "hang":
                demo.say(await faults.return_node(rec.node_id))
    except FaultError as err:
        raise TrainDemoError(str(err)) from None
    finally:
        await admin.close()
        await mgmtd.close()
    return records


async def _task_as(demo: TrainDemo, who: str, task_id: int) -> pb.Task:
    user = SchedulerUser(demo.scheduler, demo.tokens[who], timeout_s=10.0)
    try:
        return await user.task(task_id)
    finally:
        await user.close()


def _owner(demo: TrainDemo, path: str) -> int:
    with demo.fs(TRAINER) as fs:
        return int(fs.stat(path).uid)


def summary(
    task: pb.Task,
    urgent: pb.Task,
    series: dict[int, list[tuple[int, float, float]]],
    reference: dict[int, list[tuple[int, float, float]]] | None,
    owner_uid: int,
    plan: TrainPlan,
    faults: Sequence[FaultRecord] = (),
) -> list[str]:
    """The table of events and figures; raises TrainDemoError where the facts contradict the story."""
    first = task.runs[0]
    # the resume: the first later run that trained (one that failed before a step does not count)
    second = next((r for r in task.runs[1:] if series.get(r.run_id)), task.runs[1])
    ck = first.last_checkpoint
    before = series.get(first.run_id, [])
    after = series.get(second.run_id, [])
    trained_before = max((s for s, _, _ in before), default=0)
    resumed_at = min((s for s, _, _ in after), default=0) - 1
    first_new_at = min((at for s, _, at in after), default=0.0)
    steps = sorted({s for points in series.values() for s, _, _ in points})
    final = {s: v for _, points in sorted(series.items()) for s, v, _ in points}  # a step trained again: the last
    nodes = ", ".join(str(n.node_id) for n in first.nodes)
    rows = [
        ("run 0 started", f"on {len(first.nodes)} nodes (node ids {nodes}) at priority {first.priority}"),
        ("preempted", f"for task {urgent.task_id} of {urgent.user_name} (priority {urgent.priority}); "
                      f"{first.end_message or _name(pb.RunEndReason, first.end_reason)}"),
        ("suspend took", f"{_fmt_s(first.ended_at - first.suspend_requested_at)} from the flag to the run's end "
                         f"(checkpoint committed after {_fmt_s(ck.committed_at - first.suspend_requested_at)})"),
        ("checkpoint", f"{ck.path} step {ck.step}, owner uid {owner_uid} (task's user uid {task.uid})"),
        ("waited", f"{_fmt_s(second.started_at - first.ended_at)} (task {urgent.task_id} ran "
                   f"{_fmt_s(urgent.finished_at - urgent.first_started_at)})"),
        ("resume took", f"{_fmt_s(second.started_at - urgent.finished_at)} from the nodes' release to run "
                        f"{second.run_index} running, {_fmt_s(first_new_at - second.started_at)} to its first step"),
        ("resumed at", f"step {resumed_at + 1} (checkpoint step {ck.step})"),
        ("steps lost", f"{max(trained_before - ck.step, 0)} (trained after the checkpoint, trained again)"),
        ("loss series", f"steps {steps[0] if steps else '?'}..{steps[-1] if steps else '?'}, {len(steps)} steps, "
                        f"{'no gap' if steps == list(range(1, plan.num_steps + 1)) else 'GAPS'}"),
    ]  # fmt: skip
    try:
        rows += fault_rows(task, series, list(faults))
    except FaultError as err:
        raise TrainDemoError(str(err)) from None
    last = plan.num_steps
    if final:
        ref_text = f"step 1: {final.get(1, float('nan')):.4f}; a uniform guess over bytes: {math.log(256):.4f}"
        if reference:
            ref_final = {s: v for points in reference.values() for s, v, _ in points}.get(last, float("nan"))
            diff = abs(final.get(last, 0.0) - ref_final)
            ref_text = f"uninterrupted reference: {ref_final:.6f} (difference {diff:.2e})"
        rows.append(("final loss", f"step {last}: {final.get(last, float('nan')):.6f}; {ref_text}"))
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    if ck.step <= 0 or resumed_at != ck.step or owner_uid != task.uid or steps != list(range(1, last + 1)):
        raise TrainDemoError("the facts read back do not match a suspend and resume:\n" + "\n".join(lines))
    return lines


async def run_train_demo(
    addresses: Sequence[str], admin_token: str, plan: TrainPlan, out: TextIO, cluster: ClusterHandle | None = None
) -> None:
    """The training story, its steps numbered as ``[n/N] title`` and what the cluster answered indented."""
    num_titles = 6 + (len(plan.faults) + 1 if plan.faults else 0)  # a title per fault, and the reference run
    counter = [0]

    def step(title: str) -> None:
        counter[0] += 1
        print(f"\n[{counter[0]}/{num_titles}] {title}", file=out, flush=True)

    def say(text: str) -> None:
        for line in text.splitlines():
            print(f"    {line}", file=out, flush=True)

    await train_section(addresses, admin_token, plan, step, say, cluster)
