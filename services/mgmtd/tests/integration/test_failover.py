"""Several mgmtd processes on one PostgreSQL: one primary, redirects, failover within one lease."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import grpc
import pytest

from ff_cluster import MgmtdClient
from ff_mgmtd.testing import CLUSTER_TOKEN, FAST_TIMING
from ff_rpc import RpcClient, RpcError, open_channel
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
        node_type=common_pb2.NODE_TYPE_META, hostname=f"meta-{i}",
        endpoints=[common_pb2.Endpoint(name="grpc", address=f"127.0.0.1:{10000 + i}")],
    )  # fmt: skip


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
    node_ids = [(await raw.mgmtd(lambda s: s.RegisterNode, registration(i))).node_id for i in range(5)]
    assert raw.current_address == primary.address

    # Kill the primary without warning: the standby becomes primary within one lease.
    primary.proc.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    primary.proc.wait(timeout=10)
    new_primary = await wait_for_primary([standby.address], timeout_s=3 * LEASE_S)
    took_over_s = time.monotonic() - killed_at
    assert new_primary == standby.address
    assert took_over_s <= LEASE_S * 1.5, f"takeover took {took_over_s:.2f}s with a {LEASE_S}s lease"

    # No registered node is lost, and the nodes are not declared dead for the change of primary.
    client = MgmtdClient([primary.address, standby.address], token=CLUSTER_TOKEN)
    info = (await client.mgmtd(lambda s: s.GetRoutingInfo, pb.GetRoutingInfoRequest())).routing_info
    by_id = {n.node_id: n for n in info.nodes}
    assert set(node_ids) <= set(by_id)
    assert all(by_id[i].status == pb.NODE_STATUS_ALIVE for i in node_ids)
    cluster = await client.mgmtd(lambda s: s.GetClusterInfo, pb.GetClusterInfoRequest())
    assert [i.instance_id for i in cluster.instances if i.is_primary] == [standby.name]
    await client.close()
    await raw.close()


async def test_sigterm_drains_and_exits_zero_and_hands_over_at_once(postgres_url: str, spawn_mgmtd: Any) -> None:
    a = await spawn_mgmtd(postgres_url, "a").ready()
    assert await wait_for_primary([a.address]) == a.address
    b = await spawn_mgmtd(postgres_url, "b").ready()
    a.proc.send_signal(signal.SIGTERM)
    stopped_at = time.monotonic()
    assert await asyncio.to_thread(a.proc.wait, 15) == 0
    # The primary resigned its lease on the way out: the standby need not wait for it to expire.
    await wait_for_primary([b.address], timeout_s=LEASE_S)
    assert time.monotonic() - stopped_at < LEASE_S + 1.0
    log = a.log.read_text()
    assert '"msg": "mgmtd stopped"' in log
    # The effective config is logged at start, with the secret masked.
    assert '"cluster_token": "********"' in log and CLUSTER_TOKEN not in log
    assert '"election_lease_s": 2.0' in log
