"""Where the alert rules' facts come from: mgmtd, the scheduler and the collected series.

mgmtd gives nodes and targets, the scheduler running tasks and node validations, the collected series steps,
losses and storage use; each is read with the cluster token.

A source that cannot be read leaves its facts unknown (``Snapshot.known``), so the rules that need it are
not evaluated: an unreachable scheduler does not resolve the alerts about tasks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from ff_cluster import MgmtdClient
from ff_rpc import RpcClient, RpcError
from ff_rpc.client import ClientPool
from ff_telemetry.alerts.conditions import ClusterView, NodeFact, SeriesFact, TargetFact, TaskFact, ValidationFact
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2
from fireflyer.scheduler.v1 import scheduler_pb2
from fireflyer.scheduler.v1.scheduler_client import SchedulerServiceClient

logger = logging.getLogger(__name__)

STEP_METRIC = "hfai_step"
LOSS_METRIC = "hfai_loss"
TARGET_FREE_METRIC = "ff_storage_target_free_bytes"
TARGET_CAPACITY_METRIC = "ff_storage_target_capacity_bytes"


class Source(StrEnum):
    """A place facts are read from; a rule is evaluated only when all of its sources were read."""

    MGMTD = "mgmtd"
    SCHEDULER = "scheduler"
    METRICS = "metrics"


class MetricReader(Protocol):
    """The collector's own series, as the alert rules read them."""

    async def series(self, name: str, since: float, until: float) -> Sequence[SeriesFact]:
        """Every series of ``name`` with its samples in [since, until], oldest first."""
        ...


@dataclass(frozen=True)
class Snapshot:
    """The facts read at once, and which sources could be read."""

    view: ClusterView
    known: frozenset[Source]


def _enum_word(name: str, prefix: str) -> str:
    return name.removeprefix(prefix).lower()


class ClusterSources:
    """Reads the facts from mgmtd, the scheduler (found through mgmtd) and the collector's own series."""

    def __init__(self, mgmtd: MgmtdClient, token: str, metrics: MetricReader, *, timeout_s: float = 5.0) -> None:
        self.mgmtd = mgmtd
        self.metrics = metrics
        self._rpc = RpcClient(token=token, timeout_s=timeout_s)
        self._schedulers = ClientPool(SchedulerServiceClient, self._rpc)

    async def close(self) -> None:
        """Close the channels to the scheduler."""
        await self._schedulers.close()

    async def snapshot(self, now: float, window_s: float) -> Snapshot:
        """Everything the rules look at, read at once; ``window_s``: how much history of the series."""
        routing, scheduler, metrics = await asyncio.gather(
            self._routing(), self._scheduler(), self._series(now - window_s, now)
        )
        known = {
            s for s, got in ((Source.MGMTD, routing), (Source.SCHEDULER, scheduler), (Source.METRICS, metrics)) if got
        }
        nodes, targets = routing or ((), ())
        tasks, validations = scheduler or ((), ())
        steps, losses, used = metrics or ((), (), ())
        view = ClusterView(
            now=now,
            nodes=nodes,
            targets=targets,
            tasks=tasks,
            validations=validations,
            steps=steps,
            losses=losses,
            storage_used=used,
        )
        return Snapshot(view, frozenset(known))

    async def _routing(self) -> tuple[list[NodeFact], list[TargetFact]] | None:
        try:
            resp = await self.mgmtd.mgmtd.get_routing_info(mgmtd_pb2.GetRoutingInfoRequest())
        except RpcError as err:
            logger.warning("alerts: mgmtd's routing info could not be read: %s", err)
            return None
        info = resp.routing_info
        nodes = [
            NodeFact(
                node_id=n.node_id,
                node_type=_enum_word(common_pb2.NodeType.Name(n.node_type), "NODE_TYPE_"),
                hostname=n.hostname,
                alive=n.status != mgmtd_pb2.NODE_STATUS_DEAD,
            )
            for n in info.nodes
        ]
        targets = [
            TargetFact(
                target_id=t.target_id,
                node_id=t.node_id,
                chain_id=chain.chain_id,
                state=_enum_word(mgmtd_pb2.PublicTargetState.Name(t.public_state), "PUBLIC_TARGET_STATE_"),
            )
            for chain in info.chains
            for t in chain.targets
        ]
        return nodes, targets

    async def _scheduler(self) -> tuple[list[TaskFact], list[ValidationFact]] | None:
        try:
            address = await self.mgmtd.service_address(common_pb2.NODE_TYPE_SCHEDULER)
            if not address:
                return None
            scheduler = self._schedulers.get(address)
            tasks, nodes = await asyncio.gather(
                self._running_tasks(scheduler), scheduler.list_nodes(scheduler_pb2.ListNodesRequest())
            )
        except RpcError as err:
            logger.warning("alerts: the scheduler's tasks and nodes could not be read: %s", err)
            return None
        facts = [
            TaskFact(t.task_id, t.user_name, t.current_run.run_id, t.current_run.started_at)
            for t in tasks
            if t.current_run.started_at > 0
        ]
        validations = [
            ValidationFact(
                n.node_id,
                n.hostname,
                n.last_validation.passed,
                tuple(c.name for c in n.last_validation.checks if not c.passed),
            )
            for n in nodes.nodes
            if n.last_validation.finished_at > 0
        ]
        return facts, validations

    async def _running_tasks(self, scheduler: SchedulerServiceClient) -> list[scheduler_pb2.Task]:
        """Every running task of every user, a page of 1,000 at a time."""
        tasks: list[scheduler_pb2.Task] = []
        token = ""
        while True:
            request = scheduler_pb2.ListTasksRequest(
                states=[scheduler_pb2.TASK_STATE_RUNNING], all_users=True, page_size=1000, page_token=token
            )
            resp = await scheduler.list_tasks(request)
            tasks += resp.tasks
            token = resp.next_page_token
            if not token:
                return tasks

    async def _series(
        self, since: float, until: float
    ) -> tuple[Sequence[SeriesFact], Sequence[SeriesFact], list[tuple[Mapping[str, str], float]]] | None:
        try:
            steps, losses, free, capacity = await asyncio.gather(
                *(
                    self.metrics.series(n, since, until)
                    for n in (STEP_METRIC, LOSS_METRIC, TARGET_FREE_METRIC, TARGET_CAPACITY_METRIC)
                )
            )
        except Exception:
            logger.exception("alerts: the collected series could not be read")
            return None
        return steps, losses, storage_used(free, capacity)


def storage_used(free: Sequence[SeriesFact], capacity: Sequence[SeriesFact]) -> list[tuple[Mapping[str, str], float]]:
    """Used share of each target's file system: 1 - its last free bytes over its last capacity."""
    capacity_of = {s.labels.get("target_id"): s.points[-1][1] for s in capacity if s.points}
    out = []
    for s in free:
        total = capacity_of.get(s.labels.get("target_id"), 0.0)
        if s.points and total > 0:
            out.append((s.labels, 1.0 - s.points[-1][1] / total))
    return out
