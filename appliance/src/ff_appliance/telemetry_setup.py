"""What ``up`` prints for telemetry: where its dashboard, its gRPC API and its HTTP side (/federate) are."""

from __future__ import annotations

from ff_cluster import MgmtdClient
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2


async def telemetry_endpoints(mgmtd: MgmtdClient) -> dict[str, str]:
    """The endpoints (grpc, http, metrics) of the first alive telemetry instance; {} when none is."""
    info = (await mgmtd.mgmtd.get_routing_info(mgmtd_pb2.GetRoutingInfoRequest())).routing_info
    for node in info.nodes:
        if node.node_type == common_pb2.NODE_TYPE_TELEMETRY and node.status == mgmtd_pb2.NODE_STATUS_ALIVE:
            return {e.name: str(e.address) for e in node.endpoints}
    return {}


async def describe(mgmtd: MgmtdClient, cluster_token: str) -> str:
    """The lines ``up`` prints about telemetry: the dashboard, the collector and the federate endpoint.

    Raises:
        RuntimeError: no telemetry instance with an http endpoint is registered with mgmtd.
    """
    endpoints = await telemetry_endpoints(mgmtd)
    if "http" not in endpoints:
        raise RuntimeError("no telemetry instance with an http endpoint is registered with mgmtd")
    return (
        f"dashboard at http://{endpoints['http']}/ (log in with a user token); "
        f"collecting at {endpoints.get('grpc', '?')} (gRPC TelemetryService); Prometheus exposition at "
        f"http://{endpoints['http']}/federate (Authorization: Bearer <token>); it scrapes every service's /metrics"
    )
