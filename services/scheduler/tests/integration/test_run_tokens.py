"""A run's token (what its ranks use as FF_TOKEN/HFAI_TOKEN) is its owner's, works while the run runs,
and is revoked in the identity registry once the run has ended."""

from __future__ import annotations

from typing import Any

import grpc

from ff_rpc import RpcError
from ff_testing.scheduler import SchedulerClient, set_quota, spec
from ff_testing.waiting import eventually
from fireflyer.scheduler.v1 import scheduler_pb2 as pb


async def test_a_runs_token_is_its_owners_and_is_revoked_when_the_run_ends(cluster: Any) -> None:
    agent = await cluster.add_agent()
    root, alice = cluster.client("root"), cluster.client("alice")
    await set_quota(root, "alice", 10, 1)
    task = (await alice.call(alice.user.SubmitTask, pb.SubmitTaskRequest(spec=spec(1, 10)))).task
    await agent.wait_for(lambda: bool(agent.starts))
    token = agent.starts[0].token
    as_run = SchedulerClient(cluster.scheduler.address, token)
    cluster.clients.append(as_run)
    assert (await as_run.call(as_run.user.WhoAmI, pb.WhoAmIRequest())).principal.name == "alice"

    await alice.call(alice.user.StopTask, pb.StopTaskRequest(task_id=task.task_id))
    await eventually(lambda: revoked(as_run), timeout_s=20, what="the ended run's token revoked")
    # alice's own token is untouched
    assert (await alice.call(alice.user.WhoAmI, pb.WhoAmIRequest())).principal.name == "alice"


async def test_a_token_issued_before_a_scheduler_restart_is_revoked_when_its_run_ends(cluster: Any) -> None:
    agent = await cluster.add_agent()
    root, alice = cluster.client("root"), cluster.client("alice")
    await set_quota(root, "alice", 10, 1)
    task = (await alice.call(alice.user.SubmitTask, pb.SubmitTaskRequest(spec=spec(1, 10)))).task
    await agent.wait_for(lambda: bool(agent.starts))
    as_run = SchedulerClient(cluster.scheduler.address, agent.starts[0].token)
    cluster.clients.append(as_run)
    await cluster.restart_scheduler()  # the new process never saw this token issued
    as_run = SchedulerClient(cluster.scheduler.address, agent.starts[0].token)
    cluster.clients.append(as_run)
    assert (await as_run.call(as_run.user.WhoAmI, pb.WhoAmIRequest())).principal.name == "alice"

    alice = cluster.client("alice")
    await alice.call(alice.user.StopTask, pb.StopTaskRequest(task_id=task.task_id))
    await eventually(lambda: revoked(as_run), timeout_s=20, what="the token of a run ended after a restart revoked")


async def revoked(as_run: SchedulerClient) -> bool:
    """Whether the scheduler now refuses the run's token as unknown."""
    try:
        await as_run.call(as_run.user.WhoAmI, pb.WhoAmIRequest())
    except RpcError as err:
        return err.code is grpc.StatusCode.UNAUTHENTICATED
    return False
