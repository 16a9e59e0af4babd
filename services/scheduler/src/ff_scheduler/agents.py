"""Calls from the scheduler to node agents (AgentService): channels per agent, deadlines, no retries.

Orders are re-sent by the driver's reconciliation until the agent's reports show them done.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from ff_rpc import RpcClient
from ff_rpc.client import NO_RETRY, StubPool
from fireflyer.agent.v1 import agent_pb2, agent_pb2_grpc


class AgentPool:
    """Clients of the agents' AgentService, one channel per address; every call raises ``RpcError`` on failure."""

    def __init__(self, cluster_token: str, timeout_s: float) -> None:
        self._rpc = RpcClient(token=cluster_token, timeout_s=timeout_s, retry=NO_RETRY)
        self._stubs = StubPool(agent_pb2_grpc.AgentServiceStub)

    def _stub(self, address: str) -> agent_pb2_grpc.AgentServiceStub:
        return self._stubs.get(address)

    async def start_run(self, address: str, request: agent_pb2.StartRunRequest) -> agent_pb2.StartRunResponse:
        """Order the agent at ``address`` to start its part of a run (idempotent per run id at the agent)."""
        return await self._rpc.unary(self._stub(address).StartRun, request)  # type: ignore[no-any-return]

    async def suspend_run(self, address: str, request: agent_pb2.SuspendRunRequest) -> agent_pb2.SuspendRunResponse:
        """Order the agent to start the suspend protocol on a run (idempotent)."""
        return await self._rpc.unary(self._stub(address).SuspendRun, request)  # type: ignore[no-any-return]

    async def stop_run(self, address: str, request: agent_pb2.StopRunRequest) -> agent_pb2.StopRunResponse:
        """Order the agent to stop a run (idempotent; a run it does not have is stopped already)."""
        return await self._rpc.unary(self._stub(address).StopRun, request)  # type: ignore[no-any-return]

    async def validate(self, address: str, request: agent_pb2.ValidateNodeRequest) -> agent_pb2.ValidateNodeResponse:
        """Run the node validator on the agent's node (a deadline of 600 s: the checks take a while)."""
        return await self._rpc.unary(self._stub(address).ValidateNode, request, timeout_s=600.0)  # type: ignore[no-any-return]

    def read_logs(self, address: str, request: agent_pb2.ReadLogsRequest) -> AsyncIterator[agent_pb2.ReadLogsResponse]:
        """Stream a run's logs from the agent's node."""
        return self._rpc.stream(self._stub(address).ReadLogs, request)

    async def close(self) -> None:
        """Close the channels to the agents."""
        await self._stubs.close()
