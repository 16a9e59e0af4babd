"""One user's calls to the scheduler, for the parts of ``fireflyer demo``: a user with a token, and a client."""

from __future__ import annotations

from ff_appliance.scheduler_setup import ensure_user
from ff_cluster import MgmtdClient
from ff_rpc import ChannelInvoker, ChannelPool, RpcClient
from fireflyer.mgmtd.v1 import mgmtd_pb2
from fireflyer.scheduler.v1 import scheduler_pb2 as pb
from fireflyer.scheduler.v1.scheduler_client import SchedulerServiceClient

TOKEN_TTL_S = 3600.0


async def user_token(mgmtd: MgmtdClient, name: str) -> str:
    """Creates user ``name`` unless it exists, and issues it a token for an hour."""
    await ensure_user(mgmtd, name)
    issued = await mgmtd.identity.issue_token(mgmtd_pb2.IssueTokenRequest(user_name=name, ttl_s=TOKEN_TTL_S))
    return str(issued.token)


class SchedulerUser:
    """Calls to the scheduler at ``address`` as the user whose token is ``token``; close it when done.

    ``scheduler`` is the typed client: ``await user.scheduler.get_task(request)``.
    """

    def __init__(self, address: str, token: str, timeout_s: float = 5.0) -> None:
        self._channels = ChannelPool()
        rpc = RpcClient(token=token, timeout_s=timeout_s)
        self.scheduler = SchedulerServiceClient(ChannelInvoker(rpc, self._channels, address))

    async def task(self, task_id: int) -> pb.Task:
        """The task with its runs."""
        return (await self.scheduler.get_task(pb.GetTaskRequest(task_id=task_id, include_runs=True))).task

    async def log_bytes(
        self, task_id: int, node_rank: int, *, run_id: int = 0, offset: int = 0, follow: bool = False
    ) -> bytes:
        """Node ``node_rank``'s combined log of the run (0: the latest), from byte ``offset``.

        With ``follow``, it waits for more until the run ends.
        """
        request = pb.StreamLogsRequest(
            task_id=task_id, node_rank=node_rank, run_id=run_id, offset_bytes=offset, follow=follow
        )
        return b"".join([c.data async for c in self.scheduler.stream_logs(request)])

    async def log(self, task_id: int, node_rank: int, *, run_id: int = 0, follow: bool = False) -> str:
        """``log_bytes`` from the start, as text."""
        return (await self.log_bytes(task_id, node_rank, run_id=run_id, follow=follow)).decode(errors="replace")

    async def close(self) -> None:
        """Close the channel; the client cannot be used afterwards."""
        await self._channels.close()
