"""The client side of the lease: a node that cannot reach mgmtd for T/2 is told to stop serving."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ff_cluster import MembershipOptions, MgmtdClient, NodeMembership
from ff_testing import free_port
from ff_testing.mgmtd import CLUSTER_TOKEN
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2 as pb


async def test_membership_reports_lost_after_half_the_lease_and_regained(sqlite_url: str, start_mgmtd: Any) -> None:
    port = free_port()
    mgmtd = await start_mgmtd(sqlite_url, listen_address=f"127.0.0.1:{port}", lease_duration_s=2.0)
    events: list[tuple[str, float]] = []
    changed = asyncio.Event()

    def note(kind: str) -> None:
        events.append((kind, time.monotonic()))
        changed.set()

    membership = NodeMembership(
        MembershipOptions(
            mgmtd_addresses=[mgmtd.address],
            cluster_token=CLUSTER_TOKEN,
            node_type=common_pb2.NODE_TYPE_STORAGE,
            hostname="storage-1",
            endpoints={"grpc": "127.0.0.1:7001"},
            retry_interval_s=0.1,
            on_lease_lost=lambda: note("lost"),
            on_lease_regained=lambda: note("regained"),
        )
    )
    stop = asyncio.Event()
    runner = asyncio.create_task(membership.run(stop))
    await asyncio.wait_for(membership.registered.wait(), timeout=5)
    assert membership.lease_duration_s == 2.0
    await asyncio.sleep(0.6)  # heartbeats go on a while (the point): a lease kept reports nothing
    assert events == [] and not membership.lease_lost

    stop_began = time.monotonic()
    await mgmtd.shutdown()  # mgmtd gone: heartbeats fail
    gone_at = time.monotonic()
    await asyncio.wait_for(changed.wait(), timeout=5)
    changed.clear()
    kind, lost_at = events[0]
    assert kind == "lost" and membership.lease_lost
    # Reported once T/2 passed without contact, counted from the last successful heartbeat (at most one
    # heartbeat interval, 0.25 s, before mgmtd began to stop), and well before mgmtd's own T.
    assert lost_at - stop_began >= 1.0 - 0.25 - 0.05, lost_at - stop_began
    assert lost_at - gone_at <= 1.0 + 0.5, lost_at - gone_at

    again = await start_mgmtd(sqlite_url, name="m1", listen_address=f"127.0.0.1:{port}", lease_duration_s=2.0)
    await asyncio.wait_for(changed.wait(), timeout=5)
    assert events[1][0] == "regained" and not membership.lease_lost
    client = MgmtdClient([again.address], token=CLUSTER_TOKEN)
    info = (await client.mgmtd.get_routing_info(pb.GetRoutingInfoRequest())).routing_info
    me = next(n for n in info.nodes if n.node_id == membership.node_id)
    assert me.status == pb.NODE_STATUS_ALIVE and me.hostname == "storage-1"
    await client.close()
    stop.set()
    await runner


async def test_a_node_that_stops_cleanly_is_declared_dead_at_once_and_its_target_leaves_its_chain(
    sqlite_url: str, start_mgmtd: Any
) -> None:
    # A 30 s lease: whatever happens within seconds of the stop is the node's own word, not its lease running out.
    mgmtd = await start_mgmtd(sqlite_url, lease_duration_s=30.0, chain_scan_interval_s=0.1)
    client = MgmtdClient([mgmtd.address], token=CLUSTER_TOKEN)
    stops = [asyncio.Event(), asyncio.Event()]
    nodes = [
        NodeMembership(
            MembershipOptions(
                mgmtd_addresses=[mgmtd.address],
                cluster_token=CLUSTER_TOKEN,
                node_type=common_pb2.NODE_TYPE_STORAGE,
                hostname=f"storage-{i}",
                endpoints={"grpc": f"127.0.0.1:{7001 + i}"},
                node_id=11 + i,
                retry_interval_s=0.1,
                target_reports=lambda target=101 + i: [(target, pb.LOCAL_TARGET_STATE_UPTODATE)],
            )
        )
        for i in range(2)
    ]
    runners = [asyncio.create_task(n.run(stop)) for n, stop in zip(nodes, stops, strict=True)]
    try:
        for n in nodes:
            await asyncio.wait_for(n.registered.wait(), timeout=5)
        chain = pb.Chain(
            chain_id=1, targets=[pb.Target(target_id=101, node_id=11), pb.Target(target_id=102, node_id=12)]
        )
        await client.mgmtd.set_chains(pb.SetChainsRequest(chains=[chain]))

        async def routing() -> pb.RoutingInfo:
            return (await client.mgmtd.get_routing_info(pb.GetRoutingInfoRequest())).routing_info

        stops[0].set()
        await runners[0]  # its last heartbeat said it is leaving
        stopped_at = time.monotonic()
        for _ in range(100):
            info = await routing()
            states = {t.target_id: t.public_state for t in info.chains[0].targets}
            if states[101] != pb.PUBLIC_TARGET_STATE_SERVING:
                break
            await asyncio.sleep(0.05)
        status = {n.node_id: n.status for n in info.nodes}
        assert (status[11], status[12]) == (pb.NODE_STATUS_DEAD, pb.NODE_STATUS_ALIVE), info.nodes
        assert [t.target_id for t in info.chains[0].targets] == [102, 101], info.chains  # 102 heads the chain now
        assert states == {101: pb.PUBLIC_TARGET_STATE_OFFLINE, 102: pb.PUBLIC_TARGET_STATE_SERVING}, states
        assert time.monotonic() - stopped_at < 5.0  # not the 30 s lease
    finally:
        for stop in stops:
            stop.set()
        await asyncio.gather(*runners, return_exceptions=True)
        await client.close()
