"""The scheduler part of ``fireflyer demo``: quotas, priorities, the queue's reasons, refusals, a suspend, a stop.

Quotas, submissions at several priorities (AUTO too), the queue's reasons, a task bigger than the cluster refused,
another user kept out, a suspend and a stop. The appliance's nodes are held (disabled) meanwhile, so the tasks stay
queued: what is shown is the scheduler's bookkeeping and its rules (tasks that run on the agents are in the agent part
of the demo).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence

from ff_appliance.scheduler_setup import scheduler_address, set_quota
from ff_appliance.scheduler_user import SchedulerUser, user_token
from ff_cluster import MgmtdClient
from ff_rpc import RpcError
from fireflyer.scheduler.v1 import scheduler_pb2 as pb

NUM_STEPS = 3
USERS = ("sched-alice", "sched-bob")
LEVEL_NAMES = {
    50: "EXTREME_HIGH",
    40: "VERY_HIGH",
    30: "HIGH",
    20: "ABOVE_NORMAL",
    10: "NORMAL",
    8: "UNDER_NORMAL",
    5: "BELOW_NORMAL",
    0: "LOW",
    -1: "AUTO (not placed yet)",
}
TICK_WAIT_S = 5.0
HELD = "held by fireflyer demo while it shows queued tasks"


class SchedulerDemoError(Exception):
    """The scheduler did not answer what the demo expects."""


def _line(t: pb.Task) -> str:
    state = pb.TaskState.Name(t.state).removeprefix("TASK_STATE_").lower()
    reason = pb.QueueReason.Name(t.queue_reason).removeprefix("QUEUE_REASON_").lower()
    return (
        f"task {t.task_id} {t.spec.name!r}: {t.spec.num_nodes} nodes, priority "
        f"{LEVEL_NAMES.get(t.priority, t.priority)}, {state} ({reason})"
    )


async def _settled(user: SchedulerUser, task_ids: list[int]) -> list[pb.Task]:
    """The tasks once the scheduler's ticks have given each a queue reason."""
    deadline = time.monotonic() + TICK_WAIT_S
    while True:
        tasks = [(await user.scheduler.get_task(pb.GetTaskRequest(task_id=i))).task for i in task_ids]
        if all(t.queue_reason or t.state != pb.TASK_STATE_QUEUED for t in tasks) or time.monotonic() > deadline:
            return tasks
        await asyncio.sleep(0.2)


async def _hold_nodes(admin: SchedulerUser) -> list[int]:
    """Disable the ready nodes (so the demo's tasks wait); the ids, to enable them again."""
    nodes = (await admin.scheduler.list_nodes(pb.ListNodesRequest(states=[pb.NODE_STATE_READY]))).nodes
    for n in nodes:
        await admin.scheduler.set_node_enabled(pb.SetNodeEnabledRequest(node_id=n.node_id, enabled=False, reason=HELD))
    return [n.node_id for n in nodes]


async def _release_nodes(admin: SchedulerUser, node_ids: list[int]) -> None:
    for node_id in node_ids:
        await admin.scheduler.set_node_enabled(pb.SetNodeEnabledRequest(node_id=node_id, enabled=True))


async def _refused_as_too_big(alice: SchedulerUser, say: Callable[[str], None]) -> None:
    spec = pb.TaskSpec(name="too-big", argv=["python", "train.py"], num_nodes=8, priority=10)
    try:
        await alice.scheduler.submit_task(pb.SubmitTaskRequest(spec=spec))
    except RpcError as err:
        if err.code.name != "FAILED_PRECONDITION":
            raise
        say(f"8 nodes on this cluster: {err.code.name}: {err.details}")
        return
    raise SchedulerDemoError("a task bigger than the cluster was accepted")


async def scheduler_section(
    addresses: Sequence[str], admin_token: str, step: Callable[[str], None], say: Callable[[str], None]
) -> None:
    """Run the scheduler steps as two demo users (``step`` prints a title, ``say`` a result); nodes held meanwhile.

    Raises:
        SchedulerDemoError: the scheduler accepted what it must refuse or did not place, suspend or stop as shown.
    """
    mgmtd = MgmtdClient(list(addresses), token=admin_token)
    try:
        address = await scheduler_address(mgmtd)
        alice_token, bob_token = [await user_token(mgmtd, u) for u in USERS]
    finally:
        await mgmtd.close()
    alice, bob = SchedulerUser(address, alice_token), SchedulerUser(address, bob_token)
    admin = SchedulerUser(address, admin_token)
    held: list[int] = []
    try:
        step(f"scheduler: quotas for {USERS[0]}, then tasks at several priorities")
        await set_quota(address, admin_token, USERS[0], 30, 3)
        await set_quota(address, admin_token, USERS[0], 10, 4)
        say(f"quota of {USERS[0]}: HIGH 3 nodes, NORMAL 4 nodes (group default)")
        held = await _hold_nodes(admin)
        say(f"the appliance's nodes {held} are held (disabled) meanwhile, so the tasks wait")
        specs = [
            pb.TaskSpec(name="train-high", argv=["python", "train.py"], num_nodes=2, priority=30),
            pb.TaskSpec(name="train-auto", argv=["python", "train.py"], num_nodes=2, auto_priority=True),
            pb.TaskSpec(name="over-quota", argv=["python", "train.py"], num_nodes=1, priority=20),
        ]
        ids = [(await alice.scheduler.submit_task(pb.SubmitTaskRequest(spec=s))).task.task_id for s in specs]
        tasks = await _settled(alice, ids)
        for t in tasks:
            say(_line(t))
        if tasks[2].queue_reason != pb.QUEUE_REASON_QUOTA_EXCEEDED or tasks[1].priority != 10:
            raise SchedulerDemoError("expected AUTO to take NORMAL and no quota at ABOVE_NORMAL")
        say("AUTO took NORMAL (HIGH has 1 node left); ABOVE_NORMAL has no quota for this user")
        await _refused_as_too_big(alice, say)

        step(f"{USERS[1]} cannot see, suspend or stop {USERS[0]}'s tasks")
        attempts: list[tuple[str, Callable[[], Awaitable[object]]]] = [
            ("GetTask", lambda: bob.scheduler.get_task(pb.GetTaskRequest(task_id=ids[0]))),
            ("StopTask", lambda: bob.scheduler.stop_task(pb.StopTaskRequest(task_id=ids[0]))),
        ]
        for method, call in attempts:
            try:
                await call()
            except RpcError as err:
                say(f"{method} of task {ids[0]}: {err.code.name}")
                continue
            raise SchedulerDemoError(f"{USERS[1]} could {method} another user's task")
        listed = (await bob.scheduler.list_tasks(pb.ListTasksRequest())).tasks
        say(f"{USERS[1]} lists {len(listed)} tasks")

        step(f"{USERS[0]} suspends a queued task (nothing to do) and stops the others")
        t = (await alice.scheduler.suspend_task(pb.SuspendTaskRequest(task_id=ids[0]))).task
        say(f"suspend while queued: {_line(t)}")
        for task_id in ids:
            t = (await alice.scheduler.stop_task(pb.StopTaskRequest(task_id=task_id))).task
            say(_line(t) + (f" - {t.end_message}" if t.end_message else ""))
            if t.state != pb.TASK_STATE_STOPPED:
                raise SchedulerDemoError(f"task {task_id} is not stopped")
    finally:
        await _release_nodes(admin, held)
        await alice.close()
        await bob.close()
        await admin.close()
