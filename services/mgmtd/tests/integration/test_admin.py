"""Chains, chain tables, node enable/disable and versioned config, over real gRPC."""

from __future__ import annotations

import grpc
import pytest

from ff_cluster import MgmtdClient
from ff_rpc import RpcError
from ff_testing.mgmtd import InProcessMgmtd
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2 as pb

STORAGE = common_pb2.NODE_TYPE_STORAGE


async def storage_nodes(client: MgmtdClient, count: int) -> list[int]:
    ids = []
    for i in range(count):
        req = pb.RegisterNodeRequest(
            node_type=STORAGE,
            hostname=f"storage-{i}",
            endpoints=[common_pb2.Endpoint(name="grpc", address=f"127.0.0.1:{20000 + i}")],
        )
        ids.append((await client.mgmtd.register_node(req)).node_id)
    return ids


def chain(chain_id: int, version: int, placement: list[tuple[int, int]]) -> pb.Chain:
    return pb.Chain(
        chain_id=chain_id,
        version=version,
        targets=[pb.Target(target_id=t, node_id=n) for t, n in placement],
    )


async def expect(code: grpc.StatusCode, coro: object) -> RpcError:
    with pytest.raises(RpcError) as err:
        await coro  # type: ignore[misc]
    assert err.value.code is code, err.value
    return err.value


async def test_chains_and_chain_tables_are_versioned(mgmtd: InProcessMgmtd) -> None:
    client = mgmtd.client()
    n1, n2, n3 = await storage_nodes(client, 3)
    created = await client.mgmtd.set_chains(
        pb.SetChainsRequest(
            chains=[
                chain(1, 0, [(101, n1), (102, n2), (103, n3)]),
                chain(2, 0, [(201, n2), (202, n3), (203, n1)]),
            ]
        ),
    )
    assert [c.version for c in created.chains] == [1, 1]
    assert [t.target_id for t in created.chains[0].targets] == [101, 102, 103]  # head first
    assert all(t.public_state == pb.PUBLIC_TARGET_STATE_SERVING for t in created.chains[0].targets)

    # Compare-and-set: a stale version is refused and changes nothing.
    before = (await client.mgmtd.get_routing_info(pb.GetRoutingInfoRequest())).routing_info
    await expect(
        grpc.StatusCode.ABORTED,
        client.mgmtd.set_chains(pb.SetChainsRequest(chains=[chain(1, 0, [(101, n3)])])),
    )
    after = (await client.mgmtd.get_routing_info(pb.GetRoutingInfoRequest())).routing_info
    assert (after.version, list(after.chains)) == (before.version, list(before.chains))

    moved = await client.mgmtd.set_chains(pb.SetChainsRequest(chains=[chain(1, 1, [(102, n2), (103, n3), (101, n1)])]))
    assert moved.chains[0].version == 2
    assert [t.target_id for t in moved.chains[0].targets] == [102, 103, 101]

    table = await client.mgmtd.set_chain_table(
        pb.SetChainTableRequest(chain_table=pb.ChainTable(table_id=1, version=0, chain_ids=[1, 2])),
    )
    assert table.chain_table.version == 1
    await expect(
        grpc.StatusCode.ABORTED,
        client.mgmtd.set_chain_table(
            pb.SetChainTableRequest(chain_table=pb.ChainTable(table_id=1, version=0, chain_ids=[2])),
        ),
    )
    await expect(
        grpc.StatusCode.NOT_FOUND,
        client.mgmtd.set_chain_table(
            pb.SetChainTableRequest(chain_table=pb.ChainTable(table_id=1, version=1, chain_ids=[1, 9])),
        ),
    )
    info = (await client.mgmtd.get_routing_info(pb.GetRoutingInfoRequest())).routing_info
    assert [(t.table_id, t.version, list(t.chain_ids)) for t in info.chain_tables] == [(1, 1, [1, 2])]
    assert [(c.chain_id, c.version) for c in info.chains] == [(1, 2), (2, 1)]
    await client.close()


async def test_chains_reject_unknown_nodes_and_stolen_targets(mgmtd: InProcessMgmtd) -> None:
    client = mgmtd.client()
    (n1,) = await storage_nodes(client, 1)
    await expect(
        grpc.StatusCode.NOT_FOUND,
        client.mgmtd.set_chains(pb.SetChainsRequest(chains=[chain(1, 0, [(1, 999)])])),
    )
    await client.mgmtd.set_chains(pb.SetChainsRequest(chains=[chain(1, 0, [(1, n1)])]))
    err = await expect(
        grpc.StatusCode.FAILED_PRECONDITION,
        client.mgmtd.set_chains(pb.SetChainsRequest(chains=[chain(2, 0, [(1, n1)])])),
    )
    assert "already belongs to chain 1" in err.details
    await client.close()


async def test_enable_and_disable_a_node(mgmtd: InProcessMgmtd) -> None:
    client = mgmtd.client()
    (n1,) = await storage_nodes(client, 1)
    off = await client.mgmtd.set_node_enabled(pb.SetNodeEnabledRequest(node_id=n1, enabled=False))
    assert not off.node.enabled
    beat = await client.mgmtd.heartbeat(pb.HeartbeatRequest(node_id=n1))
    assert not beat.enabled and beat.routing_version == off.routing_version
    again = await client.mgmtd.set_node_enabled(pb.SetNodeEnabledRequest(node_id=n1, enabled=False))
    assert again.routing_version == off.routing_version  # idempotent: no new version
    on = await client.mgmtd.set_node_enabled(pb.SetNodeEnabledRequest(node_id=n1, enabled=True))
    assert on.node.enabled and on.routing_version > off.routing_version
    await client.close()


async def test_config_is_versioned_per_node_type(mgmtd: InProcessMgmtd) -> None:
    client = mgmtd.client()
    (n1,) = await storage_nodes(client, 1)
    empty = await client.mgmtd.get_config(pb.GetConfigRequest(node_type=STORAGE))
    assert (empty.version, empty.content) == (0, "")
    v1 = await client.mgmtd.set_config(
        pb.SetConfigRequest(node_type=STORAGE, expected_version=0, content="chunk_size_bytes = 1048576\n"),
    )
    assert v1.version == 1
    await expect(
        grpc.StatusCode.ABORTED,
        client.mgmtd.set_config(pb.SetConfigRequest(node_type=STORAGE, expected_version=0, content="x = 2\n")),
    )
    await expect(
        grpc.StatusCode.INVALID_ARGUMENT,
        client.mgmtd.set_config(pb.SetConfigRequest(node_type=STORAGE, expected_version=1, content="x = = 2\n")),
    )
    got = await client.mgmtd.get_config(pb.GetConfigRequest(node_type=STORAGE))
    assert (got.version, got.content) == (1, "chunk_size_bytes = 1048576\n")
    # Heartbeats tell a node of that type which config version is current.
    beat = await client.mgmtd.heartbeat(pb.HeartbeatRequest(node_id=n1))
    assert beat.config_version == 1
    other = await client.mgmtd.get_config(pb.GetConfigRequest(node_type=common_pb2.NODE_TYPE_META))
    assert other.version == 0
    await client.close()


async def test_a_node_reports_only_its_own_targets(mgmtd: InProcessMgmtd) -> None:
    import asyncio

    client = mgmtd.client()
    n1, n2 = await storage_nodes(client, 2)
    await client.mgmtd.set_chains(pb.SetChainsRequest(chains=[chain(1, 0, [(101, n1), (102, n2)])]))

    def report(node_id: int, *target_ids: int) -> pb.HeartbeatRequest:
        return pb.HeartbeatRequest(
            node_id=node_id,
            targets=[pb.LocalTargetReport(target_id=t, local_state=pb.LOCAL_TARGET_STATE_OFFLINE) for t in target_ids],
        )

    async def state_of(target_id: int) -> int:
        info = (await client.mgmtd.get_routing_info(pb.GetRoutingInfoRequest())).routing_info
        return next(t.public_state for c in info.chains for t in c.targets if t.target_id == target_id)

    await expect(grpc.StatusCode.NOT_FOUND, client.mgmtd.heartbeat(report(999, 101)))
    # n2 reports 101, which it does not hold, offline, beside its own 102: once a scan took 102's report in (the
    # primary knows who holds which target as of its last scan: until then both are ignored), 101's was ignored.
    for _ in range(100):
        await client.mgmtd.heartbeat(report(n2, 101, 102))
        if await state_of(102) != pb.PUBLIC_TARGET_STATE_SERVING:
            break
        await asyncio.sleep(0.05)
    assert await state_of(102) == pb.PUBLIC_TARGET_STATE_OFFLINE
    assert await state_of(101) == pb.PUBLIC_TARGET_STATE_SERVING
    await client.mgmtd.heartbeat(report(n1, 101))  # its holder: taken into account
    for _ in range(40):
        if await state_of(101) != pb.PUBLIC_TARGET_STATE_SERVING:
            break
        await asyncio.sleep(0.05)
    assert await state_of(101) in (pb.PUBLIC_TARGET_STATE_OFFLINE, pb.PUBLIC_TARGET_STATE_LASTSRV)
    await client.close()
