"""The generated typed clients: one typed method per RPC over one Invoker, their descriptors from the protos."""

from __future__ import annotations

import inspect
import sys
import typing
from collections.abc import AsyncIterable, AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "scripts"))
from gen_clients import snake_case

from ff_rpc.client import is_idempotent
from fireflyer.mgmtd.v1 import mgmtd_pb2
from fireflyer.mgmtd.v1.mgmtd_client import MgmtdService, MgmtdServiceApi, MgmtdServiceClient
from fireflyer.rpc_types import Method
from fireflyer.storage.v1 import storage_pb2
from fireflyer.storage.v1.storage_client import StorageServiceClient


def test_each_unary_rpc_has_a_typed_async_method_with_its_request_and_response() -> None:
    hints = typing.get_type_hints(MgmtdServiceClient.heartbeat)
    assert hints == {
        "request": mgmtd_pb2.HeartbeatRequest,
        "timeout_s": float | None,
        "return": mgmtd_pb2.HeartbeatResponse,
    }
    assert inspect.iscoroutinefunction(MgmtdServiceClient.heartbeat)
    assert (
        inspect.signature(MgmtdServiceClient.heartbeat).parameters["timeout_s"].kind is inspect.Parameter.KEYWORD_ONLY
    )


def test_streams_are_typed_too() -> None:
    watch = typing.get_type_hints(MgmtdServiceClient.watch_routing_info)
    assert watch["request"] is mgmtd_pb2.WatchRoutingInfoRequest
    assert watch["return"] == AsyncIterator[mgmtd_pb2.WatchRoutingInfoResponse]
    bidi = typing.get_type_hints(StorageServiceClient.read_stream, localns={"grpc": grpc})
    assert bidi["requests"] == AsyncIterable[storage_pb2.ReadStreamRequest] | None
    assert bidi["return"] == grpc.aio.StreamStreamCall[storage_pb2.ReadStreamRequest, storage_pb2.ReadStreamResponse]


def test_every_rpc_of_the_stub_has_a_method_and_a_descriptor_matching_the_proto() -> None:
    rpcs = mgmtd_pb2.DESCRIPTOR.services_by_name["MgmtdService"].methods
    assert len(rpcs) > 5
    for rpc in rpcs:
        method: Method[Any, Any] = getattr(MgmtdService, rpc.name)
        assert method.path == f"/fireflyer.mgmtd.v1.MgmtdService/{rpc.name}"
        assert method.request_type is getattr(mgmtd_pb2, rpc.input_type.name)
        assert method.response_type is getattr(mgmtd_pb2, rpc.output_type.name)
        assert method.idempotent == is_idempotent(method.path)
        assert method.server_streaming == rpc.server_streaming
    assert {name for name in dir(MgmtdServiceApi) if not name.startswith("_")} == {
        name for name in dir(MgmtdServiceClient) if not name.startswith("_")
    }


class RecordingInvoker:
    """Answers every unary call with an empty response of the method's type, recording what was sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Any, float | None]] = []

    async def unary(self, method: Method[Any, Any], request: Any, *, timeout_s: float | None) -> Any:
        self.sent.append((method.path, request, timeout_s))
        return method.response_type()

    def server_stream(self, method: Method[Any, Any], request: Any, *, timeout_s: float | None) -> Any:
        raise NotImplementedError

    def bidi_stream(self, method: Method[Any, Any], requests: Any, *, timeout_s: float | None) -> Any:
        raise NotImplementedError


async def test_a_typed_call_goes_through_the_invoker_with_its_descriptor() -> None:
    invoker = RecordingInvoker()
    request = mgmtd_pb2.HeartbeatRequest(node_id=7)
    response = await MgmtdServiceClient(invoker).heartbeat(request, timeout_s=2.0)
    assert isinstance(response, mgmtd_pb2.HeartbeatResponse)
    assert invoker.sent == [("/fireflyer.mgmtd.v1.MgmtdService/Heartbeat", request, 2.0)]


@pytest.mark.parametrize(
    ("rpc", "snake"),
    [("GetRoutingInfo", "get_routing_info"), ("StatFs", "stat_fs"), ("List", "list"), ("IssueToken", "issue_token")],
)
def test_method_names_are_snake_case(rpc: str, snake: str) -> None:
    assert snake_case(rpc) == snake
    assert snake_case("Import") == "import_"
