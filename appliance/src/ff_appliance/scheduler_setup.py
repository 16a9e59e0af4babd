"""What ``up`` sets up for the scheduler: a user for the hfai CLI with quotas and a fresh token.

``ensure_hfai_user`` returns the lines ``up`` prints on how to use them.
"""

from __future__ import annotations

import grpc

from ff_cluster import MgmtdClient
from ff_rpc import RpcError
from ff_rpc.client import one_call
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2
from fireflyer.scheduler.v1 import scheduler_pb2
from fireflyer.scheduler.v1.scheduler_client import SchedulerServiceClient

HFAI_USER = "hfai-demo"
DEFAULT_GROUP = "default"
# (priority, nodes): what the demo user may run at once.
HFAI_QUOTAS = ((10, 4), (30, 2))
TOKEN_TTL_S = 30 * 24 * 3600.0


async def scheduler_address(mgmtd: MgmtdClient) -> str:
    """The gRPC address of an alive scheduler, from mgmtd's routing info.

    Raises:
        RuntimeError: no alive scheduler is registered with mgmtd.
    """
    info = (await mgmtd.mgmtd.get_routing_info(mgmtd_pb2.GetRoutingInfoRequest())).routing_info
    for node in info.nodes:
        if node.node_type == common_pb2.NODE_TYPE_SCHEDULER and node.status == mgmtd_pb2.NODE_STATUS_ALIVE:
            for endpoint in node.endpoints:
                if endpoint.name == "grpc":
                    return str(endpoint.address)
    raise RuntimeError("no scheduler is registered with mgmtd")


async def set_quota(address: str, token: str, user: str, level: int, nodes: int, group: str = DEFAULT_GROUP) -> None:
    """Let ``user`` hold ``nodes`` nodes at once at priority ``level`` in node group ``group`` (an admin token)."""
    quota = scheduler_pb2.Quota(user_name=user, priority=level, node_group=group, max_nodes=nodes)
    await one_call(
        address, SchedulerServiceClient, lambda c: c.set_quota(scheduler_pb2.SetQuotaRequest(quota=quota)), token=token
    )


async def ensure_user(mgmtd: MgmtdClient, name: str) -> None:
    """Creates user ``name`` in mgmtd's registry; nothing when it is there already."""
    try:
        await mgmtd.identity.create_user(mgmtd_pb2.CreateUserRequest(name=name))
    except RpcError as err:
        if err.code is not grpc.StatusCode.ALREADY_EXISTS:
            raise


async def ensure_hfai_user(mgmtd: MgmtdClient, cluster_token: str) -> str:
    """Create the hfai demo user (once), give it quotas, issue it a token; how to use them, as text."""
    address = await scheduler_address(mgmtd)
    await ensure_user(mgmtd, HFAI_USER)
    for level, nodes in HFAI_QUOTAS:
        await set_quota(address, cluster_token, HFAI_USER, level, nodes)
    issued = await mgmtd.identity.issue_token(
        mgmtd_pb2.IssueTokenRequest(user_name=HFAI_USER, ttl_s=TOKEN_TTL_S, description="hfai CLI (fireflyer up)"),
    )
    quotas = ", ".join(f"{n} nodes at {lvl}" for lvl, n in HFAI_QUOTAS)
    return (
        f"at {address}; user {HFAI_USER} ({quotas}) may use the hfai CLI:\n"
        f"    export HFAI_SERVER={address} HFAI_TOKEN={issued.token}\n"
        f"    hfai whoami; hfai python train.py -- --nodes 1 --priority 30; hfai list; hfai nodes\n"
        f"  as admin (quotas, nodes): HFAI_TOKEN=$(cat <state>/secrets/admin_token) hfai admin quota set USER 10 4"
    )
