"""Security and bad input: users see and control only their own tasks; quotas and nodes only by admins;
missing or wrong tokens are rejected; bad submissions are INVALID_ARGUMENT and create nothing."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from ff_rpc import RpcError
from ff_scheduler.core import priority as p
from ff_testing.scheduler import SchedulerClient, set_quota, spec
from fireflyer.scheduler.v1 import scheduler_pb2 as pb


async def _code(call: Any) -> grpc.StatusCode:
    with pytest.raises(RpcError) as info:
        await call
    return info.value.code


async def test_users_see_and_control_only_their_own_tasks(cluster: Any) -> None:
    agent = await cluster.add_agent()
    alice, bob, root = cluster.client("alice"), cluster.client("bob"), cluster.client("root")
    task = (await alice.call(alice.user.SubmitTask, pb.SubmitTaskRequest(spec=spec(1, p.LOW)))).task
    for call in (
        bob.call(bob.user.GetTask, pb.GetTaskRequest(task_id=task.task_id)),
        bob.call(bob.user.StopTask, pb.StopTaskRequest(task_id=task.task_id)),
        bob.call(bob.user.SuspendTask, pb.SuspendTaskRequest(task_id=task.task_id)),
        bob.call(bob.user.SetTaskPriority, pb.SetTaskPriorityRequest(task_id=task.task_id, priority=p.HIGH)),
    ):
        assert await _code(call) == grpc.StatusCode.NOT_FOUND
    logs = bob.rpc.stream(bob.user.StreamLogs, pb.StreamLogsRequest(task_id=task.task_id))
    assert await _code(logs.__anext__()) == grpc.StatusCode.NOT_FOUND
    assert (await bob.call(bob.user.ListTasks, pb.ListTasksRequest())).tasks == []
    assert (
        await _code(bob.call(bob.user.ListTasks, pb.ListTasksRequest(all_users=True)))
        == grpc.StatusCode.PERMISSION_DENIED
    )
    assert [t.task_id for t in (await alice.call(alice.user.ListTasks, pb.ListTasksRequest())).tasks] == [task.task_id]
    everyone = await root.call(root.user.ListTasks, pb.ListTasksRequest(all_users=True))
    assert [t.user_name for t in everyone.tasks] == ["alice"]
    # still queued (no quota), untouched by bob
    assert (
        await alice.call(alice.user.GetTask, pb.GetTaskRequest(task_id=task.task_id))
    ).task.state == pb.TASK_STATE_QUEUED
    stopped = await root.call(root.user.StopTask, pb.StopTaskRequest(task_id=task.task_id))
    assert stopped.task.state == pb.TASK_STATE_STOPPED and stopped.task.end_reason == pb.RUN_END_REASON_STOPPED_BY_ADMIN
    assert agent.starts == []


async def test_quotas_and_nodes_only_by_admin(cluster: Any) -> None:
    agent = await cluster.add_agent()
    alice = cluster.client("alice")
    quota = pb.Quota(user_name="alice", priority=p.HIGH, node_group="default", max_nodes=100)
    for call in (
        alice.call(alice.user.SetQuota, pb.SetQuotaRequest(quota=quota)),
        alice.call(alice.user.ListQuotas, pb.ListQuotasRequest()),
        alice.call(alice.user.SetNodeEnabled, pb.SetNodeEnabledRequest(node_id=agent.node_id, enabled=False)),
        alice.call(alice.user.ValidateNodes, pb.ValidateNodesRequest()),
        alice.call(alice.agent.RegisterNode, pb.RegisterNodeRequest(node_id=99, hostname="x", agent_address="x:1")),
        alice.call(alice.agent.ReportRunStatus, pb.ReportRunStatusRequest(node_id=agent.node_id)),
    ):
        assert await _code(call) == grpc.StatusCode.PERMISSION_DENIED
    me = await alice.call(alice.user.WhoAmI, pb.WhoAmIRequest())
    assert me.principal.name == "alice" and list(me.quotas) == []
    nodes = await alice.call(alice.user.ListNodes, pb.ListNodesRequest())  # users may look at nodes
    assert [n.state for n in nodes.nodes] == [pb.NODE_STATE_READY]


async def test_missing_or_wrong_tokens_are_rejected(cluster: Any) -> None:
    for token in ("", "fft_1_notthesecret", "garbage"):
        client = SchedulerClient(cluster.scheduler.address, token)
        try:
            code = await _code(client.call(client.user.ListTasks, pb.ListTasksRequest()))
        finally:
            await client.close()
        assert code == grpc.StatusCode.UNAUTHENTICATED


BAD_SUBMISSIONS = [
    ("zero nodes", spec(0), ""),
    ("unknown group", spec(1, node_group="no-such-group"), ""),
    ("priority out of range", spec(1, 7), ""),
    ("negative priority", spec(1, -1), ""),
    ("priority and auto", spec(1, p.LOW, auto_priority=True), ""),
    ("command too large", spec(1, argv=["python", "x" * 70_000]), ""),
    ("empty command", spec(1, argv=[]), ""),
    ("bad env name", spec(1, env={"A=B": "1"}), ""),
    ("negative watchdog", spec(1, watchdog_time_s=-1), ""),
    ("request id too long", spec(1), "r" * 200),
]


async def test_bad_submissions_are_invalid_argument_and_create_nothing(cluster: Any) -> None:
    alice, root = cluster.client("alice"), cluster.client("root")
    for what, task_spec, request_id in BAD_SUBMISSIONS:
        request = pb.SubmitTaskRequest(spec=task_spec, request_id=request_id)
        assert await _code(alice.call(alice.user.SubmitTask, request)) == grpc.StatusCode.INVALID_ARGUMENT, what
    assert (await root.call(root.user.ListTasks, pb.ListTasksRequest(all_users=True))).tasks == []


async def test_bad_admin_input_is_invalid_argument(cluster: Any) -> None:
    root = cluster.client("root")
    for quota in (
        pb.Quota(user_name="alice", priority=7, node_group="default", max_nodes=1),
        pb.Quota(user_name="", priority=p.LOW, node_group="default", max_nodes=1),
        pb.Quota(user_name="alice", priority=p.LOW, node_group="bad group!", max_nodes=1),
    ):
        assert (
            await _code(root.call(root.user.SetQuota, pb.SetQuotaRequest(quota=quota)))
            == grpc.StatusCode.INVALID_ARGUMENT
        )
    assert (await root.call(root.user.ListQuotas, pb.ListQuotasRequest())).quotas == []
    assert (
        await _code(root.call(root.user.SetNodeEnabled, pb.SetNodeEnabledRequest(node_id=0)))
        == grpc.StatusCode.INVALID_ARGUMENT
    )
    assert (
        await _code(root.call(root.user.SetNodeEnabled, pb.SetNodeEnabledRequest(node_id=12345)))
        == grpc.StatusCode.NOT_FOUND
    )


async def test_retried_submission_with_a_request_id_creates_one_task_and_auto_priority(cluster: Any) -> None:
    await cluster.add_agent()
    alice, root = cluster.client("alice"), cluster.client("root")
    await set_quota(root, "alice", p.HIGH, 1)
    await set_quota(root, "alice", p.LOW, 4)
    first = await alice.call(
        alice.user.SubmitTask, pb.SubmitTaskRequest(spec=spec(1, auto_priority=True), request_id="r1")
    )
    again = await alice.call(
        alice.user.SubmitTask, pb.SubmitTaskRequest(spec=spec(1, auto_priority=True), request_id="r1")
    )
    assert first.task.task_id == again.task.task_id
    assert len((await alice.call(alice.user.ListTasks, pb.ListTasksRequest())).tasks) == 1
    assert first.task.spec.auto_priority and first.task.priority == -1
    me = await alice.call(alice.user.WhoAmI, pb.WhoAmIRequest())
    assert {(q.priority, q.max_nodes) for q in me.quotas} == {(p.HIGH, 1), (p.LOW, 4)}
