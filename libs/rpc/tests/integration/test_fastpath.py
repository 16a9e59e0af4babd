"""The fast path (``ff_rpc.fastpath``) against a real RpcServer: the same policy as gRPC, hostile frames refused.

The servicer is test_server.py's double of an application; every outcome is compared with what the same call gets
over gRPC, so a caller can do nothing on one transport that the other refuses.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from ff_rpc import RpcClient, RpcError, RpcServer, open_channel
from ff_rpc.acting import ACT_AS_HEADER
from ff_rpc.fastpath import MAX_HEADER_BYTES, FastPool, encode
from fireflyer.mgmtd.v1 import mgmtd_pb2 as pb
from fireflyer.mgmtd.v1 import mgmtd_pb2_grpc

from .test_server import CLUSTER_TOKEN, SERVICE, AppDouble, app_server

PATH = f"/{SERVICE}"


@pytest.fixture
async def served() -> AsyncIterator[tuple[RpcServer, AppDouble, grpc.aio.Channel]]:
    servicer = AppDouble()
    server = app_server(servicer, fast_address="127.0.0.1:0", max_request_bytes=1 << 16)
    await server.start()
    channel = open_channel(server.address)
    yield server, servicer, channel
    await channel.close()
    await server.stop(0)


async def both(server: RpcServer, channel: grpc.aio.Channel, token: str, method: str, request: Any, **md: str) -> Any:
    """The call's outcome over gRPC and over the fast path: (response or status code, the same for the other)."""
    rpc = RpcClient(token=token)
    metadata = rpc.metadata() + tuple(md.items())
    outcomes = []
    try:
        stub = getattr(mgmtd_pb2_grpc.MgmtdServiceStub(channel), method)
        outcomes.append(await stub(request, metadata=metadata, timeout=5))
    except grpc.aio.AioRpcError as err:
        outcomes.append(err.code())
    pool = FastPool()
    try:
        raw = await pool.call(server.fast_address, f"{PATH}/{method}", request.SerializeToString(), metadata, 5.0)
        outcomes.append(type(request).__name__.replace("Request", "Response"))
        outcomes[-1] = getattr(pb, outcomes[-1]).FromString(raw)
    except RpcError as err:
        outcomes.append(err.code)
    finally:
        pool.close()
    return outcomes


@pytest.mark.parametrize(
    ("token", "method", "request_", "md"),
    [
        ("", "GetRoutingInfo", pb.GetRoutingInfoRequest(), {}),
        ("wrong", "GetRoutingInfo", pb.GetRoutingInfoRequest(), {}),
        ("alice-token", "GetRoutingInfo", pb.GetRoutingInfoRequest(), {}),
        ("alice-token", "SetChains", pb.SetChainsRequest(), {}),
        ("alice-token", "Heartbeat", pb.HeartbeatRequest(), {}),
        ("alice-token", "GetRoutingInfo", pb.GetRoutingInfoRequest(), {ACT_AS_HEADER: "0:0"}),
        ("root-token", "GetRoutingInfo", pb.GetRoutingInfoRequest(), {ACT_AS_HEADER: "not a header"}),
        ("root-token", "GetRoutingInfo", pb.GetRoutingInfoRequest(), {ACT_AS_HEADER: "1000:1000"}),
        ("alice-token", "GetRoutingInfo", pb.GetRoutingInfoRequest(known_version=404), {}),
        ("alice-token", "GetRoutingInfo", pb.GetRoutingInfoRequest(known_version=409), {}),
        ("alice-token", "GetRoutingInfo", pb.GetRoutingInfoRequest(known_version=500), {}),
        (CLUSTER_TOKEN, "GetRoutingInfo", pb.GetRoutingInfoRequest(), {}),
    ],
)
async def test_every_call_gets_what_it_gets_over_grpc(
    served: Any, token: str, method: str, request_: Any, md: dict[str, str]
) -> None:
    server, servicer, channel = served
    over_grpc, over_fast = await both(server, channel, token, method, request_, **md)
    assert over_fast == over_grpc
    assert servicer.heartbeats == 0 and servicer.set_chains_calls == 0


async def test_the_servicer_sees_the_callers_principal_and_errors_carry_the_request_id(served: Any) -> None:
    server, _, _ = served
    pool = FastPool()
    md = RpcClient(token="alice-token").metadata()
    raw = await pool.call(server.fast_address, f"{PATH}/GetRoutingInfo", b"", md, 5.0)
    assert pb.GetRoutingInfoResponse.FromString(raw).routing_info.cluster_id == "alice"
    with pytest.raises(RpcError) as err:
        await pool.call(
            server.fast_address,
            f"{PATH}/GetRoutingInfo",
            pb.GetRoutingInfoRequest(known_version=500).SerializeToString(),
            md,
            5.0,
        )
    assert err.value.code is grpc.StatusCode.INTERNAL
    assert err.value.trailing_metadata["x-request-id"] == dict(md)["x-request-id"]
    pool.close()


@pytest.mark.parametrize(
    ("method", "body", "code"),
    [
        (f"{PATH}/GetRoutingInfo", b"\xff\xff\xff", grpc.StatusCode.INVALID_ARGUMENT),  # not the message
        (f"{PATH}/NoSuchMethod", b"", grpc.StatusCode.UNIMPLEMENTED),
        (f"{PATH}/WatchRoutingInfo", b"", grpc.StatusCode.UNIMPLEMENTED),  # streams stay on gRPC
        (f"{PATH}/GetRoutingInfo", b"x" * ((1 << 16) + 1), grpc.StatusCode.RESOURCE_EXHAUSTED),
    ],
)
async def test_bad_calls_are_refused_with_the_right_status(
    served: Any, method: str, body: bytes, code: grpc.StatusCode
) -> None:
    server, _, _ = served
    pool = FastPool()
    with pytest.raises(RpcError) as err:
        await pool.call(server.fast_address, method, body, RpcClient(token="alice-token").metadata(), 5.0)
    assert err.value.code is code
    pool.close()


async def _raw(address: str, data: bytes) -> bytes:
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(data)
    await writer.drain()
    try:  # one answer frame
        sizes = await asyncio.wait_for(reader.readexactly(8), 5)
        head_len, body_len = struct.unpack(">II", sizes)
        return sizes + await asyncio.wait_for(reader.readexactly(head_len + body_len), 5)
    finally:
        writer.close()


@pytest.mark.parametrize(
    "frame",
    [
        struct.pack(">II", MAX_HEADER_BYTES + 1, 0),  # a header sized to hurt: refused before it is read
        struct.pack(">II", 5, 0) + b"nope!",  # not JSON
        struct.pack(">II", 2, 0) + b"[]",  # not an object
        encode({"m": 7, "md": [], "t": None}),  # no method name
        encode({"m": f"{PATH}/GetRoutingInfo", "md": [["a"]], "t": None}),  # bad metadata
        encode({"m": f"{PATH}/GetRoutingInfo", "md": [], "t": "soon"}),  # bad timeout
    ],
)
async def test_hostile_frames_are_answered_and_the_server_keeps_serving(served: Any, frame: bytes) -> None:
    server, _, _ = served
    answer = await _raw(server.fast_address, frame)
    head_len, _ = struct.unpack(">II", answer[:8])
    assert b'"c":"OK"' not in answer[8 : 8 + head_len]
    pool = FastPool()
    md = RpcClient(token="alice-token").metadata()
    raw = await pool.call(server.fast_address, f"{PATH}/GetRoutingInfo", b"", md, 5)
    assert pb.GetRoutingInfoResponse.FromString(raw).routing_info.cluster_id == "alice"
    pool.close()


async def test_a_call_past_its_deadline_is_deadline_exceeded(served: Any) -> None:
    server, _, _ = served
    pool = FastPool()
    request = pb.GetRoutingInfoRequest(known_version=7).SerializeToString()  # the double sleeps 0.5 s
    with pytest.raises(RpcError) as err:
        md = RpcClient(token="alice-token").metadata()
        await pool.call(server.fast_address, f"{PATH}/GetRoutingInfo", request, md, 0.1)
    assert err.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
    pool.close()


async def test_a_stopped_server_is_unavailable_and_a_kept_connection_is_not_reused(served: Any) -> None:
    """A call that could not be sent says so ("failed to connect": it never ran, any call may go elsewhere)."""
    server, _, _ = served
    address = server.fast_address
    pool = FastPool()
    md = RpcClient(token="alice-token").metadata()
    await pool.call(address, f"{PATH}/GetRoutingInfo", b"", md, 5)  # leaves a connection open in the pool
    await server.stop(0)
    await asyncio.sleep(0.2)  # the server's close reaches the client
    with pytest.raises(RpcError) as err:
        await pool.call(address, f"{PATH}/GetRoutingInfo", b"", md, 5)
    assert err.value.code is grpc.StatusCode.UNAVAILABLE
    assert "failed to connect to all addresses" in err.value.details
    pool.close()


async def test_a_server_without_a_fast_address_serves_none() -> None:
    server = app_server(AppDouble())
    await server.start()
    try:
        assert server.fast_address == ""
    finally:
        await server.stop(0)
