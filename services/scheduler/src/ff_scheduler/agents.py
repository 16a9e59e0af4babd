"""Calls from the scheduler to node agents (AgentService): channels per agent, deadlines, no retries.

Orders are re-sent by the driver's reconciliation until the agent's reports show them done.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from ff_rpc import RpcClient
from ff_rpc.client import NO_RETRY, ClientPool
from fireflyer.agent.v1 import agent_pb2
from fireflyer.agent.v1.agent_client import AgentServiceClient


class AgentPool:
    """Clients of the agents' AgentService, one channel per address; every call raises ``RpcError`` on failure."""

    def __init__(self, cluster_token: str, timeout_s: float) -> None:
        self._rpc = RpcClient(token=cluster_token, timeout_s=timeout_s, retry=NO_RETRY)
        self._clients = ClientPool(AgentServiceClient, self._rpc)

    def _client(self, address: str) -> AgentServiceClient:
        return self._clients.get(address)

    async def start_run(self, address: str, request: agent_pb2.StartRunRequest) -> agent_pb2.StartRunResponse:
        """Order the agent at ``address`` to start its part of a run (idempotent per run id at the agent)."""
        return await self._client(address).start_run(request)

    async def suspend_run(self, address: str, request: agent_pb2.SuspendRunRequest) -> agent_pb2.SuspendRunResponse:
        """Order the agent to start the suspend protocol on a run (idempotent)."""
        return await self._client(address).suspend_run(request)

    async def stop_run(self, address: str, request: agent_pb2.StopRunRequest) -> agent_pb2.StopRunResponse:
        """Order the agent to stop a run (idempotent; a run it does not have is stopped already)."""
        return await self._client(address).stop_run(request)

    async def validate(self, address: str, request: agent_pb2.ValidateNodeRequest) -> agent_pb2.ValidateNodeResponse:
        """Run the node validator on the agent's node (a deadline of 600 s: the checks take a while)."""
        return await self._client(address).validate_node(request, timeout_s=600.0)

    def read_logs(self, address: str, request: agent_pb2.ReadLogsRequest) -> AsyncIterator[agent_pb2.ReadLogsResponse]:
        """Stream a run's logs from the agent's node."""
        return self._client(address).read_logs(request)

    async def close(self) -> None:
        """Close the channels to the agents."""
        await self._clients.close()
