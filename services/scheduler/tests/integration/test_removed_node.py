"""A node mgmtd removed (RemoveNode, as `fireflyer leave` does) is forgotten: not listed, never placed on again."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from ff_rpc import RpcError
from ff_scheduler.core import priority as p
from ff_testing.mgmtd import InProcessMgmtd, make_users, start_in_process
from ff_testing.scheduler import set_quota, spec, task_of
from ff_testing.waiting import eventually
from fireflyer.mgmtd.v1 import mgmtd_pb2
from fireflyer.scheduler.v1 import scheduler_pb2 as pb


@pytest.fixture
def db_url(sqlite_url: str) -> str:
    """SQLite only: the scheduler's part is one delete by id, the same SQL on PostgreSQL."""
    return sqlite_url


@pytest.fixture
async def registry(db_url: str, tmp_path: Path) -> AsyncIterator[tuple[InProcessMgmtd, dict[str, str]]]:
    """mgmtd with a 1 s node lease, so a node that stopped heartbeating is dead (removable) in a second."""
    mgmtd = await start_in_process(tmp_path, db_url, lease_duration_s=1.0, heartbeat_interval_s=0.25)
    try:
        yield mgmtd, await make_users(mgmtd)
    finally:
        await mgmtd.shutdown()


async def test_a_removed_node_is_forgotten_and_its_task_runs_elsewhere(cluster: Any) -> None:
    stays, leaves = await cluster.add_agent(), await cluster.add_agent()
    root, alice = cluster.client("root"), cluster.client("alice")
    await set_quota(root, "alice", p.NORMAL, 2)
    task = (await alice.call(alice.user.SubmitTask, pb.SubmitTaskRequest(spec=spec(2, max_restarts=3)))).task
    await leaves.wait_for(lambda: bool(leaves.starts))

    # The node stops (no heartbeat), an admin disables and removes it in mgmtd.
    leaves.lose_lease()
    admin = cluster.mgmtd.client()
    try:

        async def dead() -> bool:
            info = (await admin.mgmtd.get_routing_info(mgmtd_pb2.GetRoutingInfoRequest())).routing_info
            return any(n.node_id == leaves.node_id and n.status == mgmtd_pb2.NODE_STATUS_DEAD for n in info.nodes)

        await eventually(dead, timeout_s=10, what="mgmtd declaring the node dead")
        disable = mgmtd_pb2.SetNodeEnabledRequest(node_id=leaves.node_id, enabled=False)
        await admin.mgmtd.set_node_enabled(disable)
        await admin.mgmtd.remove_node(mgmtd_pb2.RemoveNodeRequest(node_id=leaves.node_id))
    finally:
        await admin.close()

    async def listed() -> list[int]:
        return [n.node_id for n in (await root.call(root.user.ListNodes, pb.ListNodesRequest())).nodes]

    async def forgotten() -> bool:
        return leaves.node_id not in await listed()

    await eventually(forgotten, timeout_s=10, what="the scheduler forgetting the removed node")
    assert await listed() == [stays.node_id]
    with pytest.raises(RpcError) as err:  # one node left in the group: a 2-node task could never run
        await alice.call(alice.user.SubmitTask, pb.SubmitTaskRequest(spec=spec(2)))
    assert err.value.code is grpc.StatusCode.FAILED_PRECONDITION, err.value

    # The run on it ended as on a lost node; the task runs again on the node that stayed and a new one.
    arrived = await cluster.add_agent()

    async def running_again() -> bool:
        t = await task_of(alice, task.task_id)
        return t.current_run.run_index > 0 and t.current_run.state == pb.RUN_STATE_RUNNING

    await eventually(running_again, timeout_s=20, what="the task running again")
    t = await task_of(alice, task.task_id)
    assert t.runs[0].end_reason == pb.RUN_END_REASON_NODE_LOST and t.runs[0].failure.node_id == leaves.node_id
    assert sorted(n.node_id for n in t.current_run.nodes) == [stays.node_id, arrived.node_id]
