"""Registration, heartbeats, leases, routing info and its watch, over real gRPC on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import grpc
import pytest

from ff_cluster import MgmtdClient
from ff_mgmtd.core.removal import AUTO_NODE_ID_BASE
from ff_mgmtd.store import routing as store_routing
from ff_rpc import RpcError
from ff_testing.mgmtd import InProcessMgmtd
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2 as pb

STORAGE = common_pb2.NODE_TYPE_STORAGE


def registration(node_id: int = 0, node_type: int = STORAGE, port: int = 9000, **kw: Any) -> pb.RegisterNodeRequest:
    return pb.RegisterNodeRequest(
        node_id=node_id,
        node_type=node_type,
        hostname="host-a",
        endpoints=[common_pb2.Endpoint(name="grpc", address=f"127.0.0.1:{port}")],
        **kw,
    )


async def routing(client: MgmtdClient) -> pb.RoutingInfo:
    return (await client.mgmtd.get_routing_info(pb.GetRoutingInfoRequest())).routing_info


def node(info: pb.RoutingInfo, node_id: int) -> pb.Node:
    return next(n for n in info.nodes if n.node_id == node_id)


async def test_register_assigns_ids_and_reregistering_keeps_them(mgmtd: InProcessMgmtd) -> None:
    client = mgmtd.client()
    first = await client.mgmtd.register_node(registration(tags={"zone": "a"}))
    second = await client.mgmtd.register_node(registration(port=9001))
    assert second.node_id == first.node_id + 1
    assert first.cluster_id == mgmtd.cluster_id
    assert first.lease_duration_s == 4.0 and first.heartbeat_interval_s == 0.25
    again = await client.mgmtd.register_node(registration(node_id=first.node_id, port=9100))
    assert again.node_id == first.node_id
    info = await routing(client)
    n = node(info, first.node_id)
    assert n.status == pb.NODE_STATUS_ALIVE and n.enabled
    assert [e.address for e in n.endpoints] == ["127.0.0.1:9100"]
    assert n.node_type == STORAGE
    await client.close()


async def test_routing_info_polls_cheaply_by_version(mgmtd: InProcessMgmtd) -> None:
    client = mgmtd.client()
    info = await routing(client)
    same = await client.mgmtd.get_routing_info(pb.GetRoutingInfoRequest(known_version=info.version))
    assert same.unchanged and not same.HasField("routing_info")
    await client.mgmtd.register_node(registration())
    newer = await client.mgmtd.get_routing_info(pb.GetRoutingInfoRequest(known_version=info.version))
    assert not newer.unchanged and newer.routing_info.version > info.version
    await client.close()


async def test_watch_streams_every_change(mgmtd: InProcessMgmtd) -> None:
    client = mgmtd.client()
    reg = await client.mgmtd.register_node(registration())
    seen: list[pb.RoutingInfo] = []
    first = asyncio.Event()

    async def watch() -> None:
        async for info in client.watch_routing():
            seen.append(info)
            first.set()
            if len(seen) == 2:
                return

    watcher = asyncio.create_task(watch())
    await asyncio.wait_for(first.wait(), timeout=5)
    await client.mgmtd.set_node_enabled(pb.SetNodeEnabledRequest(node_id=reg.node_id, enabled=False))
    await asyncio.wait_for(watcher, timeout=5)
    assert seen[1].version > seen[0].version
    assert not node(seen[1], reg.node_id).enabled
    await client.close()


async def test_node_is_declared_dead_after_the_lease_and_not_before(sqlite_url: str, start_mgmtd: Any) -> None:
    mgmtd = await start_mgmtd(sqlite_url, lease_duration_s=1.0, heartbeat_interval_s=0.25)
    client = mgmtd.client()
    reg = await client.mgmtd.register_node(registration())
    started = time.monotonic()
    for _ in range(6):  # heartbeats keep it alive well past T
        await asyncio.sleep(0.25)
        await client.mgmtd.heartbeat(pb.HeartbeatRequest(node_id=reg.node_id))
    assert node(await routing(client), reg.node_id).status == pb.NODE_STATUS_ALIVE
    last_beat = time.monotonic()
    await asyncio.sleep(0.7)  # T/2 < silence < T: still alive
    assert node(await routing(client), reg.node_id).status == pb.NODE_STATUS_ALIVE
    while node(await routing(client), reg.node_id).status == pb.NODE_STATUS_ALIVE:
        assert time.monotonic() - last_beat < 3.0, "node never declared dead"
        await asyncio.sleep(0.05)
    silence = time.monotonic() - last_beat
    assert 1.0 <= silence < 2.0, f"declared dead after {silence:.2f}s of silence, lease is 1.0s"
    assert time.monotonic() - started > 1.5
    # A heartbeat brings it back without re-registering.
    await client.mgmtd.heartbeat(pb.HeartbeatRequest(node_id=reg.node_id))
    assert node(await routing(client), reg.node_id).status == pb.NODE_STATUS_ALIVE
    await client.close()


async def test_state_survives_a_restart(db_url: str, start_mgmtd: Any) -> None:
    first = await start_mgmtd(db_url, name="m1")
    client = first.client()
    reg = await client.mgmtd.register_node(registration())
    await client.identity.create_user(pb.CreateUserRequest(name="carol"))
    token = (await client.identity.issue_token(pb.IssueTokenRequest(user_name="carol"))).token
    await client.mgmtd.set_config(pb.SetConfigRequest(node_type=STORAGE, expected_version=0, content="x = 1"))
    await client.close()
    await first.shutdown()
    second = await start_mgmtd(db_url, name="m1")
    assert second.cluster_id == first.cluster_id
    client = second.client()
    assert node(await routing(client), reg.node_id).node_type == STORAGE
    config = await client.mgmtd.get_config(pb.GetConfigRequest(node_type=STORAGE))
    assert (config.version, config.content) == (1, "x = 1")
    carol = MgmtdClient([second.address], token=token)
    assert (await carol.identity.who_am_i(pb.WhoAmIRequest())).principal.name == "carol"
    await carol.close()
    await client.close()


async def test_mgmtd_registers_itself(mgmtd: InProcessMgmtd) -> None:
    client = mgmtd.client()
    for _ in range(100):
        nodes = (await routing(client)).nodes
        if any(n.node_type == common_pb2.NODE_TYPE_MGMTD for n in nodes):
            break
        await asyncio.sleep(0.05)
    me = next(n for n in nodes if n.node_type == common_pb2.NODE_TYPE_MGMTD)
    assert me.status == pb.NODE_STATUS_ALIVE
    assert {e.name: e.address for e in me.endpoints}["grpc"] == mgmtd.address
    info = await client.mgmtd.get_cluster_info(pb.GetClusterInfoRequest())
    assert [(i.instance_id, i.is_primary) for i in info.instances] == [("m1", True)]
    await client.close()


async def test_heartbeat_for_an_unknown_node_is_not_found(mgmtd: InProcessMgmtd) -> None:
    client = mgmtd.client()
    with pytest.raises(RpcError) as err:
        await client.mgmtd.heartbeat(pb.HeartbeatRequest(node_id=4242))
    assert err.value.code is grpc.StatusCode.NOT_FOUND
    await client.close()


async def test_assigned_ids_never_meet_the_ids_a_deployment_plans(mgmtd: InProcessMgmtd) -> None:
    # The appliance numbers its instances 1, 2, ...; `fireflyer join` registers with node id 0. Before, mgmtd gave
    # the largest id + 1, which the appliance's next planned instance also took: one node row for two services.
    client = mgmtd.client()
    planned = [(await client.mgmtd.register_node(registration(node_id=n, port=9000 + n))).node_id
               for n in (1, 2, 9)]  # fmt: skip
    joined = (await client.mgmtd.register_node(registration(port=9100))).node_id
    grown = (await client.mgmtd.register_node(registration(node_id=10, port=9010))).node_id
    again = (await client.mgmtd.register_node(registration(port=9101))).node_id
    assert planned == [1, 2, 9] and grown == 10
    assert joined >= AUTO_NODE_ID_BASE and again == joined + 1  # (mgmtd's own node took one too)
    assert len({n.node_id for n in (await routing(client)).nodes} & {1, 2, 9, 10, joined, again}) == 6
    await client.close()


async def test_ids_stay_in_range_after_the_largest_is_claimed(mgmtd: InProcessMgmtd) -> None:
    client = mgmtd.client()
    top = await client.mgmtd.register_node(registration(node_id=2**32 - 1))
    assert top.node_id == 2**32 - 1
    nxt = await client.mgmtd.register_node(registration(port=9001))
    assert 0 < nxt.node_id < 2**32 - 1
    assert {n.node_id for n in (await routing(client)).nodes} >= {top.node_id, nxt.node_id}
    # uids stop at 2^32-2: 2^32-1 is (uid_t)-1, refused (see test_hostile_input)
    await client.identity.create_user(pb.CreateUserRequest(name="big", uid=2**32 - 2))
    after = await client.identity.create_user(pb.CreateUserRequest(name="next"))
    assert 1000 <= after.user.uid < 2**32 - 2
    assert len((await client.identity.list_users(pb.ListUsersRequest())).users) == 2
    await client.close()


async def test_an_idle_primary_reads_no_chains_until_an_input_of_the_scan_changes(
    sqlite_url: str, start_mgmtd: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[float] = []
    read = threading.Event()  # (the store reads in a worker thread)
    original = store_routing.list_chains

    def counting(session: Any) -> Any:
        reads.append(time.monotonic())
        read.set()
        return original(session)

    monkeypatch.setattr(store_routing, "list_chains", counting)
    m = await start_mgmtd(sqlite_url, chain_scan_interval_s=0.05)
    client = m.client()
    try:
        await asyncio.sleep(0.5)  # 10 scan intervals: the scans its start brings are over (only a count is taken)
        settled = len(reads)
        await asyncio.sleep(1.0)  # 20 scan intervals with nothing changed
        assert len(reads) == settled, "an idle primary re-read the chains"
        read.clear()
        reg = await client.mgmtd.register_node(registration())  # the routing version moves
        assert await asyncio.to_thread(read.wait, 5), "a new routing version did not bring a scan"
        await asyncio.sleep(0.3)  # 6 intervals: the registration's scans are over before the next input is counted
        read.clear()
        report = pb.LocalTargetReport(target_id=7, local_state=pb.LOCAL_TARGET_STATE_UPTODATE)
        await client.mgmtd.heartbeat(pb.HeartbeatRequest(node_id=reg.node_id, targets=[report]))
        assert await asyncio.to_thread(read.wait, 5), "a changed local target state did not bring a scan"
        after_change = len(reads)
        await asyncio.sleep(0.5)  # 10 intervals of nothing changing (the point): no more scans may come
        assert len(reads) <= after_change + 1  # and it settles again (one more read at most: the change's own)
    finally:
        await client.close()
