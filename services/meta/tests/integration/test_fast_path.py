"""Meta over the fast path (``ff_rpc.fastpath``): registered with mgmtd, taken by hf3fs clients, gRPC when unreachable.

The policy itself (tokens, acting, access, errors) is the gRPC interceptor's on both transports: libs/rpc's
test_fastpath.py compares every outcome; here, that the real meta service and client use it, and that a user still
sees only what meta lets them see.
"""

from __future__ import annotations

import errno

import pytest

import hf3fs
from ff_cluster import MgmtdClient
from ff_testing.process import CLUSTER_TOKEN
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2 as mpb

from .conftest import MetaCluster


async def _meta_endpoints(cluster: MetaCluster) -> list[dict[str, str]]:
    mg = MgmtdClient([cluster.mgmtd], token=CLUSTER_TOKEN)
    try:
        resp = await mg.mgmtd.get_routing_info(mpb.GetRoutingInfoRequest())
    finally:
        await mg.close()
    return [
        {e.name: e.address for e in n.endpoints}
        for n in resp.routing_info.nodes
        if n.node_type == common_pb2.NODE_TYPE_META and n.enabled  # (test_calls_once leaves a disabled one)
    ]


def test_meta_registers_a_fast_endpoint_and_clients_use_it(
    cluster: MetaCluster, fs: hf3fs.FileSystem, home: str
) -> None:
    [endpoints] = fs._run(_meta_endpoints(cluster))
    assert endpoints["fast"] and endpoints["fast"] != endpoints["grpc"]
    with fs.open(f"{home}/f", "wb") as f:
        f.write(b"x" * 10)
    assert fs.stat(f"{home}/f").size == 10
    meta = fs._conn.meta
    assert meta._fast_of == {endpoints["grpc"]: endpoints["fast"]}
    assert meta._fast._idle.get(endpoints["fast"]), "the calls went over the fast path"


def test_another_users_private_file_stays_private_over_the_fast_path(
    cluster: MetaCluster, fs: hf3fs.FileSystem, home: str
) -> None:
    fs.chmod(home, 0o700)
    with fs.open(f"{home}/secret", "wb") as f:
        f.write(b"s")
    with cluster.connect("bob") as bob:
        with pytest.raises(PermissionError) as err:
            bob.stat(f"{home}/secret")
        assert err.value.errno == errno.EACCES
        assert bob._conn.meta._fast._idle, "bob's refused call went over the fast path"


def test_calls_go_over_grpc_when_the_fast_endpoint_cannot_be_reached(fs: hf3fs.FileSystem, home: str) -> None:
    """A firewall that lets only the gRPC port through: the calls still succeed."""
    meta = fs._conn.meta
    fs.stat(home)  # the endpoints are known now
    [address] = list(meta._fast_of)
    meta._fast.close()  # the connections it kept
    meta._fast_of[address] = "127.0.0.1:1"  # nothing listens there
    with fs.open(f"{home}/g", "wb") as f:
        f.write(b"yy")
    assert fs.stat(f"{home}/g").size == 2
    assert not meta._fast._idle.get("127.0.0.1:1")
