"""Bad input gets the right status code and changes nothing; health and reflection work on mgmtd."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from ff_cluster import MgmtdClient
from ff_mgmtd.core.removal import AUTO_NODE_ID_BASE
from ff_rpc import RetryPolicy, RpcClient, RpcError, open_channel
from ff_testing.mgmtd import CLUSTER_TOKEN, InProcessMgmtd
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2 as pb
from fireflyer.mgmtd.v1 import mgmtd_pb2_grpc

C = grpc.StatusCode
GOOD_EP = [common_pb2.Endpoint(name="grpc", address="127.0.0.1:7000")]
USER = "user"  # stands for a valid token of a plain user, made in the fixture
ADMIN = "admin"  # a valid token of an admin user

# (caller, service, method, request, expected status)
CASES: list[tuple[str, str, str, Any, grpc.StatusCode]] = [
    # missing or malformed fields
    (CLUSTER_TOKEN, "m", "RegisterNode", pb.RegisterNodeRequest(hostname="h", endpoints=GOOD_EP), C.INVALID_ARGUMENT),
    (CLUSTER_TOKEN, "m", "RegisterNode", pb.RegisterNodeRequest(node_type=3, endpoints=GOOD_EP), C.INVALID_ARGUMENT),
    (CLUSTER_TOKEN, "m", "RegisterNode", pb.RegisterNodeRequest(node_type=3, hostname="h"), C.INVALID_ARGUMENT),
    (CLUSTER_TOKEN, "m", "RegisterNode", pb.RegisterNodeRequest(
        node_type=3, hostname="h", endpoints=[common_pb2.Endpoint(name="grpc", address="bad")]), C.INVALID_ARGUMENT),
    (CLUSTER_TOKEN, "m", "RegisterNode", pb.RegisterNodeRequest(node_type=42, hostname="h", endpoints=GOOD_EP),
     C.INVALID_ARGUMENT),
    (CLUSTER_TOKEN, "m", "Heartbeat", pb.HeartbeatRequest(), C.INVALID_ARGUMENT),
    (ADMIN, "m", "SetChains", pb.SetChainsRequest(), C.INVALID_ARGUMENT),
    (ADMIN, "m", "SetChainTable", pb.SetChainTableRequest(), C.INVALID_ARGUMENT),
    (ADMIN, "m", "SetChainTable", pb.SetChainTableRequest(chain_table=pb.ChainTable(table_id=1)), C.INVALID_ARGUMENT),
    (ADMIN, "m", "SetNodeEnabled", pb.SetNodeEnabledRequest(), C.INVALID_ARGUMENT),
    (ADMIN, "m", "GetConfig", pb.GetConfigRequest(), C.INVALID_ARGUMENT),
    (ADMIN, "m", "SetConfig", pb.SetConfigRequest(node_type=2, content="[unclosed"), C.INVALID_ARGUMENT),
    (ADMIN, "i", "CreateUser", pb.CreateUserRequest(), C.INVALID_ARGUMENT),
    (ADMIN, "i", "CreateUser", pb.CreateUserRequest(name="a/b"), C.INVALID_ARGUMENT),
    (ADMIN, "i", "CreateUser", pb.CreateUserRequest(name="x\0y"), C.INVALID_ARGUMENT),
    (ADMIN, "i", "CreateUser", pb.CreateUserRequest(name="zed", role=7), C.INVALID_ARGUMENT),
    (ADMIN, "i", "CreateGroup", pb.CreateGroupRequest(name="BAD GROUP"), C.INVALID_ARGUMENT),
    (ADMIN, "i", "RevokeToken", pb.RevokeTokenRequest(), C.INVALID_ARGUMENT),
    (ADMIN, "i", "CreateUser", pb.CreateUserRequest(name="gina", group_names=["g", "g"]), C.INVALID_ARGUMENT),
    (ADMIN, "i", "IssueToken", pb.IssueTokenRequest(user_name="plain", ttl_s=float("nan")), C.INVALID_ARGUMENT),
    (ADMIN, "i", "IssueToken", pb.IssueTokenRequest(user_name="plain", description="a\0b"), C.INVALID_ARGUMENT),
    (ADMIN, "m", "SetChains", pb.SetChainsRequest(chains=[pb.Chain(
        chain_id=1, targets=[pb.Target(target_id=2**63, node_id=1)])]), C.INVALID_ARGUMENT),
    (ADMIN, "i", "IssueToken", pb.IssueTokenRequest(user_name="plain", ttl_s=-1), C.INVALID_ARGUMENT),
    (CLUSTER_TOKEN, "i", "IssueToken", pb.IssueTokenRequest(), C.INVALID_ARGUMENT),
    # unknown ids
    (CLUSTER_TOKEN, "m", "Heartbeat", pb.HeartbeatRequest(node_id=999), C.NOT_FOUND),
    (ADMIN, "m", "SetNodeEnabled", pb.SetNodeEnabledRequest(node_id=999, enabled=False), C.NOT_FOUND),
    (ADMIN, "m", "SetChains", pb.SetChainsRequest(chains=[pb.Chain(
        chain_id=1, targets=[pb.Target(target_id=1, node_id=999)])]), C.NOT_FOUND),
    (ADMIN, "m", "SetChainTable", pb.SetChainTableRequest(chain_table=pb.ChainTable(table_id=1, chain_ids=[5])),
     C.NOT_FOUND),
    (ADMIN, "i", "IssueToken", pb.IssueTokenRequest(user_name="nobody"), C.NOT_FOUND),
    (ADMIN, "i", "RevokeToken", pb.RevokeTokenRequest(token_id="0123456789abcdef"), C.NOT_FOUND),
    (ADMIN, "i", "SetUserDisabled", pb.SetUserDisabledRequest(name="nobody", disabled=True), C.NOT_FOUND),
    # stale versions
    (ADMIN, "m", "SetConfig", pb.SetConfigRequest(node_type=2, expected_version=3, content="a = 1"), C.ABORTED),
    (ADMIN, "m", "SetChainTable", pb.SetChainTableRequest(chain_table=pb.ChainTable(
        table_id=1, version=2, chain_ids=[1])), C.ABORTED),
    # existing node id claimed with another type (mgmtd's own node: the first id mgmtd assigns)
    (CLUSTER_TOKEN, "m", "RegisterNode", pb.RegisterNodeRequest(
        node_id=AUTO_NODE_ID_BASE, node_type=common_pb2.NODE_TYPE_AGENT, hostname="h", endpoints=GOOD_EP),
     C.FAILED_PRECONDITION),
    # missing and wrong tokens, and roles
    ("", "m", "GetRoutingInfo", pb.GetRoutingInfoRequest(), C.UNAUTHENTICATED),
    ("garbage", "m", "GetRoutingInfo", pb.GetRoutingInfoRequest(), C.UNAUTHENTICATED),
    ("fft_0123456789abcdef_" + "A" * 43, "m", "GetRoutingInfo", pb.GetRoutingInfoRequest(), C.UNAUTHENTICATED),
    ("", "m", "RegisterNode", pb.RegisterNodeRequest(node_type=3, hostname="h", endpoints=GOOD_EP), C.UNAUTHENTICATED),
    (USER, "m", "RegisterNode", pb.RegisterNodeRequest(node_type=3, hostname="h", endpoints=GOOD_EP),
     C.PERMISSION_DENIED),
    (ADMIN, "m", "Heartbeat", pb.HeartbeatRequest(node_id=1), C.PERMISSION_DENIED),
    (USER, "m", "SetConfig", pb.SetConfigRequest(node_type=2, content="a = 1"), C.PERMISSION_DENIED),
    (USER, "m", "SetNodeEnabled", pb.SetNodeEnabledRequest(node_id=1, enabled=False), C.PERMISSION_DENIED),
    (USER, "i", "CreateUser", pb.CreateUserRequest(name="mallory", role=common_pb2.ROLE_ADMIN), C.PERMISSION_DENIED),
    (USER, "i", "IssueToken", pb.IssueTokenRequest(user_name="boss"), C.PERMISSION_DENIED),
    (USER, "i", "ValidateToken", pb.ValidateTokenRequest(token="x"), C.PERMISSION_DENIED),
    (CLUSTER_TOKEN, "i", "ValidateToken", pb.ValidateTokenRequest(token="x"), C.UNAUTHENTICATED),
]  # fmt: skip


async def snapshot(client: MgmtdClient) -> tuple[Any, ...]:
    """Everything a bad call could have changed."""
    info = (await client.mgmtd.get_routing_info(pb.GetRoutingInfoRequest())).routing_info
    users = await client.identity.list_users(pb.ListUsersRequest())
    tokens = await client.identity.list_tokens(pb.ListTokensRequest(user_name="plain"))
    config = await client.mgmtd.get_config(pb.GetConfigRequest(node_type=2))
    return (
        info.version,
        [(n.node_id, n.node_type, n.enabled, n.status) for n in info.nodes],
        list(info.chains),
        list(info.chain_tables),
        list(users.users),
        list(tokens.tokens),
        config.version,
        config.content,
    )


@pytest.fixture
async def tokens(mgmtd: InProcessMgmtd) -> dict[str, str]:
    admin = mgmtd.client()
    await admin.identity.create_user(pb.CreateUserRequest(name="plain"))
    await admin.identity.create_user(pb.CreateUserRequest(name="boss", role=common_pb2.ROLE_ADMIN))
    user = await admin.identity.issue_token(pb.IssueTokenRequest(user_name="plain"))
    boss = await admin.identity.issue_token(pb.IssueTokenRequest(user_name="boss"))
    await admin.mgmtd.set_config(pb.SetConfigRequest(node_type=2, content="a = 0"))
    await admin.close()
    return {USER: user.token, ADMIN: boss.token}


async def test_bad_calls_get_the_right_status_and_change_nothing(mgmtd: InProcessMgmtd, tokens: dict[str, str]) -> None:
    observer = mgmtd.client()
    channel = open_channel(mgmtd.address)
    stubs = {"m": mgmtd_pb2_grpc.MgmtdServiceStub(channel), "i": mgmtd_pb2_grpc.IdentityServiceStub(channel)}
    failures = []
    for caller, service, method, request, expected in CASES:
        before = await snapshot(observer)
        token = tokens.get(caller, caller)
        try:
            await RpcClient(token=token, retry=RetryPolicy(max_attempts=1)).unary(
                getattr(stubs[service], method), request
            )
            got = C.OK
        except RpcError as err:
            got = err.code
            assert err.details, f"{method}: empty error details"
        after = await snapshot(observer)
        if got is not expected or after != before:
            failures.append(
                f"{method}({request!s:.60}) as {caller!r}: {got.name}, expected {expected.name}"
                f"{'' if after == before else ' and it changed state'}"
            )
    await channel.close()
    await observer.close()
    assert not failures, "\n".join(failures)


async def test_health_and_reflection(mgmtd: InProcessMgmtd) -> None:
    channel = open_channel(mgmtd.address)
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "fireflyer.mgmtd.v1.MgmtdService", "fireflyer.mgmtd.v1.IdentityService"):
        assert (await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)).status == (
            health_pb2.HealthCheckResponse.SERVING
        )
    refl = reflection_pb2_grpc.ServerReflectionStub(channel)
    listed = refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    names = {s.name async for r in listed for s in r.list_services_response.service}
    assert {"fireflyer.mgmtd.v1.MgmtdService", "fireflyer.mgmtd.v1.IdentityService", "grpc.health.v1.Health"} <= names
    files = refl.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(file_containing_symbol="fireflyer.mgmtd.v1.IdentityService")])
    )
    protos = [
        descriptor_pb2.FileDescriptorProto.FromString(p)
        async for r in files
        for p in r.file_descriptor_response.file_descriptor_proto
    ]
    methods = {m.name for f in protos for s in f.service if s.name == "IdentityService" for m in s.method}
    assert {"CreateUser", "IssueToken", "RevokeToken", "ValidateToken", "WhoAmI"} <= methods
    await channel.close()
