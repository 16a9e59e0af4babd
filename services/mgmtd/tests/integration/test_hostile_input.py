"""Hostile input against a real mgmtd process: every RPC with boundary and oversized values (2^64-1 and
2^32-1 ids, huge strings, huge repeated fields, repeated entries, malformed bytes), each answered with
its intended status within the time and memory bounds, and mgmtd still serving after each."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message

from ff_cluster import MgmtdClient
from ff_rpc import open_channel
from ff_testing.hostile import MALFORMED_MESSAGES, Hostile, check_hostile
from ff_testing.mgmtd import CLUSTER_TOKEN, MgmtdProcess
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2 as pb

C = grpc.StatusCode
M, ID = "/fireflyer.mgmtd.v1.MgmtdService/", "/fireflyer.mgmtd.v1.IdentityService/"
U64, U32 = 2**64 - 1, 2**32 - 1
HUGE = "x" * (1 << 20)  # 1 MiB of text: under mgmtd's 4 MiB request limit, far over any field's
OVER = "y" * (5 << 20)  # a request over that limit
MANY = 50_000  # entries of a repeated field (under the request limit)
EP = [common_pb2.Endpoint(name="grpc", address="127.0.0.1:7000")]
USER, ADMIN = "<user>", "<admin>"  # replaced by real tokens


def _case(
    what: str, method: str, request: Message | bytes, code: grpc.StatusCode, token: str = ADMIN, **kw: Any
) -> Hostile:
    data = request if isinstance(request, bytes) else request.SerializeToString()
    return Hostile(what, method, data, code, token, **kw)


def _node(**kw: Any) -> pb.RegisterNodeRequest:
    return pb.RegisterNodeRequest(**{"node_type": common_pb2.NODE_TYPE_META, "hostname": "h", "endpoints": EP, **kw})


CASES = [
    *[_case(f"malformed bytes {i} to {m}", (ID if m == "CreateUser" else M) + m, bad, C.INVALID_ARGUMENT, token)
      for i, bad in enumerate(MALFORMED_MESSAGES)
      for m, token in (("Heartbeat", CLUSTER_TOKEN), ("GetRoutingInfo", USER), ("CreateUser", ADMIN))],
    _case("malformed bytes to a public call", M + "GetPrimary", MALFORMED_MESSAGES[0], C.INVALID_ARGUMENT, ""),
    _case("a request over 4 MiB", ID + "CreateUser", pb.CreateUserRequest(name=OVER), C.RESOURCE_EXHAUSTED),
    _case("a heartbeat of a million reports (7 MB)", M + "Heartbeat",
          pb.HeartbeatRequest(node_id=1, targets=[pb.LocalTargetReport(target_id=i + 1, local_state=1)
                                                  for i in range(1_000_000)]),
          C.RESOURCE_EXHAUSTED, CLUSTER_TOKEN),
    # membership
    _case("huge hostname", M + "RegisterNode", _node(hostname=HUGE), C.INVALID_ARGUMENT, CLUSTER_TOKEN),
    _case("huge endpoint list", M + "RegisterNode",
          _node(endpoints=[common_pb2.Endpoint(name=f"e{i}", address="127.0.0.1:1") for i in range(MANY)]),
          C.INVALID_ARGUMENT, CLUSTER_TOKEN),
    _case("huge tag map", M + "RegisterNode", _node(tags={f"k{i}": "v" for i in range(MANY)}), C.INVALID_ARGUMENT,
          CLUSTER_TOKEN),
    _case("unknown node type 2^31-1", M + "RegisterNode", _node(node_type=2**31 - 1), C.INVALID_ARGUMENT,
          CLUSTER_TOKEN),
    _case("negative node type", M + "RegisterNode", _node(node_type=-5), C.INVALID_ARGUMENT, CLUSTER_TOKEN),
    _case("heartbeat of node 2^32-1", M + "Heartbeat", pb.HeartbeatRequest(node_id=U32), C.NOT_FOUND, CLUSTER_TOKEN),
    _case("heartbeat with 300,000 target reports", M + "Heartbeat",
          pb.HeartbeatRequest(node_id=1, targets=[pb.LocalTargetReport(target_id=i + 1, local_state=1)
                                                  for i in range(300_000)]),
          C.INVALID_ARGUMENT, CLUSTER_TOKEN),
    _case("heartbeat reporting target 2^64-1", M + "Heartbeat",
          pb.HeartbeatRequest(node_id=1, targets=[pb.LocalTargetReport(target_id=U64, local_state=1)]),
          C.INVALID_ARGUMENT, CLUSTER_TOKEN),
    # routing
    _case("routing known_version 2^64-1", M + "GetRoutingInfo", pb.GetRoutingInfoRequest(known_version=U64), C.OK,
          USER),
    _case("watch from version 2^64-1 (gets the current info)", M + "WatchRoutingInfo",
          pb.WatchRoutingInfoRequest(known_version=U64), C.OK, USER, response_stream=True, max_messages=1),
    _case("chain id 2^32-1 on an unknown node", M + "SetChains",
          pb.SetChainsRequest(chains=[pb.Chain(chain_id=U32, targets=[pb.Target(target_id=1, node_id=U32)])]),
          C.NOT_FOUND),
    _case("target id 2^64-1", M + "SetChains",
          pb.SetChainsRequest(chains=[pb.Chain(chain_id=1, targets=[pb.Target(target_id=U64, node_id=1)])]),
          C.INVALID_ARGUMENT),
    _case("twenty thousand chains", M + "SetChains",
          pb.SetChainsRequest(chains=[pb.Chain(chain_id=i + 1, targets=[pb.Target(target_id=i + 1, node_id=1)])
                                      for i in range(20_000)]),
          C.INVALID_ARGUMENT),
    _case("a chain of 50,000 targets", M + "SetChains",
          pb.SetChainsRequest(chains=[pb.Chain(chain_id=1, targets=[pb.Target(target_id=i + 1, node_id=1)
                                                                  for i in range(MANY)])]),
          C.INVALID_ARGUMENT),
    _case("chain version 2^64-1", M + "SetChains",
          pb.SetChainsRequest(chains=[pb.Chain(chain_id=1, version=U64, targets=[pb.Target(target_id=1, node_id=1)])]),
          C.ABORTED),
    _case("chain table of 500,000 chains", M + "SetChainTable",
          pb.SetChainTableRequest(chain_table=pb.ChainTable(table_id=1, chain_ids=range(1, 500_001))),
          C.INVALID_ARGUMENT),
    _case("chain table with a chain twice", M + "SetChainTable",
          pb.SetChainTableRequest(chain_table=pb.ChainTable(table_id=1, chain_ids=[7, 7])), C.INVALID_ARGUMENT),
    _case("chain table id 2^32-1, version 2^64-1", M + "SetChainTable",
          pb.SetChainTableRequest(chain_table=pb.ChainTable(table_id=U32, version=U64, chain_ids=[1])), C.ABORTED),
    _case("offline target 2^64-1", M + "OfflineTarget", pb.OfflineTargetRequest(target_id=U64), C.INVALID_ARGUMENT),
    _case("offline target 2^63", M + "OfflineTarget", pb.OfflineTargetRequest(target_id=2**63), C.INVALID_ARGUMENT),
    _case("enable node 2^32-1", M + "SetNodeEnabled", pb.SetNodeEnabledRequest(node_id=U32), C.NOT_FOUND),
    _case("remove node 2^32-1", M + "RemoveNode", pb.RemoveNodeRequest(node_id=U32), C.NOT_FOUND),
    _case("remove node 1 as a user", M + "RemoveNode", pb.RemoveNodeRequest(node_id=1), C.PERMISSION_DENIED, USER),
    # config
    _case("config of node type 2^31-1", M + "GetConfig", pb.GetConfigRequest(node_type=2**31 - 1),
          C.INVALID_ARGUMENT, USER),
    _case("config of 3 MiB", M + "SetConfig",
          pb.SetConfigRequest(node_type=common_pb2.NODE_TYPE_META, content="a = '" + HUGE * 3 + "'"),
          C.INVALID_ARGUMENT),
    _case("config expected version 2^64-1", M + "SetConfig",
          pb.SetConfigRequest(node_type=common_pb2.NODE_TYPE_META, expected_version=U64, content="a = 1"), C.ABORTED),
    # identity
    _case("user uid 2^32-1", ID + "CreateUser", pb.CreateUserRequest(name="maxuid", uid=U32), C.INVALID_ARGUMENT),
    _case("user name of 1 MiB", ID + "CreateUser", pb.CreateUserRequest(name=HUGE), C.INVALID_ARGUMENT),
    _case("user in 50,000 groups", ID + "CreateUser",
          pb.CreateUserRequest(name="joiner", group_names=[f"g{i}" for i in range(MANY)]), C.INVALID_ARGUMENT),
    _case("user role 2^31-1", ID + "CreateUser", pb.CreateUserRequest(name="roled", role=2**31 - 1),
          C.INVALID_ARGUMENT),
    _case("group gid 2^32-1", ID + "CreateGroup", pb.CreateGroupRequest(name="maxgid", gid=U32), C.INVALID_ARGUMENT),
    _case("group name of 1 MiB", ID + "CreateGroup", pb.CreateGroupRequest(name=HUGE), C.INVALID_ARGUMENT),
    _case("disable a user named 1 MiB", ID + "SetUserDisabled", pb.SetUserDisabledRequest(name=HUGE, disabled=True),
          C.INVALID_ARGUMENT),
    _case("add a member named 1 MiB", ID + "AddGroupMember",
          pb.AddGroupMemberRequest(group_name="team", user_name=HUGE), C.INVALID_ARGUMENT),
    _case("remove a member of a group named 1 MiB", ID + "RemoveGroupMember",
          pb.RemoveGroupMemberRequest(group_name=HUGE, user_name="plain"), C.INVALID_ARGUMENT),
    _case("token for a user named 1 MiB", ID + "IssueToken", pb.IssueTokenRequest(user_name=HUGE),
          C.INVALID_ARGUMENT),
    _case("token description of 1 MiB", ID + "IssueToken", pb.IssueTokenRequest(user_name="plain", description=HUGE),
          C.INVALID_ARGUMENT),
    _case("token ttl of 1e308 s", ID + "IssueToken", pb.IssueTokenRequest(user_name="plain", ttl_s=1e308),
          C.INVALID_ARGUMENT),
    _case("token ttl -inf", ID + "IssueToken", pb.IssueTokenRequest(user_name="plain", ttl_s=float("-inf")),
          C.INVALID_ARGUMENT),
    _case("tokens of a user named 1 MiB", ID + "ListTokens", pb.ListTokensRequest(user_name=HUGE),
          C.INVALID_ARGUMENT, USER),
    _case("revoke a token id of 1 MiB", ID + "RevokeToken", pb.RevokeTokenRequest(token_id=HUGE), C.INVALID_ARGUMENT,
          USER),
    _case("validate a token of 1 MiB", ID + "ValidateToken", pb.ValidateTokenRequest(token=HUGE),
          C.UNAUTHENTICATED, CLUSTER_TOKEN),
]  # fmt: skip


@pytest.fixture
async def served(sqlite_url: str, spawn_mgmtd: Any) -> AsyncIterator[tuple[MgmtdProcess, dict[str, str]]]:
    mgmtd = await spawn_mgmtd(sqlite_url, "m1").ready()
    client = MgmtdClient([mgmtd.address], token=CLUSTER_TOKEN)
    await client.identity.create_user(pb.CreateUserRequest(name="plain"))
    await client.identity.create_user(pb.CreateUserRequest(name="boss", role=common_pb2.ROLE_ADMIN))
    await client.identity.create_group(pb.CreateGroupRequest(name="team"))
    tokens = {
        USER: (await client.identity.issue_token(pb.IssueTokenRequest(user_name="plain"))).token,
        ADMIN: (await client.identity.issue_token(pb.IssueTokenRequest(user_name="boss"))).token,
    }
    await client.close()
    yield mgmtd, tokens


async def test_hostile_input_gets_its_status_within_bounds_and_mgmtd_keeps_serving(served: Any) -> None:
    mgmtd, tokens = served
    channel = open_channel(mgmtd.address)
    observer = MgmtdClient([mgmtd.address], token=CLUSTER_TOKEN)
    before = await observer.identity.list_users(pb.ListUsersRequest())

    async def still_serving() -> None:
        await observer.mgmtd.get_routing_info(pb.GetRoutingInfoRequest(), timeout_s=5)

    problems: list[str] = []
    try:
        for case in CASES:
            token = tokens.get(case.token, case.token)
            problems += await check_hostile(channel, mgmtd.proc.pid, replace(case, token=token), still_serving)
        after = await observer.identity.list_users(pb.ListUsersRequest())
    finally:
        await channel.close()
        await observer.close()
    assert not problems, "\n".join(problems)
    assert list(after.users) == list(before.users)  # no hostile call created or changed a user
