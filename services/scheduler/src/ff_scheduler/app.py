"""The async driver of the scheduler: the tick loop, the agents' orders, and mgmtd's leases and removals of nodes.

A tick is one serializable transaction that loads the snapshot, plans with ``core.tick`` and applies the plan;
the agents' orders are reconciled with what active runs want.

Orders are derived from state, not from transitions: every tick, each node of an active run that has
not yet shown the wanted effect in its reports gets the order (start, suspend or stop) again after
``order_resend_interval_s``. Agents treat orders as idempotent per run id, so a scheduler restarted
mid-run re-sends what may have been lost and nothing runs twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
from sqlalchemy.orm import Session

from ff_cluster import MgmtdClient
from ff_rpc import RpcError
from ff_scheduler.agents import AgentPool
from ff_scheduler.core.model import NodePhase, RunState
from ff_scheduler.core.policy import LifecyclePolicy, SchedulingPolicy
from ff_scheduler.core.tick import TickPlan, plan_tick
from ff_scheduler.store import ops, run_tokens
from ff_scheduler.store.ticks import (
    Applied,
    NodeOrder,
    OrderRows,
    TaskCacheUpdate,
    apply_plan,
    order_rows,
    wanted_orders,
)
from ff_scheduler.txn import Transactions
from fireflyer.agent.v1 import agent_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2
from fireflyer.scheduler.v1 import scheduler_pb2

logger = logging.getLogger(__name__)

RUN_TOKEN_TTL_S = 7 * 24 * 3600.0
# Waiting tasks read at start from which on the objects alive are frozen (``gc.freeze``; see ``Scheduler.load``).
FREEZE_AT_TASKS = 10_000
# Orders to agents in flight at most (see ``Scheduler._send_all``).
ORDER_SENDERS = 128


@dataclass(frozen=True, kw_only=True)
class DriverOptions:
    """The driver's timing (seconds) and the port runs' masters listen on."""

    tick_interval_s: float
    master_port: int
    order_resend_interval_s: float
    term_grace_s: float = 10.0
    drain_timeout_s: float = 10.0


@dataclass(frozen=True)
class TickStats:
    """What one tick did and how long it took (seconds), for logs and the service's metrics."""

    duration_s: float
    num_tasks: int
    num_started: int
    num_run_changes: int
    num_orders: int


class Scheduler:
    """The scheduler's state machine driver (one instance per database)."""

    def __init__(
        self,
        store: Transactions,
        sched: SchedulingPolicy,
        life: LifecyclePolicy,
        options: DriverOptions,
        agents: AgentPool,
        mgmtd: MgmtdClient | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.sched = sched
        self.life = life
        self.options = options
        self.agents = agents
        self.mgmtd = mgmtd
        self._clock = clock
        self._wake = asyncio.Event()
        self._sent: dict[tuple[int, int, str], float] = {}
        self._inflight: set[asyncio.Task[None]] = set()
        # One token per run, issued once even when the start orders of its nodes go out together.
        # run id -> (token id, token) of the run's token, revoked once the run has ended.
        self._run_tokens: dict[int, asyncio.Future[tuple[str, str]]] = {}
        self._revoking: set[str] = set()  # token ids whose revocation is in flight
        self.last_tick: TickStats | None = None

    def wake(self) -> None:
        """Run a tick soon (a report or a user action changed something)."""
        self._wake.set()

    def now(self) -> float:
        """The scheduler's clock (epoch seconds; tests give their own)."""
        return self._clock()

    # ---- the tick ----

    async def tick(self) -> TickStats:
        """One tick: plan and apply in one transaction, then send the orders due and revoke ended runs' tokens."""
        started = time.perf_counter()
        now = self.now()

        cache = self.store.tasks

        def txn(s: Session) -> tuple[int, TickPlan, Applied, list[NodeOrder], list[tuple[str, int]], TaskCacheUpdate]:
            with _collector_paused():
                snap, update = cache.load(s, now)
                plan = plan_tick(snap, self.sched, self.life)
                applied = apply_plan(s, plan, now, self.options.master_port) if not plan.empty else Applied()
                ended = run_tokens.ended(s) if self.mgmtd is not None else []
                return len(snap.tasks), plan, applied, wanted_orders(s), ended, update

        try:
            num_tasks, plan, applied, orders, ended_tokens, update = await self.store.arun(txn)
        except BaseException:
            cache.invalidate()  # whether it committed is unknown: the next tick reads every task
            raise
        cache.commit(update, plan, applied)
        num_started, num_changes = applied.num_started, applied.num_run_changes
        num_sent = self._reconcile(orders)
        self._forget_ended_runs({o.run_id for o in orders})
        self._revoke(ended_tokens)
        stats = TickStats(time.perf_counter() - started, num_tasks, num_started, num_changes, num_sent)
        if num_started or num_changes:
            logger.info(
                "tick",
                extra={
                    "num_started": num_started,
                    "num_run_changes": num_changes,
                    "num_orders": num_sent,
                    "tick_ms": round(stats.duration_s * 1000, 1),
                },
            )
        self.last_tick = stats
        return stats

    async def load(self) -> None:
        """Read every unfinished task into the tick's cache (at start: the ticks then read only what changed)."""
        cache = self.store.tasks
        update = await self.store.arun(lambda s: cache.load(s, self.now())[1], read_only=True)
        cache.commit(update)
        if len(update.waiting) >= FREEZE_AT_TASKS:
            # The tasks just read live as long as they wait. Frozen (with everything else alive now), the cyclic
            # collector's full passes skip them: at 100,000 tasks those took 0.3-0.4 s of each of the first ticks.
            # Tasks are acyclic: those that stop waiting are still freed by their reference counts.
            gc.freeze()

    async def run(self, stop: asyncio.Event) -> None:
        """Load, tick until ``stop`` (and follow mgmtd's node leases), then let orders in flight finish (bounded)."""
        started = time.perf_counter()
        try:
            await self.load()
            logger.info("tasks loaded", extra={"load_ms": round((time.perf_counter() - started) * 1000, 1)})
        except Exception:
            logger.exception("loading the tasks failed (the first tick reads them)")
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._tick_loop(stop))
            if self.mgmtd is not None:
                tg.create_task(self._lease_loop(stop))
        # Orders in flight may be inside a store transaction (in a thread): let them finish (each has a
        # deadline) so no connection is still out when the store is disposed.
        if self._inflight:
            await asyncio.wait(list(self._inflight), timeout=self.options.drain_timeout_s)

    async def _tick_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self._wake.clear()
            try:
                await self.tick()
            except Exception:
                logger.exception("tick failed")
            waiter = asyncio.ensure_future(self._wake.wait())
            stopper = asyncio.ensure_future(stop.wait())
            await asyncio.wait(
                {waiter, stopper}, timeout=self.options.tick_interval_s, return_when=asyncio.FIRST_COMPLETED
            )
            waiter.cancel()
            stopper.cancel()

    # ---- mgmtd leases ----

    async def _lease_loop(self, stop: asyncio.Event) -> None:
        assert self.mgmtd is not None
        while not stop.is_set():
            try:
                watch = self.mgmtd.watch_routing()
                async for info in _until(stop, watch):
                    await self._note_routing(info)
            except RpcError as err:
                logger.warning("watching mgmtd failed: %s", err)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=1.0)

    async def _note_routing(self, info: mgmtd_pb2.RoutingInfo) -> None:
        alive = {n.node_id for n in info.nodes if n.status == mgmtd_pb2.NODE_STATUS_ALIVE}
        dead = {n.node_id for n in info.nodes if n.status == mgmtd_pb2.NODE_STATUS_DEAD}
        changed, unlisted = await self.store.arun(
            lambda s: (ops.set_online(s, alive, dead), ops.node_ids_not_in(s, alive | dead))
        )
        if changed:
            logger.warning("agent nodes changed liveness", extra={"node_ids": changed})
            self.wake()
        if unlisted:
            await self._forget_removed(unlisted)

    async def _forget_removed(self, unlisted: list[int]) -> None:
        """Forget the nodes mgmtd removed (RemoveNode) among ``unlisted`` (registered here, not in a routing info).

        That routing info may predate an agent that registered with mgmtd and then here since: only the
        nodes also missing from mgmtd's current routing, asked after ``unlisted`` was read, are gone for good
        (mgmtd never drops a node but by RemoveNode, and never reuses its id).
        """
        assert self.mgmtd is not None
        current = (await self.mgmtd.mgmtd.get_routing_info(mgmtd_pb2.GetRoutingInfoRequest())).routing_info
        listed = {n.node_id for n in current.nodes}
        removed = [n for n in unlisted if n not in listed]
        if not removed:
            return
        had = await self.store.arun(lambda s: ops.forget_nodes(s, removed))
        for node_id, task_ids in had.items():
            logger.warning(
                "node %d was removed from the cluster: forgotten%s",
                node_id,
                f"; its runs of tasks {task_ids} end as on a lost node" if task_ids else "",
                extra={"node_id": node_id},
            )
        self.wake()

    # ---- orders to agents ----

    def _reconcile(self, orders: list[NodeOrder]) -> int:
        now = time.monotonic()
        live: set[tuple[int, int, str]] = set()
        due: list[tuple[str, NodeOrder]] = []
        for order in orders:
            kind = _wanted(order)
            if kind is None or not order.online:
                continue
            key = (order.run_id, order.node_id, kind)
            live.add(key)
            if now - self._sent.get(key, -1e18) < self.options.order_resend_interval_s:
                continue
            self._sent[key] = now
            due.append((kind, order))
        self._sent = {k: v for k, v in self._sent.items() if k in live}
        if due:
            self._spawn(self._send_all(due))
        return len(due)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    async def _send_all(self, due: list[tuple[str, NodeOrder]]) -> None:
        """Read what the orders need in one transaction (the first tick orders thousands), then send them per agent.

        ``ORDER_SENDERS`` senders each take one agent's orders at a time and send them one after the other: the
        first tick's 10,000 start orders are not 10,000 tasks on the event loop, and no more calls are in flight
        than senders. Each run's start request is built once and copied per node.
        """
        starts = [o for kind, o in due if kind == "start"]
        rows = await self.store.arun(
            lambda s: order_rows(
                s, {o.run_id for _, o in due}, {o.task_id for o in starts}, {o.node_id for o in starts}
            ),
            read_only=True,
        )
        by_agent: dict[str, list[tuple[str, NodeOrder]]] = defaultdict(list)
        for kind, order in due:
            if order.run_id in rows.runs:
                by_agent[order.agent_address].append((kind, order))
        batches = deque(by_agent.values())
        starting: dict[int, agent_pb2.StartRunRequest] = {}
        sent: Counter[str] = Counter()

        async def sender() -> None:
            while batches:
                for kind, order in batches.popleft():
                    try:
                        if await self._send(kind, order, rows, starting):
                            sent[kind] += 1
                    except Exception:
                        logger.exception("%s order for run %d to node %d", kind, order.run_id, order.node_id)

        await asyncio.gather(*(sender() for _ in range(min(ORDER_SENDERS, len(batches)))))
        if sent:
            logger.info("orders sent", extra={f"num_{kind}": n for kind, n in sorted(sent.items())})

    async def _send(
        self, kind: str, order: NodeOrder, rows: OrderRows, starting: dict[int, agent_pb2.StartRunRequest]
    ) -> bool:
        """Send one order; whether the agent took it (a refusal or an unreachable agent is logged)."""
        run = rows.runs[order.run_id]
        try:
            if kind == "start":
                template = starting.get(run.run_id)
                if template is None:
                    template = starting[run.run_id] = await self._start_request(run, rows.tasks[order.task_id])
                request = agent_pb2.StartRunRequest()
                request.CopyFrom(template)
                request.node_rank = order.node_rank
                request.device_indices.extend(rows.device_indices[order.node_id])
                await self.agents.start_run(order.agent_address, request)
            elif kind == "suspend":
                await self.agents.suspend_run(
                    order.agent_address,
                    agent_pb2.SuspendRunRequest(
                        task_id=order.task_id,
                        run_id=order.run_id,
                        ack_window_s=run.ack_window_s,
                        grace_s=run.grace_s,
                        term_grace_s=self.options.term_grace_s,
                    ),
                )
            else:
                await self.agents.stop_run(
                    order.agent_address,
                    agent_pb2.StopRunRequest(
                        task_id=order.task_id,
                        run_id=order.run_id,
                        term_grace_s=self.options.term_grace_s,
                        reason=scheduler_pb2.RunEndReason.ValueType(run.stop_reason),
                    ),
                )
        except RpcError as err:
            logger.warning("%s order for run %d to node %d failed: %s", kind, order.run_id, order.node_id, err)
            return False
        logger.debug("order sent", extra={"order": kind, "run_id": order.run_id, "node_id": order.node_id})
        return True

    async def _start_request(self, run: Any, task: Any) -> agent_pb2.StartRunRequest:
        """A run's start order without what differs per node (its rank and devices)."""
        spec = task.spec
        master_ip, _, port = run.master_address.rpartition(":")
        return agent_pb2.StartRunRequest(
            task_id=task.task_id,
            run_id=run.run_id,
            run_index=run.run_index,
            user_name=task.user_name,
            uid=task.uid,
            argv=spec["argv"],
            env=spec.get("env", {}),
            working_dir=spec.get("working_dir", ""),
            num_nodes=len(run.node_ids),
            master_ip=master_ip,
            master_port=int(port),
            ranks_per_node=int(spec.get("ranks_per_node", 0)),
            whole_life_state=run.start_whole_life_state,
            token=await self._run_token(run.run_id, task.user_name),
            image=spec.get("image", ""),
            priority=run.priority,
        )

    async def _run_token(self, run_id: int, user_name: str) -> str:
        """A token of the task's owner for its ranks, issued by mgmtd once per run and revoked when it has ended.

        Once per run per scheduler process; what the ranks hold works only while they run. Each issued token is
        in the run-token ledger (``store.run_tokens``) before it is handed out, so one issued before a
        restart of the scheduler is revoked all the same.
        """
        if self.mgmtd is None:
            return ""
        issued = self._run_tokens.get(run_id)
        if issued is None or (issued.done() and (issued.cancelled() or issued.exception() or not issued.result()[1])):
            issued = asyncio.ensure_future(self._issue_run_token(run_id, user_name))
            self._run_tokens[run_id] = issued
        return (await asyncio.shield(issued))[1]

    async def _issue_run_token(self, run_id: int, user_name: str) -> tuple[str, str]:
        """The token's id and secret, or empty strings when mgmtd refused or the ledger could not record it.

        On empty strings the next start order asks again.
        """
        assert self.mgmtd is not None
        try:
            resp = await self.mgmtd.identity.issue_token(
                mgmtd_pb2.IssueTokenRequest(
                    user_name=user_name, description=f"scheduler run {run_id}", ttl_s=RUN_TOKEN_TTL_S
                ),
            )
        except RpcError as err:
            logger.warning("cannot issue a token for run %d: %s", run_id, err)
            return "", ""
        token_id = str(resp.token_info.token_id)
        try:
            await self.store.arun(lambda s: run_tokens.record(s, token_id, run_id, time.time()))
        except Exception:
            logger.exception("cannot record the token of run %d; revoking it", run_id)
            await self._revoke_token(token_id, run_id)
            return "", ""
        return token_id, str(resp.token)

    def _forget_ended_runs(self, active_run_ids: set[int]) -> None:
        """Drop the cached tokens of runs no longer active (the ledger revokes them)."""
        for run_id in [r for r in self._run_tokens if r not in active_run_ids]:
            del self._run_tokens[run_id]

    def _revoke(self, ended: list[tuple[str, int]]) -> None:
        """Revoke the ledger's tokens of ended runs (each once at a time), and drop them from the ledger."""
        for token_id, run_id in ended:
            if token_id in self._revoking:
                continue
            self._revoking.add(token_id)
            self._spawn(self._revoke_and_forget(token_id, run_id))

    async def _revoke_and_forget(self, token_id: str, run_id: int) -> None:
        try:
            if await self._revoke_token(token_id, run_id):
                await self.store.arun(lambda s: run_tokens.forget(s, [token_id]))
        except Exception:
            logger.exception("cannot drop the revoked token of run %d from the ledger", run_id)
        finally:
            self._revoking.discard(token_id)

    async def _revoke_token(self, token_id: str, run_id: int) -> bool:
        """Whether the token is revoked (or was already gone); False to try again at a later tick."""
        assert self.mgmtd is not None
        try:
            await self.mgmtd.identity.revoke_token(mgmtd_pb2.RevokeTokenRequest(token_id=token_id))
        except RpcError as err:
            if err.code is grpc.StatusCode.NOT_FOUND:
                return True
            logger.warning("cannot revoke the token of ended run %d: %s", run_id, err)
            return False
        return True


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off while a tick reads, plans and applies, on again after.

    A tick allocates ~100,000 objects that live until it ends (a TaskChange per queued task at the first); with the
    waiting tasks frozen (``Scheduler.load``) the collector's full passes, each over everything alive since, ran
    several times in such a tick (~0.1 s of the first tick's CPU at 100,000 tasks). After the tick most of those
    objects are freed by their reference counts, and the collector's next pass finds the rest.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _wanted(order: NodeOrder) -> str | None:
    if order.phase is NodePhase.EXITED:
        return None
    if order.run_state in (RunState.STARTING, RunState.RUNNING):
        return "start" if order.phase is NodePhase.UNKNOWN else None
    if order.run_state is RunState.SUSPENDING:
        return "suspend"
    return "stop"


async def _until(stop: asyncio.Event, stream: Any) -> Any:
    """Items of an async iterator until ``stop`` is set."""
    it = stream.__aiter__()
    while not stop.is_set():
        nxt = asyncio.ensure_future(it.__anext__())
        stopper = asyncio.ensure_future(stop.wait())
        done, _ = await asyncio.wait({nxt, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if nxt not in done:
            nxt.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await nxt
            return
        try:
            yield nxt.result()
        except StopAsyncIteration:
            return
