"""The scheduler part of ``fireflyer demo``: quotas, submissions at several priorities (AUTO too), the
queue's reasons, another user kept out, a suspend and a stop. The tasks ask for more nodes than the
appliance's agents have, so they stay queued (waiting for nodes): what is shown is the scheduler's
bookkeeping and its rules (tasks that run on the agents are in the agent part of the demo)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from ff_appliance.scheduler_setup import scheduler_address, set_quota
from ff_appliance.scheduler_user import SchedulerUser, user_token
from ff_cluster import MgmtdClient
from ff_rpc import RpcError
from fireflyer.scheduler.v1 import scheduler_pb2 as pb

NUM_STEPS = 3
USERS = ("sched-alice", "sched-bob")
LEVEL_NAMES = {50: "EXTREME_HIGH", 40: "VERY_HIGH", 30: "HIGH", 20: "ABOVE_NORMAL", 10: "NORMAL", 8: "UNDER_NORMAL",
               5: "BELOW_NORMAL", 0: "LOW", -1: "AUTO (not placed yet)"}  # fmt: skip
TICK_WAIT_S = 5.0


class SchedulerDemoError(Exception):
    """The scheduler did not answer what the demo expects."""


def _line(t: pb.Task) -> str:
    state = pb.TaskState.Name(t.state).removeprefix("TASK_STATE_").lower()
    reason = pb.QueueReason.Name(t.queue_reason).removeprefix("QUEUE_REASON_").lower()
    return (f"task {t.task_id} {t.spec.name!r}: {t.spec.num_nodes} nodes, priority "
            f"{LEVEL_NAMES.get(t.priority, t.priority)}, {state} ({reason})")  # fmt: skip


async def _settled(user: SchedulerUser, task_ids: list[int]) -> list[pb.Task]:
    """The tasks once the scheduler's ticks have given each a queue reason."""
    deadline = time.monotonic() + TICK_WAIT_S
    while True:
        tasks = [(await user.call("GetTask", pb.GetTaskRequest(task_id=i))).task for i in task_ids]
        if all(t.queue_reason or t.state != pb.TASK_STATE_QUEUED for t in tasks) or time.monotonic() > deadline:
            return tasks
        await asyncio.sleep(0.2)


async def scheduler_section(
    addresses: Sequence[str], admin_token: str, step: Callable[[str], None], say: Callable[[str], None]
) -> None:
    mgmtd = MgmtdClient(list(addresses), token=admin_token)
    try:
        address = await scheduler_address(mgmtd)
        alice_token, bob_token = [await user_token(mgmtd, u) for u in USERS]
    finally:
        await mgmtd.close()
    alice, bob = SchedulerUser(address, alice_token), SchedulerUser(address, bob_token)
    try:
        step(f"scheduler: quotas for {USERS[0]}, then tasks at several priorities")
        await set_quota(address, admin_token, USERS[0], 30, 3)
        await set_quota(address, admin_token, USERS[0], 10, 4)
        say(f"quota of {USERS[0]}: HIGH 3 nodes, NORMAL 4 nodes (group default)")
        specs = [pb.TaskSpec(name="train-high", argv=["python", "train.py"], num_nodes=3, priority=30),
                 pb.TaskSpec(name="train-auto", argv=["python", "train.py"], num_nodes=3, auto_priority=True),
                 pb.TaskSpec(name="too-big", argv=["python", "train.py"], num_nodes=8, priority=10)]  # fmt: skip
        ids = [(await alice.call("SubmitTask", pb.SubmitTaskRequest(spec=s))).task.task_id for s in specs]
        tasks = await _settled(alice, ids)
        for t in tasks:
            say(_line(t))
        if tasks[2].queue_reason != pb.QUEUE_REASON_QUOTA_EXCEEDED or tasks[1].priority != 10:
            raise SchedulerDemoError("expected AUTO to take NORMAL and 8 nodes to exceed the quota")
        say("the appliance's agents are 2 nodes: tasks in quota that need 3 wait for nodes")

        step(f"{USERS[1]} cannot see, suspend or stop {USERS[0]}'s tasks")
        for method, request in (("GetTask", pb.GetTaskRequest(task_id=ids[0])),
                                ("StopTask", pb.StopTaskRequest(task_id=ids[0]))):  # fmt: skip
            try:
                await bob.call(method, request)
            except RpcError as err:
                say(f"{method} of task {ids[0]}: {err.code.name}")
                continue
            raise SchedulerDemoError(f"{USERS[1]} could {method} another user's task")
        listed = (await bob.call("ListTasks", pb.ListTasksRequest())).tasks
        say(f"{USERS[1]} lists {len(listed)} tasks")

        step(f"{USERS[0]} suspends a queued task (nothing to do) and stops the others")
        t = (await alice.call("SuspendTask", pb.SuspendTaskRequest(task_id=ids[0]))).task
        say(f"suspend while queued: {_line(t)}")
        for task_id in ids:
            t = (await alice.call("StopTask", pb.StopTaskRequest(task_id=task_id))).task
            say(_line(t) + (f" - {t.end_message}" if t.end_message else ""))
            if t.state != pb.TASK_STATE_STOPPED:
                raise SchedulerDemoError(f"task {task_id} is not stopped")
    finally:
        await alice.close()
        await bob.close()
