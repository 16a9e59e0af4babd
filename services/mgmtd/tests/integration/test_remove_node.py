"""RemoveNode over real gRPC on SQLite and PostgreSQL: its refusals, the removal watchers see, no id reuse."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from ff_cluster import MgmtdClient
from ff_rpc import RpcError
from ff_testing.mgmtd import make_users
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2 as pb

STORAGE = common_pb2.NODE_TYPE_STORAGE
LEASE_S = 1.0


def registration(node_id: int = 0) -> pb.RegisterNodeRequest:
    endpoint = common_pb2.Endpoint(name="grpc", address="127.0.0.1:9000")
    return pb.RegisterNodeRequest(node_id=node_id, node_type=STORAGE, hostname="leaving-host", endpoints=[endpoint])


async def routing(client: MgmtdClient) -> pb.RoutingInfo:
    return (await client.mgmtd.get_routing_info(pb.GetRoutingInfoRequest())).routing_info


async def remove(client: MgmtdClient, node_id: int) -> pb.RemoveNodeResponse:
    return await client.mgmtd.remove_node(pb.RemoveNodeRequest(node_id=node_id))


async def refused(code: grpc.StatusCode, call: Any) -> str:
    with pytest.raises(RpcError) as err:
        await call
    assert err.value.code is code, err.value
    return err.value.details


def view(info: pb.RoutingInfo) -> tuple[Any, ...]:
    """What a removal changes (not the heartbeat times, which move by themselves)."""
    return info.version, [(n.node_id, n.status, n.enabled) for n in info.nodes], list(info.chains)


async def until(client: MgmtdClient, check: Callable[[pb.RoutingInfo], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check(await routing(client)):
        assert time.monotonic() < deadline, "routing never got there"
        await asyncio.sleep(0.05)


async def test_remove_node_refuses_until_the_node_left_then_forgets_it_for_good(db_url: str, start_mgmtd: Any) -> None:
    mgmtd = await start_mgmtd(db_url, lease_duration_s=LEASE_S, heartbeat_interval_s=0.25)
    alice = mgmtd.client((await make_users(mgmtd))["alice"])
    admin = mgmtd.client()  # the cluster token: what `fireflyer leave` calls with
    keep = (await admin.mgmtd.register_node(registration())).node_id
    leaving = (await admin.mgmtd.register_node(registration())).node_id  # the largest id
    chain = pb.Chain(
        chain_id=1, targets=[pb.Target(target_id=101, node_id=keep), pb.Target(target_id=102, node_id=leaving)]
    )
    await admin.mgmtd.set_chains(pb.SetChainsRequest(chains=[chain]))

    # A user, an unknown id, no id; then alive, enabled and holding a target (every reason said at once).
    assert "admin" in await refused(grpc.StatusCode.PERMISSION_DENIED, remove(alice, leaving))
    await refused(grpc.StatusCode.NOT_FOUND, remove(admin, 4242))
    await refused(grpc.StatusCode.INVALID_ARGUMENT, remove(admin, 0))
    why = await refused(grpc.StatusCode.FAILED_PRECONDITION, remove(admin, leaving))
    assert "alive" in why and "enabled" in why and "102 (chain 1)" in why, why

    # No heartbeats: both nodes die after the lease; the chain keeps the last to die as its last serving replica.
    def settled(info: pb.RoutingInfo) -> bool:
        dead = all(n.status == pb.NODE_STATUS_DEAD for n in info.nodes if n.node_id in (keep, leaving))
        states = [t.public_state for t in info.chains[0].targets]
        return dead and states == [pb.PUBLIC_TARGET_STATE_LASTSRV, pb.PUBLIC_TARGET_STATE_OFFLINE]

    await until(admin, settled)
    await admin.mgmtd.set_node_enabled(pb.SetNodeEnabledRequest(node_id=leaving, enabled=False))
    before = await routing(admin)
    why = await refused(grpc.StatusCode.FAILED_PRECONDITION, remove(admin, leaving))
    assert "102 (chain 1)" in why and "alive" not in why and "enabled" not in why, why
    after = await routing(admin)
    assert view(after) == view(before)  # nothing changed

    # Its replica moved off: it goes, and a watcher sees it go.
    kept = [t for t in after.chains[0].targets if t.node_id == keep]  # (which died first is the tail)
    shorter = pb.Chain(chain_id=1, version=after.chains[0].version, targets=kept)
    await admin.mgmtd.set_chains(pb.SetChainsRequest(chains=[shorter]))
    known = (await routing(admin)).version
    seen: list[pb.RoutingInfo] = []

    async def watch() -> None:
        async for info in admin.watch_routing(known):
            seen.append(info)
            return

    watcher = asyncio.create_task(watch())
    removed = await remove(admin, leaving)
    await asyncio.wait_for(watcher, timeout=5)
    assert seen[0].version == removed.routing_version > known
    assert leaving not in {n.node_id for n in seen[0].nodes} and keep in {n.node_id for n in seen[0].nodes}
    assert abs(removed.removed_at - time.time()) < 5
    again = await remove(admin, leaving)  # as the first answer said (a retry after a lost answer)
    assert again.removed_at == removed.removed_at

    # Its id is never given out again, nor registered under: not by this primary, not after a restart.
    why = await refused(grpc.StatusCode.FAILED_PRECONDITION, admin.mgmtd.register_node(registration(leaving)))
    assert f"node {leaving} (leaving-host) was removed" in why and "node_id 0" in why, why
    await refused(grpc.StatusCode.NOT_FOUND, admin.mgmtd.heartbeat(pb.HeartbeatRequest(node_id=leaving)))
    assert (await admin.mgmtd.register_node(registration())).node_id == leaving + 1
    await admin.close()
    await alice.close()
    await mgmtd.shutdown()
    restarted = await start_mgmtd(db_url, lease_duration_s=LEASE_S, heartbeat_interval_s=0.25)
    admin = restarted.client()
    assert leaving not in {n.node_id for n in (await routing(admin)).nodes}
    await refused(grpc.StatusCode.FAILED_PRECONDITION, admin.mgmtd.register_node(registration(leaving)))
    assert (await admin.mgmtd.register_node(registration())).node_id > leaving + 1
    await admin.close()
