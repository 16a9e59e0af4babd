"""``ff-act-as`` over a real grpc.aio server: an admin's call runs as the uid sent, a user's is refused before the
servicer runs, a malformed header is INVALID_ARGUMENT."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from ff_rpc import Identity, RpcError, acting_as
from fireflyer.mgmtd.v1 import mgmtd_pb2 as pb

from .test_server import call, served  # noqa: F401  (the server fixture)


async def test_an_admin_call_runs_as_the_identity_sent(served: Any) -> None:  # noqa: F811
    _, _, channel = served
    with acting_as(Identity(1001, (100, 1001))):
        resp = await call(channel, "root-token", "GetRoutingInfo", pb.GetRoutingInfoRequest())
    assert resp.routing_info.cluster_id == "root as uid 1001"
    resp = await call(channel, "root-token", "GetRoutingInfo", pb.GetRoutingInfoRequest())
    assert resp.routing_info.cluster_id == "root"  # outside the block: the token's own user


@pytest.mark.parametrize(
    ("token", "who", "code"),
    [
        ("alice-token", Identity(1001, (1001,)), grpc.StatusCode.PERMISSION_DENIED),
        ("alice-token", Identity(0, (0,)), grpc.StatusCode.PERMISSION_DENIED),
        ("root-token", Identity(-1, (1,)), grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
async def test_acting_is_refused_to_users_and_for_malformed_ids(
    served: Any,  # noqa: F811
    token: str,
    who: Identity,
    code: grpc.StatusCode,
) -> None:
    _, _, channel = served
    with pytest.raises(RpcError) as err, acting_as(who):
        await call(channel, token, "GetRoutingInfo", pb.GetRoutingInfoRequest())
    assert err.value.code is code
