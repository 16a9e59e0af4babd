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

from ff_rpc import RpcClient, RpcError, RpcServer, fastpath, open_channel
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
        encode({"m": f"{PATH}/GetRoutingInfo", "md": [["x-a", "tab\there"]], "t": None}),  # a control character
        encode({"m": f"{PATH}/GetRoutingInfo", "md": [["x-a", "caf\u00e9"]], "t": None}),  # printable, not ASCII
        encode({"m": f"{PATH}/GetRoutingInfo", "md": [["x-a", "del\u007f"]], "t": None}),  # DEL
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


@pytest.mark.parametrize(
    "deadline",
    [b"NaN", b"Infinity", b"-Infinity", b"true", b"-1", b"0", b"1" + b"0" * 400, b"100000000"],
)
async def test_a_deadline_that_is_not_a_finite_number_of_seconds_is_refused(served: Any, deadline: bytes) -> None:
    """A NaN deadline in the loop's timer heap would delay every timer of the process (meta's leases)."""
    server, _, _ = served
    head = b'{"m":"/grpc.health.v1.Health/Check","md":[],"t":' + deadline + b"}"
    answer = await _raw(server.fast_address, struct.pack(">II", len(head), 0) + head)
    head_len, _ = struct.unpack(">II", answer[:8])
    assert b'"c":"INVALID_ARGUMENT"' in answer[8 : 8 + head_len]


async def test_metadata_is_taken_as_grpc_takes_it(served: Any) -> None:
    """Keys are case-insensitive: a wrong token is not ignored for being spelled Authorization (gRPC's own clients
    lowercase keys); text only."""
    server, _, channel = served
    pool = FastPool()

    async def fast(method: str, request: Any, metadata: Any) -> grpc.StatusCode:
        with pytest.raises(RpcError) as err:
            await pool.call(server.fast_address, f"{PATH}/{method}", request.SerializeToString(), metadata, 5)
        return err.value.code

    over_grpc, _ = await both(server, channel, "", "GetPrimary", pb.GetPrimaryRequest(), authorization="Bearer WRONG")
    assert await fast("GetPrimary", pb.GetPrimaryRequest(), (("Authorization", "Bearer WRONG"),)) == over_grpc
    user, acting = ("Authorization", "Bearer alice-token"), ("FF-Act-As", "0:0")
    over_grpc, _ = await both(server, channel, "alice-token", "GetRoutingInfo", pb.GetRoutingInfoRequest(),
                              **{ACT_AS_HEADER: "0:0"})  # fmt: skip
    assert await fast("GetRoutingInfo", pb.GetRoutingInfoRequest(), (user, acting)) == over_grpc
    admin = ("authorization", "Bearer root-token")
    for bad in ((ACT_AS_HEADER, "\u00b2:0"), ("x-request-id", "a\nb"), ("blob-bin", "AAAA"), ("k y", "v")):
        assert (
            await fast("GetRoutingInfo", pb.GetRoutingInfoRequest(), (admin, bad)) is grpc.StatusCode.INVALID_ARGUMENT
        )
    pool.close()


async def test_a_header_nested_to_hurt_is_answered(served: Any) -> None:
    server, _, _ = served
    head = b"[" * 60_000 + b"]" * 60_000
    answer = await _raw(server.fast_address, struct.pack(">II", 60_000, 0) + head[:60_000])
    assert b'"c":"INVALID_ARGUMENT"' in answer


async def test_a_frame_left_unfinished_and_an_idle_connection_are_closed(
    served: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slowloris: a peer may not hold connections (and the process's descriptors) before any token is checked."""
    monkeypatch.setattr(fastpath, "FRAME_S", 0.3)
    monkeypatch.setattr(fastpath, "IDLE_S", 0.5)
    server, _, _ = served
    host, port = server.fast_address.rsplit(":", 1)
    stalled = await asyncio.open_connection(host, int(port))
    stalled[1].write(b"\x00\x00\x00")  # three bytes of a frame, then nothing
    idle = await asyncio.open_connection(host, int(port))
    assert await asyncio.wait_for(stalled[0].read(), 5) == b""  # closed by the server
    assert await asyncio.wait_for(idle[0].read(), 5) == b""
    for _, writer in (stalled, idle):
        writer.close()


async def test_connections_past_the_limit_are_closed_and_the_others_still_served(
    served: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fastpath, "MAX_CONNECTIONS", 2)
    server, _, _ = served
    host, port = server.fast_address.rsplit(":", 1)
    held = [await asyncio.open_connection(host, int(port)) for _ in range(2)]
    await asyncio.sleep(0.1)
    extra = await asyncio.open_connection(host, int(port))
    assert await asyncio.wait_for(extra[0].read(), 5) == b""
    reader, writer = held[0]
    writer.write(encode({"m": "/grpc.health.v1.Health/Check", "md": [], "t": 5}))
    sizes = await asyncio.wait_for(reader.readexactly(8), 5)
    head = await reader.readexactly(struct.unpack(">II", sizes)[0])
    assert b'"c":"OK"' in head
    for _, w in (*held, extra):
        w.close()


async def test_bodies_being_received_at_once_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fastpath, "RECEIVE_BUDGET_BYTES", 1000)
    server = app_server(AppDouble(), fast_address="127.0.0.1:0")
    await server.start()
    try:
        host, port = server.fast_address.rsplit(":", 1)
        _, slow = await asyncio.open_connection(host, int(port))
        head = encode({"m": f"{PATH}/GetRoutingInfo", "md": [], "t": 5})[8:]
        slow.write(struct.pack(">II", len(head), 800) + head + b"\x00" * 10)  # 800 bytes announced, 10 sent
        await asyncio.sleep(0.1)
        pool = FastPool()
        with pytest.raises(RpcError) as err:
            await pool.call(server.fast_address, f"{PATH}/GetRoutingInfo", b"\x08\x01" * 250, (), 5)
        assert err.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        pool.close()
        slow.close()
    finally:
        await server.stop(0)


async def test_a_stopping_server_ends_its_calls_in_flight_and_refuses_new_ones_as_not_run(served: Any) -> None:
    server, servicer, _ = served
    pool = FastPool()
    md = RpcClient(token="alice-token").metadata()
    slow = asyncio.ensure_future(
        pool.call(
            server.fast_address,
            f"{PATH}/GetRoutingInfo",
            pb.GetRoutingInfoRequest(known_version=7).SerializeToString(),
            md,
            5,
        )
    )
    await servicer.slow_started.wait()
    host, port = server.fast_address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))  # connected before the stop
    started = asyncio.get_running_loop().time()
    stopping = asyncio.ensure_future(server.stop(3.0))
    await asyncio.sleep(0.05)
    writer.write(encode({"m": f"{PATH}/Heartbeat", "md": [["authorization", f"Bearer {CLUSTER_TOKEN}"]], "t": 5}))
    answer = await asyncio.wait_for(reader.read(), 5)
    assert b"UNAVAILABLE" in answer or answer == b""  # refused as not run, or closed before it was read
    assert servicer.heartbeats == 0
    assert pb.GetRoutingInfoResponse.FromString(await slow).routing_info.cluster_id == "alice"
    await stopping
    assert asyncio.get_running_loop().time() - started < 2.0  # the call in flight ended: no waiting out the grace
    writer.close()
    pool.close()
