"""Calls from the scheduler to node agents (AgentService): channels per agent, deadlines, no retries
(orders are re-sent by the driver's reconciliation until the agent's reports show them done)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from ff_rpc import RpcClient
from ff_rpc.client import NO_RETRY, StubPool
from fireflyer.agent.v1 import agent_pb2, agent_pb2_grpc


class AgentPool:
    def __init__(self, cluster_token: str, timeout_s: float) -> None:
        self._rpc = RpcClient(token=cluster_token, timeout_s=timeout_s, retry=NO_RETRY)
        self._stubs = StubPool(agent_pb2_grpc.AgentServiceStub)

    def _stub(self, address: str) -> agent_pb2_grpc.AgentServiceStub:
        return self._stubs.get(address)

    async def start_run(self, address: str, request: agent_pb2.StartRunRequest) -> agent_pb2.StartRunResponse:
        return await self._rpc.unary(self._stub(address).StartRun, request)  # type: ignore[no-any-return]

    async def suspend_run(self, address: str, request: agent_pb2.SuspendRunRequest) -> agent_pb2.SuspendRunResponse:
        return await self._rpc.unary(self._stub(address).SuspendRun, request)  # type: ignore[no-any-return]

    async def stop_run(self, address: str, request: agent_pb2.StopRunRequest) -> agent_pb2.StopRunResponse:
        return await self._rpc.unary(self._stub(address).StopRun, request)  # type: ignore[no-any-return]

    async def validate(self, address: str, request: agent_pb2.ValidateNodeRequest) -> agent_pb2.ValidateNodeResponse:
        return await self._rpc.unary(self._stub(address).ValidateNode, request, timeout_s=600.0)  # type: ignore[no-any-return]

    def read_logs(self, address: str, request: agent_pb2.ReadLogsRequest) -> AsyncIterator[agent_pb2.ReadLogsResponse]:
        return self._rpc.stream(self._stub(address).ReadLogs, request)

    async def close(self) -> None:
        await self._stubs.close()
