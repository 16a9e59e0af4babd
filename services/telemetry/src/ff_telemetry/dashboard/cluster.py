"""The dashboard's reads of mgmtd and the scheduler, each made with the logged-in user's token.

So the services' own authorization applies: the scheduler shows a user only their tasks, and answers
NOT_FOUND for another user's.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TypeVar

from ff_cluster import MgmtdClient
from ff_rpc import RpcClient
from ff_rpc.client import ClientPool
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2
from fireflyer.scheduler.v1 import scheduler_pb2 as spb
from fireflyer.scheduler.v1.scheduler_client import SchedulerServiceClient

T = TypeVar("T")

MAX_TASKS = 1000  # a listing stops after this many tasks (newest first)
MAX_LOG_BYTES = 256 * 1024

# The token of the request being served. The clients below read it at each call, so one pool of channels
# serves every user while each call carries its own user's token.
_token: contextvars.ContextVar[str] = contextvars.ContextVar("ff_dashboard_token", default="")


class NoScheduler(Exception):
    """No scheduler is registered alive with mgmtd."""


class ClusterReader:
    """Channels to mgmtd and the scheduler, shared by every user; ``as_user`` gives one user's view."""

    def __init__(self, mgmtd_addresses: list[str], *, timeout_s: float = 5.0) -> None:
        self.mgmtd = MgmtdClient(mgmtd_addresses, token=_token.get, timeout_s=timeout_s)
        self.rpc = RpcClient(token=_token.get, timeout_s=timeout_s)
        self.schedulers = ClientPool(SchedulerServiceClient, self.rpc)

    def as_user(self, token: str) -> UserView:
        """The reads ``token``'s user may make."""
        return UserView(self, token)

    async def close(self) -> None:
        """Close the clients of mgmtd and the schedulers."""
        await self.mgmtd.close()
        await self.schedulers.close()


class UserView:
    """What one user may read: every call goes with their token.

    Raises (every method): RpcError as the service answered; NoScheduler.
    """

    def __init__(self, reader: ClusterReader, token: str) -> None:
        self._reader = reader
        self._user_token = token

    async def _as_user(self, call: Callable[[], Awaitable[T]]) -> T:
        reset = _token.set(self._user_token)
        try:
            return await call()
        finally:
            _token.reset(reset)

    async def routing(self) -> mgmtd_pb2.RoutingInfo:
        """The routing info from mgmtd; RpcError when mgmtd refuses or cannot be reached."""
        request = mgmtd_pb2.GetRoutingInfoRequest()
        resp = await self._as_user(lambda: self._reader.mgmtd.mgmtd.get_routing_info(request))
        return resp.routing_info

    async def _scheduler(self) -> SchedulerServiceClient:
        address = await self._as_user(lambda: self._reader.mgmtd.service_address(common_pb2.NODE_TYPE_SCHEDULER))
        if not address:
            raise NoScheduler("no scheduler is registered with mgmtd")
        return self._reader.schedulers.get(address)

    async def nodes(self) -> list[spb.Node]:
        """The scheduler's compute nodes; NoScheduler when none is alive, RpcError when the call fails."""
        scheduler = await self._scheduler()
        resp = await self._as_user(lambda: scheduler.list_nodes(spb.ListNodesRequest()))
        return list(resp.nodes)

    async def tasks(self, *, all_users: bool) -> list[spb.Task]:
        """The user's tasks (every user's with ``all_users``, admins only), newest first, at most MAX_TASKS."""
        scheduler, token = await self._scheduler(), ""
        found: list[spb.Task] = []
        while len(found) < MAX_TASKS:
            request = spb.ListTasksRequest(all_users=all_users, page_size=MAX_TASKS, page_token=token)
            resp = await self._as_user(partial(scheduler.list_tasks, request))
            found.extend(resp.tasks)
            token = resp.next_page_token
            if not token:
                break
        return found[:MAX_TASKS]

    async def task(self, task_id: int) -> spb.Task:
        """One task with its runs; RpcError NOT_FOUND for a task the user may not see."""
        scheduler = await self._scheduler()
        request = spb.GetTaskRequest(task_id=task_id, include_runs=True)
        resp = await self._as_user(lambda: scheduler.get_task(request))
        return resp.task

    async def log_tail(self, task_id: int, node_rank: int, local_rank: int, tail_bytes: int) -> bytes:
        """The last ``tail_bytes`` of a rank's log in the task's latest run (not followed)."""
        scheduler = await self._scheduler()
        request = spb.StreamLogsRequest(
            task_id=task_id, node_rank=node_rank, local_rank=local_rank, tail_bytes=min(tail_bytes, MAX_LOG_BYTES)
        )

        async def read() -> bytes:
            data = bytearray()
            async for chunk in scheduler.stream_logs(request, timeout_s=10.0):
                data += chunk.data
                if chunk.end_of_log or len(data) >= MAX_LOG_BYTES:
                    break
            return bytes(data[-MAX_LOG_BYTES:])

        return await self._as_user(read)
