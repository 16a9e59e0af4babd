"""A training task's telemetry on a real cluster (mgmtd, scheduler, telemetry in this process; the agent and
its rank as processes): the rank's samples carry the labels the agent gave it (not the ones the task asked
for), the node's own series arrive, and alerts fire on injected faults and resolve when they end: a task
that stops making progress, a NaN loss, an agent killed."""

from __future__ import annotations

import asyncio
import io
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
import pytest_asyncio

from ff_appliance import cli
from ff_rpc import RpcError
from ff_testing.agent import AgentProcess, spawn_process, wait_run_running
from ff_testing.mgmtd import CLUSTER_TOKEN, running_with_users
from ff_testing.scheduler import SchedulerClient, set_quota, spec
from ff_testing.scheduler import start_in_process as start_scheduler
from ff_testing.telemetry import TelemetryClient
from ff_testing.telemetry import start_in_process as start_telemetry
from ff_testing.waiting import eventually
from fireflyer.scheduler.v1 import scheduler_pb2 as spb
from fireflyer.telemetry.v1 import telemetry_pb2 as pb

pytestmark = pytest.mark.asyncio(loop_scope="module")

RULES = """
version = 2
interval_s = 0.3
[[rules]]
name = "node-lost"
kind = "node_lost"
severity = "critical"
[[rules]]
name = "task-no-progress"
kind = "task_no_progress"
window_s = 2.0
[[rules]]
name = "loss-nan"
kind = "loss_nan"
severity = "critical"
"""

# Reports a step every 0.1 s unless told to stall (control files in argv[1]); a NaN loss while "nan" exists;
# tries to set its own task_id label (the agent's wins).
TRAIN = """
import math, os, sys, time
from hfai import telemetry
ctl, step = sys.argv[1], 0
while not os.path.exists(os.path.join(ctl, "stop")):
    step += 1
    if not os.path.exists(os.path.join(ctl, "stall")):
        nan = os.path.exists(os.path.join(ctl, "nan"))
        telemetry.report(step=step, loss=math.nan if nan else 1.0 / step, labels={"task_id": "999", "phase": "a"})
    time.sleep(0.1)
"""
AGENT_NODE_ID = 77


@dataclass
class Env:
    folder: Path
    mgmtd_address: str
    scheduler_address: str
    telemetry_address: str
    tokens: dict[str, str]
    agent: AgentProcess | None = None
    clients: list[SchedulerClient | TelemetryClient] = field(default_factory=list)

    def telemetry(self, who: str) -> TelemetryClient:
        client = TelemetryClient(self.telemetry_address, CLUSTER_TOKEN if who == "cluster" else self.tokens[who])
        self.clients.append(client)
        return client

    def scheduler(self, who: str) -> SchedulerClient:
        client = SchedulerClient(self.scheduler_address, self.tokens[who])
        self.clients.append(client)
        return client

    async def start_agent(self) -> AgentProcess:
        self.agent = spawn_process(
            self.folder,
            self.mgmtd_address,
            CLUSTER_TOKEN,
            "a1",
            scheduler_address=self.scheduler_address,
            node_id=AGENT_NODE_ID,
            telemetry_interval_s=0.5,
            num_device_slots=1,
        )
        return await self.agent.ready()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Env]:
    folder = Path(tmp_path_factory.mktemp("alerts"))
    (folder / "rules.toml").write_text(RULES)
    # A 2 s node lease (the suite's is 4 s): the node-lost alert waits for the killed agent's lease to lapse.
    lease = {"lease_duration_s": 2.0}
    async with running_with_users(folder, f"sqlite:///{folder / 'mgmtd.db'}", **lease) as (mgmtd, tokens):
        scheduler = await start_scheduler(
            folder, f"sqlite:///{folder / 'sched.db'}", mgmtd.address, CLUSTER_TOKEN, telemetry_interval_s=0.5
        )
        telemetry = await start_telemetry(
            folder,
            f"sqlite:///{folder / 'telemetry.db'}",
            mgmtd.address,
            CLUSTER_TOKEN,
            alerts=True,
            alerts_config=folder / "rules.toml",
            scrape_interval_s=0,
        )
        e = Env(folder, mgmtd.address, scheduler.address, telemetry.address, tokens)
        try:
            await set_quota(e.scheduler("root"), "alice", 10, 1)
            await e.start_agent()
            yield e
        finally:
            if e.agent is not None:  # off the loop: the scheduler here answers the agent's final report
                await asyncio.to_thread(e.agent.terminate)
            for c in e.clients:
                await c.close()
            await telemetry.shutdown()
            await scheduler.shutdown()


async def firing(env: Env, who: str, rule: str) -> list[pb.Alert]:
    c = env.telemetry(who)
    resp = await c.call(c.stub.ListAlerts, pb.ListAlertsRequest(rule=rule, state=pb.ALERT_STATE_FIRING))
    return list(resp.alerts)


async def wait_alert(env: Env, rule: str, *, resolved: bool, **labels: str) -> pb.Alert:
    """The alert of ``rule`` with ``labels``, once it fired (or, ``resolved``, once it resolved)."""
    found: list[pb.Alert] = []

    async def check() -> bool:
        c = env.telemetry("cluster")
        resp = await c.call(c.stub.ListAlerts, pb.ListAlertsRequest(rule=rule))
        found[:] = [
            a for a in resp.alerts if labels.items() <= dict(a.labels).items() and bool(a.resolved_at) == resolved
        ]
        return bool(found)

    await eventually(check, timeout_s=30, what=f"{rule} {labels} {'resolved' if resolved else 'firing'}")
    return found[0]


async def all_resolved(env: Env, rule: str, **labels: str) -> dict[int, pb.Alert]:
    """Every alert of ``rule`` with ``labels``, once none is firing. (Samples reported before a stall may arrive
    after its alert fired, resolving it and firing it anew once the stall shows again: one alert or several.)"""
    found: dict[int, pb.Alert] = {}

    async def check() -> bool:
        c = env.telemetry("cluster")
        resp = await c.call(c.stub.ListAlerts, pb.ListAlertsRequest(rule=rule))
        found.clear()
        found.update({a.alert_id: a for a in resp.alerts if labels.items() <= dict(a.labels).items()})
        return bool(found) and all(a.resolved_at for a in found.values())

    await eventually(check, timeout_s=30, what=f"every {rule} {labels} resolved")
    return found


async def fireflyer(env: Env, *argv: str, token: str) -> tuple[int, str]:
    """The appliance CLI (``fireflyer``), run as a user would (its own event loop, in a thread)."""
    out, err = io.StringIO(), io.StringIO()
    args = [*argv, "--mgmtd", env.mgmtd_address, "--token", token, "--state-dir", str(env.folder / "no-state")]
    code = await asyncio.to_thread(cli.run, args, {}, out, err)
    return code, out.getvalue() + err.getvalue()


async def query(env: Env, who: str, name: str, **labels: str) -> list[pb.Series]:
    c = env.telemetry(who)
    now = time.time()
    matchers = [pb.LabelMatcher(name=k, op=pb.MATCH_OP_EQUAL, value=v) for k, v in labels.items()]
    req = pb.QueryRangeRequest(name=name, matchers=matchers, start_at=now - 60, end_at=now, step_s=1.0)
    return list((await c.call(c.stub.QueryRange, req)).series)


async def test_a_ranks_samples_carry_the_agents_labels_and_alerts_follow_its_faults(env: Env) -> None:
    ctl = env.folder / "ctl"
    ctl.mkdir()
    (env.folder / "train.py").write_text(TRAIN)
    alice = env.scheduler("alice")
    asked = spec(
        1,
        10,
        argv=["python", str(env.folder / "train.py"), str(ctl)],
        env={"FF_TELEMETRY_LABELS": '{"task_id": "999", "rank": "5"}'},
    )
    task = (await alice.call(alice.user.SubmitTask, spb.SubmitTaskRequest(spec=asked))).task
    run = (await wait_run_running(alice, task.task_id)).current_run

    async def reported() -> bool:
        return bool(await query(env, "alice", "hfai_step", task_id=str(task.task_id)))

    await eventually(reported, timeout_s=30, what="the rank's steps in telemetry")
    (steps,) = await query(env, "alice", "hfai_step", task_id=str(task.task_id))
    assert dict(steps.labels) == {
        "task_id": str(task.task_id),
        "run_id": str(run.run_id),
        "node_rank": "0",
        "rank": "0",
        "local_rank": "0",
        "node": "a1",
        "user": "alice",
        "phase": "a",
    }
    values = [p.value for p in steps.points]
    assert values == sorted(values) and values[-1] > 1
    assert await query(env, "bob", "hfai_step", task_id=str(task.task_id)) == []  # bob does not see alice's task
    assert await query(env, "cluster", "ff_node_cpus", node="a1", service="agent")  # the agent's node series

    async def queue_pushed() -> bool:  # the scheduler's queue series: one task running, its run running
        tasks = await query(env, "cluster", "ff_scheduler_tasks", state="running", service="scheduler")
        runs = await query(env, "cluster", "ff_scheduler_runs", state="running")
        return [s.points[-1].value for s in tasks + runs] == [1.0, 1.0]

    await eventually(queue_pushed, timeout_s=30, what="the scheduler's queue series")

    # The task stops making progress, and its loss turns NaN: both alerts fire, for alice's eyes only.
    (ctl / "stall").touch()
    stuck = await wait_alert(env, "task-no-progress", resolved=False, task_id=str(task.task_id))
    assert dict(stuck.labels) == {"task_id": str(task.task_id), "run_id": str(run.run_id), "user": "alice"}
    assert stuck.severity == "warning" and stuck.config_version == 2 and stuck.kind == "task_no_progress"
    assert [a.alert_id for a in await firing(env, "alice", "task-no-progress")] == [stuck.alert_id]
    assert await firing(env, "bob", "task-no-progress") == []
    (ctl / "nan").touch()
    (ctl / "stall").unlink()
    nan = await wait_alert(env, "loss-nan", resolved=False, task_id=str(task.task_id))
    assert dict(nan.labels)["rank"] == "0" and "nan" in nan.summary
    ended = await all_resolved(env, "task-no-progress", task_id=str(task.task_id))
    assert ended[stuck.alert_id].resolved_at > ended[stuck.alert_id].fired_at
    (ctl / "nan").unlink()
    cleared = await wait_alert(env, "loss-nan", resolved=True, task_id=str(task.task_id))
    assert cleared.alert_id == nan.alert_id
    code, out = await fireflyer(env, "alerts", "--resolved", "--rule", "loss-nan", token=env.tokens["alice"])
    assert code == 0 and f"\n{nan.alert_id} " in out and "resolved" in out and "loss is nan" in out, out
    code, out = await fireflyer(env, "alerts", "--rule", "loss-nan", token=env.tokens["bob"])
    assert code == 0 and out.startswith("no alerts (rules version 2)"), out
    (ctl / "stop").touch()

    # The agent is killed: mgmtd declares its node dead and the alert fires; back, it resolves.
    assert env.agent is not None
    env.agent.proc.kill()
    await asyncio.to_thread(env.agent.proc.wait)
    lost = await wait_alert(env, "node-lost", resolved=False, node_id=str(AGENT_NODE_ID))
    assert dict(lost.labels)["node_type"] == "agent" and lost.severity == "critical"
    await env.start_agent()
    back = await wait_alert(env, "node-lost", resolved=True, node_id=str(AGENT_NODE_ID))
    assert back.alert_id == lost.alert_id
    assert not math.isnan(back.resolved_at) and back.resolved_at >= lost.fired_at


async def test_a_bad_alert_query_is_refused(env: Env) -> None:
    c = env.telemetry("alice")
    for request, detail in [
        (pb.ListAlertsRequest(page_token="x"), "page_token"),
        (pb.ListAlertsRequest(state=7), "state"),  # type: ignore[arg-type]
    ]:
        with pytest.raises(RpcError) as err:
            await c.call(c.stub.ListAlerts, request)
        assert err.value.code is grpc.StatusCode.INVALID_ARGUMENT and detail in err.value.details
