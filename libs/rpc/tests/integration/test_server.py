"""The runtime over a real grpc.aio server on port 0: policy, health, reflection, metrics, stop, retries.

The servicer here is a small test double of an application (this tests the runtime layer); mgmtd's
own tests exercise the runtime with the real service.
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from ff_rpc import (
    NotFound,
    Principal,
    RetryPolicy,
    Role,
    RpcClient,
    RpcError,
    RpcServer,
    ServerOptions,
    ServiceBinding,
    StatusTable,
    Unauthenticated,
    Unavailable,
    current_principal,
    open_channel,
)
from ff_testing.hostile import MALFORMED_MESSAGES, call_raw
from fireflyer.mgmtd.v1 import mgmtd_pb2 as pb
from fireflyer.mgmtd.v1 import mgmtd_pb2_grpc

CLUSTER_TOKEN = "cluster-secret"
SERVICE = "fireflyer.mgmtd.v1.MgmtdService"
USERS = {"alice-token": Principal(uid=1000, name="alice"), "root-token": Principal(uid=1, name="root", role=Role.ADMIN)}


class StaleThing(Exception):
    pass


class DictValidator:
    async def validate(self, token: str) -> Principal:
        if token not in USERS:
            raise Unauthenticated("unknown token")
        return USERS[token]


class AppDouble(mgmtd_pb2_grpc.MgmtdServiceServicer):
    def __init__(self) -> None:
        self.heartbeats = 0
        self.fail_heartbeats = 0
        self.set_chains_calls = 0
        self.slow_started = asyncio.Event()

    async def GetPrimary(self, request: Any, context: Any) -> pb.GetPrimaryResponse:
        return pb.GetPrimaryResponse(primary_address="here:1")

    async def GetRoutingInfo(self, request: Any, context: Any) -> pb.GetRoutingInfoResponse:
        if request.known_version == 404:
            raise NotFound("no such thing")
        if request.known_version == 409:
            raise StaleThing("version 409 is stale")
        if request.known_version == 500:
            raise ValueError("a bug")
        if request.known_version == 7:  # slow call, for graceful stop
            self.slow_started.set()
            await asyncio.sleep(0.5)
        return pb.GetRoutingInfoResponse(routing_info=pb.RoutingInfo(cluster_id=current_principal().name))

    async def Heartbeat(self, request: Any, context: Any) -> pb.HeartbeatResponse:
        self.heartbeats += 1
        if self.heartbeats <= self.fail_heartbeats:
            raise Unavailable("try again")
        return pb.HeartbeatResponse(routing_version=self.heartbeats)

    async def SetChains(self, request: Any, context: Any) -> pb.SetChainsResponse:
        self.set_chains_calls += 1
        raise Unavailable("briefly down")

    async def WatchRoutingInfo(self, request: Any, context: Any) -> AsyncIterator[pb.WatchRoutingInfoResponse]:
        for version in (1, 2, 3):
            yield pb.WatchRoutingInfoResponse(routing_info=pb.RoutingInfo(version=version))
        raise NotFound("stream ended with an error")


def app_server(servicer: AppDouble, **options: Any) -> RpcServer:
    """The servicer double behind the runtime's policy: cluster token, ``USERS``, StaleThing as ABORTED."""
    return RpcServer(
        ServerOptions(
            listen_address="127.0.0.1:0",
            cluster_token=CLUSTER_TOKEN,
            token_validator=DictValidator(),
            status_table=StatusTable({StaleThing: grpc.StatusCode.ABORTED}),
            grace_s=2.0,
            **options,
        ),
        [ServiceBinding(SERVICE, mgmtd_pb2_grpc.add_MgmtdServiceServicer_to_server, servicer)],
    )


@pytest.fixture
async def served() -> AsyncIterator[tuple[RpcServer, AppDouble, grpc.aio.Channel]]:
    servicer = AppDouble()
    server = app_server(servicer, metrics_address="127.0.0.1:0")
    await server.start()
    channel = open_channel(server.address)
    yield server, servicer, channel
    await channel.close()
    await server.stop(0)


def stub(channel: grpc.aio.Channel) -> mgmtd_pb2_grpc.MgmtdServiceStub:
    return mgmtd_pb2_grpc.MgmtdServiceStub(channel)


async def call(channel: grpc.aio.Channel, token: str, method: str, request: Any, **kw: Any) -> Any:
    return await RpcClient(token=token, **kw).unary(getattr(stub(channel), method), request)


async def test_health_is_serving_without_a_token(served: Any) -> None:
    _, _, channel = served
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "fireflyer.mgmtd.v1.MgmtdService"):
        resp = await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert resp.status == health_pb2.HealthCheckResponse.SERVING


async def test_reflection_lists_the_services(served: Any) -> None:
    _, _, channel = served
    refl = reflection_pb2_grpc.ServerReflectionStub(channel)
    responses = refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    names = {s.name async for r in responses for s in r.list_services_response.service}
    assert {"fireflyer.mgmtd.v1.MgmtdService", "grpc.health.v1.Health"} <= names
    # And the method list of our service comes through the file descriptor.
    responses = refl.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(file_containing_symbol="fireflyer.mgmtd.v1.MgmtdService")])
    )
    protos = [p async for r in responses for p in r.file_descriptor_response.file_descriptor_proto]
    from google.protobuf import descriptor_pb2

    files = [descriptor_pb2.FileDescriptorProto.FromString(p) for p in protos]
    methods = {m.name for f in files for s in f.service if s.name == "MgmtdService" for m in s.method}
    assert {"RegisterNode", "Heartbeat", "GetRoutingInfo", "SetChains"} <= methods


@pytest.mark.parametrize(
    ("token", "method", "code"),
    [
        ("", "GetRoutingInfo", grpc.StatusCode.UNAUTHENTICATED),
        ("wrong", "GetRoutingInfo", grpc.StatusCode.UNAUTHENTICATED),
        ("alice-token", "SetChains", grpc.StatusCode.PERMISSION_DENIED),
        ("alice-token", "Heartbeat", grpc.StatusCode.PERMISSION_DENIED),
        ("root-token", "Heartbeat", grpc.StatusCode.PERMISSION_DENIED),
    ],
)
async def test_tokens_are_checked_against_the_access_rule(
    served: Any, token: str, method: str, code: grpc.StatusCode
) -> None:
    _, servicer, channel = served
    request = {
        "GetRoutingInfo": pb.GetRoutingInfoRequest(),
        "SetChains": pb.SetChainsRequest(),
        "Heartbeat": pb.HeartbeatRequest(),
    }[method]
    with pytest.raises(RpcError) as err:
        await call(channel, token, method, request)
    assert err.value.code is code
    assert servicer.heartbeats == 0 and servicer.set_chains_calls == 0  # refused before the servicer ran


async def test_principal_reaches_the_servicer(served: Any) -> None:
    _, _, channel = served
    assert (
        await call(channel, "alice-token", "GetRoutingInfo", pb.GetRoutingInfoRequest())
    ).routing_info.cluster_id == "alice"
    assert (
        await call(channel, CLUSTER_TOKEN, "GetRoutingInfo", pb.GetRoutingInfoRequest())
    ).routing_info.cluster_id == "cluster"
    assert (await call(channel, "", "GetPrimary", pb.GetPrimaryRequest())).primary_address == "here:1"  # public


@pytest.mark.parametrize(
    ("version", "code", "details"),
    [
        (404, grpc.StatusCode.NOT_FOUND, "no such thing"),
        (409, grpc.StatusCode.ABORTED, "version 409 is stale"),
        (500, grpc.StatusCode.INTERNAL, "internal error (request id"),
    ],
)
async def test_errors_map_to_one_status_each(served: Any, version: int, code: grpc.StatusCode, details: str) -> None:
    _, _, channel = served
    with pytest.raises(RpcError) as err:
        await call(channel, "alice-token", "GetRoutingInfo", pb.GetRoutingInfoRequest(known_version=version))
    assert err.value.code is code
    assert details in err.value.details
    assert err.value.trailing_metadata.get("x-request-id")


async def test_streams_pass_items_then_map_the_error(served: Any) -> None:
    _, _, channel = served
    got = []
    with pytest.raises(RpcError) as err:
        async for msg in RpcClient(token="alice-token").stream(
            stub(channel).WatchRoutingInfo, pb.WatchRoutingInfoRequest()
        ):
            got.append(msg.routing_info.version)
    assert got == [1, 2, 3]
    assert err.value.code is grpc.StatusCode.NOT_FOUND


async def test_idempotent_calls_are_retried_and_others_are_not(served: Any) -> None:
    _, servicer, channel = served
    servicer.fail_heartbeats = 2
    fast = RetryPolicy(max_attempts=4, initial_backoff_s=0.01)
    resp = await call(channel, CLUSTER_TOKEN, "Heartbeat", pb.HeartbeatRequest(node_id=1), retry=fast)
    assert resp.routing_version == 3 and servicer.heartbeats == 3
    with pytest.raises(RpcError) as err:
        await call(channel, CLUSTER_TOKEN, "SetChains", pb.SetChainsRequest(), retry=fast)
    assert err.value.code is grpc.StatusCode.UNAVAILABLE
    assert servicer.set_chains_calls == 1


async def test_metrics_count_requests_by_code(served: Any) -> None:
    server, _, channel = served
    await call(channel, "alice-token", "GetRoutingInfo", pb.GetRoutingInfoRequest())
    with pytest.raises(RpcError):
        await call(channel, "alice-token", "GetRoutingInfo", pb.GetRoutingInfoRequest(known_version=404))
    with pytest.raises(RpcError):
        await call(channel, "", "GetRoutingInfo", pb.GetRoutingInfoRequest())
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    labels = 'method="GetRoutingInfo",service="fireflyer.mgmtd.v1.MgmtdService"'
    # The status reaches the client before the server's call ends and counts it: scrape until all three
    # are counted (none in flight), for a bounded time.
    for _ in range(100):
        text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read().decode())
        if 'ff_rpc_in_flight{service="fireflyer.mgmtd.v1.MgmtdService"} 0.0' in text:
            break
        await asyncio.sleep(0.05)
    assert f'ff_rpc_requests_total{{code="OK",{labels}}} 1.0' in text
    assert f'ff_rpc_requests_total{{code="NOT_FOUND",{labels}}} 1.0' in text
    assert f'ff_rpc_requests_total{{code="UNAUTHENTICATED",{labels}}} 1.0' in text
    assert f"ff_rpc_request_duration_seconds_count{{{labels}}} 3.0" in text


async def test_graceful_stop_drains_in_flight_calls_and_refuses_new_ones(served: Any) -> None:
    server, servicer, channel = served
    slow = asyncio.create_task(
        call(channel, "alice-token", "GetRoutingInfo", pb.GetRoutingInfoRequest(known_version=7))
    )
    await servicer.slow_started.wait()
    stopping = asyncio.create_task(server.stop())
    await asyncio.wait_for(server.stopping.wait(), timeout=5)  # (TimeoutError: stop() never began to stop)
    assert (await slow).routing_info.cluster_id == "alice"  # finished during the grace
    await stopping
    with pytest.raises(RpcError) as err:
        await call(
            channel, "alice-token", "GetRoutingInfo", pb.GetRoutingInfoRequest(), retry=RetryPolicy(max_attempts=1)
        )
    assert err.value.code is grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("data", MALFORMED_MESSAGES)
async def test_malformed_request_bytes_are_invalid_argument_and_change_nothing(served: Any, data: bytes) -> None:
    _, servicer, channel = served
    answer = await call_raw(channel, f"/{SERVICE}/Heartbeat", [data], token=CLUSTER_TOKEN)
    assert answer.code is grpc.StatusCode.INVALID_ARGUMENT, answer
    assert "malformed request message" in answer.details
    assert servicer.heartbeats == 0  # refused before the servicer ran
    resp = await call(channel, CLUSTER_TOKEN, "Heartbeat", pb.HeartbeatRequest(node_id=1))
    assert resp.routing_version == 1  # and the server goes on serving


async def test_malformed_request_of_an_unauthenticated_caller_is_unauthenticated(served: Any) -> None:
    _, _, channel = served
    answer = await call_raw(channel, f"/{SERVICE}/GetRoutingInfo", [MALFORMED_MESSAGES[0]])
    assert answer.code is grpc.StatusCode.UNAUTHENTICATED


async def test_malformed_request_of_a_response_stream_is_invalid_argument(served: Any) -> None:
    _, _, channel = served
    answer = await call_raw(
        channel, f"/{SERVICE}/WatchRoutingInfo", [MALFORMED_MESSAGES[1]], token="alice-token", response_stream=True
    )
    assert answer.code is grpc.StatusCode.INVALID_ARGUMENT and not answer.messages


async def test_malformed_message_in_a_request_stream_ends_the_call_with_invalid_argument(served: Any) -> None:
    _, _, channel = served
    method = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
    good = reflection_pb2.ServerReflectionRequest(list_services="").SerializeToString()
    answer = await call_raw(channel, method, [good], request_stream=True, response_stream=True)
    assert answer.code is grpc.StatusCode.OK and len(answer.messages) == 1
    answer = await call_raw(
        channel, method, [good, MALFORMED_MESSAGES[2], good], request_stream=True, response_stream=True
    )
    assert answer.code is grpc.StatusCode.INVALID_ARGUMENT, answer
    assert len(answer.messages) <= 1  # at most the answer to the first, good message
