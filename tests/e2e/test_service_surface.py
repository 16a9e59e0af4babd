"""Every service the appliance runs answers the standard probes: gRPC health with no token, reflection
listing its fireflyer services and their methods, and Prometheus metrics counting its RPCs."""

from __future__ import annotations

import asyncio
import urllib.request

import grpc
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from .conftest import Appliance


async def _probe(address: str) -> dict[str, set[str]]:
    """Health must be SERVING; returns each fireflyer service the server lists with its method names."""
    async with grpc.aio.insecure_channel(address) as channel:
        health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING, address
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        listed = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        names = [s.name async for r in listed for s in r.list_services_response.service]
        services: dict[str, set[str]] = {}
        for name in (n for n in names if n.startswith("fireflyer.")):
            files = stub.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(file_containing_symbol=name)])
            )
            protos = [
                descriptor_pb2.FileDescriptorProto.FromString(p)
                async for r in files
                for p in r.file_descriptor_response.file_descriptor_proto
            ]
            short = name.rsplit(".", 1)[1]
            services[name] = {m.name for f in protos for s in f.service if s.name == short for m in s.method}
        return services


def test_every_service_answers_health_reflection_and_metrics(appliance: Appliance) -> None:
    appliance.ok("up")
    status = appliance.ok("status", "--json").json()
    assert status["services"]
    for service in status["services"]:
        listed = asyncio.run(_probe(service["grpc_address"]))
        assert listed, f"{service['instance']} lists no fireflyer service"
        assert all(methods for methods in listed.values()), listed
        metrics = urllib.request.urlopen(service["metrics_url"], timeout=5).read().decode()
        assert "ff_rpc_requests_total" in metrics, service["instance"]
    mgmtd = next(s for s in status["services"] if s["instance"].startswith("mgmtd"))
    listed = asyncio.run(_probe(mgmtd["grpc_address"]))
    assert {"RegisterNode", "Heartbeat", "GetRoutingInfo", "WatchRoutingInfo"} <= listed[
        "fireflyer.mgmtd.v1.MgmtdService"
    ]
    assert {"IssueToken", "ValidateToken", "WhoAmI"} <= listed["fireflyer.mgmtd.v1.IdentityService"]
