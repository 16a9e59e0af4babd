"""Async client of the scheduler (SchedulerService) for the SDK and the CLI.

One typed error (ff_rpc.RpcError with ``.code`` and ``.details``), deadlines, retries of idempotent calls. Every
method raises RpcError with the scheduler's status when the call fails.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Sequence

import grpc

from ff_cluster import MgmtdClient
from ff_rpc import ChannelInvoker, ChannelPool, RpcClient, RpcError
from fireflyer.common.v1 import common_pb2
from fireflyer.scheduler.v1 import scheduler_pb2 as pb
from fireflyer.scheduler.v1.scheduler_client import SchedulerServiceClient
from hfai.config import HfaiConfig


class SchedulerApi:
    """The scheduler at ``server``, or (``server`` empty) the one mgmtd at ``mgmtd`` names, found at the first call."""

    def __init__(self, server: str, token: str, timeout_s: float = 10.0, *, mgmtd: Sequence[str] = ()) -> None:
        if not server and not mgmtd:
            raise ValueError("a scheduler address or mgmtd addresses are needed")
        self._server, self._mgmtd, self._token = server, list(mgmtd), token
        self._channels = ChannelPool()
        self._rpc = RpcClient(token=token, timeout_s=timeout_s)
        self._client_: SchedulerServiceClient | None = None

    @classmethod
    def from_config(cls, cfg: HfaiConfig) -> SchedulerApi:
        """The client of the cluster ``cfg`` names, with its token; raises ConfigError when it names none."""
        cfg.require()
        return cls(cfg.server, cfg.token, mgmtd=cfg.mgmtd_addresses())

    async def _client(self) -> SchedulerServiceClient:
        if self._client_ is None:
            if not self._server:
                self._server = await self._find_scheduler()
            self._client_ = SchedulerServiceClient(ChannelInvoker(self._rpc, self._channels, self._server))
        return self._client_

    async def _find_scheduler(self) -> str:
        mgmtd = MgmtdClient(self._mgmtd, token=self._token)
        try:
            address = await mgmtd.service_address(common_pb2.NODE_TYPE_SCHEDULER)
        finally:
            await mgmtd.close()
        if not address:
            raise RpcError(grpc.StatusCode.UNAVAILABLE, "mgmtd knows no alive scheduler")
        return address

    async def __aenter__(self) -> SchedulerApi:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Closes the channel to the scheduler (``async with`` does it on exit)."""
        await self._channels.close()

    async def submit(self, spec: pb.TaskSpec, request_id: str = "") -> pb.Task:
        """Queues a task; the same ``request_id`` sent again by the same user returns the first task, not a new one."""
        return (await (await self._client()).submit_task(pb.SubmitTaskRequest(spec=spec, request_id=request_id))).task

    async def list(
        self, *, states: Sequence[int] = (), name_contains: str = "", all_users: bool = False, page_size: int = 100
    ) -> builtins.list[pb.Task]:
        """The caller's tasks, newest first, at most ``page_size`` (``all_users``: anyone's, for admins).

        Only tasks in one of ``states`` (all when empty) whose name contains ``name_contains``.
        """
        request = pb.ListTasksRequest(name_contains=name_contains, all_users=all_users, page_size=page_size)
        request.states.extend(states)  # type: ignore[arg-type]
        return builtins.list((await (await self._client()).list_tasks(request)).tasks)

    async def get(self, task_id: int, include_runs: bool = False) -> pb.Task:
        """One task, with its runs' history when ``include_runs``."""
        request = pb.GetTaskRequest(task_id=task_id, include_runs=include_runs)
        return (await (await self._client()).get_task(request)).task

    async def stop(self, task_id: int) -> pb.Task:
        """Stops a task for good: its run (if any) is stopped and the task ends STOPPED."""
        return (await (await self._client()).stop_task(pb.StopTaskRequest(task_id=task_id))).task

    async def suspend(self, task_id: int) -> pb.Task:
        """Suspends a running task through the suspend protocol, to queue again; one not running is left as it is."""
        return (await (await self._client()).suspend_task(pb.SuspendTaskRequest(task_id=task_id))).task

    async def set_priority(self, task_id: int, level: int | None) -> pb.Task:
        """Sets a task's priority (None: automatic); the quota rules apply from the scheduler's next tick."""
        request = pb.SetTaskPriorityRequest(task_id=task_id, auto_priority=level is None)
        if level is not None:
            request.priority = level
        return (await (await self._client()).set_task_priority(request)).task

    async def logs(
        self, task_id: int, *, node_rank: int = 0, follow: bool = False, tail_bytes: int = 0
    ) -> AsyncIterator[bytes]:
        """The log of one node rank of the latest run, in chunks; ``follow`` keeps streaming until the run ends.

        ``tail_bytes`` > 0 starts that many bytes before the log's current end, else at its start.
        """
        request = pb.StreamLogsRequest(task_id=task_id, node_rank=node_rank, follow=follow, tail_bytes=tail_bytes)
        async for chunk in (await self._client()).stream_logs(request):
            yield chunk.data

    async def whoami(self) -> pb.WhoAmIResponse:
        """The caller, their quotas and current usage."""
        return await (await self._client()).who_am_i(pb.WhoAmIRequest())

    async def nodes(self, group: str = "") -> builtins.list[pb.Node]:
        """The nodes (of ``group``; empty: all) with their devices and states."""
        return builtins.list((await (await self._client()).list_nodes(pb.ListNodesRequest(node_group=group))).nodes)

    async def set_quota(self, user: str, level: int, group: str, max_nodes: int) -> pb.Quota:
        """Sets the node quota of ``user`` at priority ``level`` in ``group`` (admins); ``max_nodes`` 0 removes it."""
        quota = pb.Quota(user_name=user, priority=level, node_group=group, max_nodes=max_nodes)
        return (await (await self._client()).set_quota(pb.SetQuotaRequest(quota=quota))).quota

    async def quotas(self, user: str = "") -> builtins.list[pb.Quota]:
        """The quotas with their usage, of ``user`` (empty: everyone's); admins only (users: ``whoami``)."""
        return builtins.list((await (await self._client()).list_quotas(pb.ListQuotasRequest(user_name=user))).quotas)

    async def validate(self, node_ids: builtins.list[int], checks: builtins.list[str]) -> builtins.list[int]:
        """Run the validator on nodes (admins); the nodes it was ordered on (idle ones)."""
        request = pb.ValidateNodesRequest(node_ids=node_ids, checks=checks)
        return builtins.list((await (await self._client()).validate_nodes(request)).node_ids)

    async def set_node_enabled(self, node_id: int, enabled: bool, reason: str = "") -> pb.Node:
        """Disables a node (admins; it goes to err_nodes and its runs are suspended) or enables it again."""
        request = pb.SetNodeEnabledRequest(node_id=node_id, enabled=enabled, reason=reason)
        return (await (await self._client()).set_node_enabled(request)).node
