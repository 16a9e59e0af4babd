"""Several mgmtd processes on one PostgreSQL: one primary, redirects, failover within one lease."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import grpc
import pytest

from ff_cluster import MembershipOptions, MgmtdClient, NodeMembership
from ff_rpc import RpcClient, RpcError, open_channel
from ff_testing.mgmtd import CLUSTER_TOKEN, FAST_TIMING
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2 as pb
from fireflyer.mgmtd.v1 import mgmtd_pb2_grpc

LEASE_S = FAST_TIMING["election_lease_s"]


async def primary_of(address: str) -> pb.GetPrimaryResponse:
    channel = open_channel(address)
    try:
        return await RpcClient(token="").unary(
            mgmtd_pb2_grpc.MgmtdServiceStub(channel).GetPrimary, pb.GetPrimaryRequest()
        )
    finally:
        await channel.close()


async def wait_for_primary(addresses: list[str], timeout_s: float = 10.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        answers = [await primary_of(a) for a in addresses]
        primaries = [a.instance_id for a in answers if a.is_primary]
        if primaries:
            assert len(primaries) == 1, f"more than one primary: {primaries}"
            return next(addr for addr, a in zip(addresses, answers, strict=True) if a.is_primary)
        await asyncio.sleep(0.05)
    raise TimeoutError("no primary elected")


def registration(i: int) -> pb.RegisterNodeRequest:
    return pb.RegisterNodeRequest(
        node_type=common_pb2.NODE_TYPE_META,
        hostname=f"meta-{i}",
        endpoints=[common_pb2.Endpoint(name="grpc", address=f"127.0.0.1:{10000 + i}")],
    )


async def test_standby_redirects_and_takes_over_within_one_lease(postgres_url: str, spawn_mgmtd: Any) -> None:
    a = await spawn_mgmtd(postgres_url, "a").ready()
    b = await spawn_mgmtd(postgres_url, "b").ready()
    assert a.info["cluster_id"] == b.info["cluster_id"]
    primary_addr = await wait_for_primary([a.address, b.address])
    primary, standby = (a, b) if primary_addr == a.address else (b, a)

    # A standby refuses state calls with the primary's address; the client follows it.
    raw = MgmtdClient([standby.address], token=CLUSTER_TOKEN, retry=None)
    channel = open_channel(standby.address)
    with pytest.raises(RpcError) as err:
        await RpcClient(token=CLUSTER_TOKEN).unary(
            mgmtd_pb2_grpc.MgmtdServiceStub(channel).RegisterNode, registration(0)
        )
    await channel.close()
    assert err.value.code is grpc.StatusCode.UNAVAILABLE
    assert err.value.trailing_metadata["ff-primary-address"] == primary.address
    node_ids = [(await raw.mgmtd.register_node(registration(i))).node_id for i in range(5)]
    assert raw.current_address == primary.address

    # Kill the primary without warning: the standby becomes primary within one lease.
    primary.proc.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    primary.proc.wait(timeout=10)
    new_primary = await wait_for_primary([standby.address], timeout_s=3 * LEASE_S)
    took_over_s = time.monotonic() - killed_at
    assert new_primary == standby.address
    # Within one lease of the kill (the standby wakes when the lease runs out), plus polling slack.
    assert took_over_s <= LEASE_S + 0.5, f"takeover took {took_over_s:.2f}s with a {LEASE_S}s lease"

    # No registered node is lost, and the nodes are not declared dead for the change of primary.
    client = MgmtdClient([primary.address, standby.address], token=CLUSTER_TOKEN)
    info = (await client.mgmtd.get_routing_info(pb.GetRoutingInfoRequest())).routing_info
    by_id = {n.node_id: n for n in info.nodes}
    assert set(node_ids) <= set(by_id)
    assert all(by_id[i].status == pb.NODE_STATUS_ALIVE for i in node_ids)
    cluster = await client.mgmtd.get_cluster_info(pb.GetClusterInfoRequest())
    assert [i.instance_id for i in cluster.instances if i.is_primary] == [standby.name]
    await client.close()
    await raw.close()


async def test_sigterm_drains_and_exits_zero_and_hands_over_at_once(postgres_url: str, spawn_mgmtd: Any) -> None:
    # A long election lease: without the primary resigning, the standby would wait ~5 s for it to expire.
    slow = {"election_lease_s": 5.0, "lease_duration_s": 20.0}
    a = await spawn_mgmtd(postgres_url, "a", **slow).ready()
    assert await wait_for_primary([a.address]) == a.address
    b = await spawn_mgmtd(postgres_url, "b", **slow).ready()
    a.proc.send_signal(signal.SIGTERM)
    stopped_at = time.monotonic()
    assert await asyncio.to_thread(a.proc.wait, 15) == 0
    await wait_for_primary([b.address], timeout_s=5.0)
    assert time.monotonic() - stopped_at < 2.5, "the standby waited for the lease instead of a hand-over"
    log = a.log.read_text()
    assert '"msg": "mgmtd stopped"' in log
    # The effective config is logged at start, with the secrets masked.
    assert '"cluster_token": "********"' in log and CLUSTER_TOKEN not in log
    assert '"database_url": "********"' in log and postgres_url not in log
    assert '"election_lease_s": 5.0' in log


async def test_heartbeating_nodes_ride_through_a_failover(postgres_url: str, spawn_mgmtd: Any) -> None:
    a = await spawn_mgmtd(postgres_url, "a").ready()
    b = await spawn_mgmtd(postgres_url, "b").ready()
    primary_addr = await wait_for_primary([a.address, b.address])
    primary, standby = (a, b) if primary_addr == a.address else (b, a)
    lost: list[float] = []
    membership = NodeMembership(
        MembershipOptions(
            mgmtd_addresses=[primary.address, standby.address],
            cluster_token=CLUSTER_TOKEN,
            node_type=common_pb2.NODE_TYPE_STORAGE,
            hostname="storage-1",
            endpoints={"grpc": "127.0.0.1:7001"},
            on_lease_lost=lambda: lost.append(time.monotonic()),
        )
    )
    stop = asyncio.Event()
    runner = asyncio.create_task(membership.run(stop))
    await asyncio.wait_for(membership.registered.wait(), timeout=5)
    watcher_client = MgmtdClient([primary.address, standby.address], token=CLUSTER_TOKEN)
    seen: list[int] = []
    changed = asyncio.Event()

    async def watch() -> None:
        async for info in watcher_client.watch_routing():
            seen.append(info.version)
            changed.set()

    watcher = asyncio.create_task(watch())
    await asyncio.wait_for(changed.wait(), timeout=5)

    primary.proc.send_signal(signal.SIGKILL)
    await asyncio.to_thread(primary.proc.wait, 10)
    await wait_for_primary([standby.address], timeout_s=3 * LEASE_S)
    await asyncio.sleep(FAST_TIMING["lease_duration_s"])  # a whole node lease after the failover
    assert lost == [], "the node was told to stop serving during a failover"
    client = MgmtdClient([standby.address], token=CLUSTER_TOKEN)
    info = (await client.mgmtd.get_routing_info(pb.GetRoutingInfoRequest())).routing_info
    me = next(n for n in info.nodes if n.node_id == membership.node_id)
    assert me.status == pb.NODE_STATUS_ALIVE

    # The watch followed the primary: a change made now reaches it.
    changed.clear()
    before = seen[-1]
    await client.mgmtd.set_node_enabled(pb.SetNodeEnabledRequest(node_id=membership.node_id, enabled=False))
    while seen[-1] <= before:
        await asyncio.wait_for(changed.wait(), timeout=10)
        changed.clear()
    watcher.cancel()
    stop.set()
    await runner
    await client.close()
    await watcher_client.close()


async def test_every_instance_names_the_primary_by_address_and_instance_id(db_url: str, start_mgmtd: Any) -> None:
    a = await start_mgmtd(db_url, "a")
    b = await start_mgmtd(db_url, "b")
    primary_addr = await wait_for_primary([a.address, b.address])
    primary_name = "a" if primary_addr == a.address else "b"
    for name, instance in (("a", a), ("b", b)):
        answer = await primary_of(instance.address)
        assert (answer.primary_instance_id, answer.primary_address) == (primary_name, primary_addr)
        assert (answer.instance_id, answer.is_primary) == (name, name == primary_name)
