"""The agent's async driver: scheduler membership, the runs' poll loop, the validator and hang detection.

Membership is registering with the scheduler and reporting runs to it. One ``Agent`` per process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass

from ff_agent import devices as node_devices
from ff_agent import procs
from ff_agent.config import AgentSettings
from ff_agent.core.errors import InvalidRequest
from ff_agent.core.failures import Failure, FailureClass
from ff_agent.core.hang import Hang, RankProgress, lagging_ranks, stopped_hangs, track_stopped
from ff_agent.core.launch import Owner, StartOrder, ranks_user
from ff_agent.link import LINK_ERRORS, SchedulerLink
from ff_agent.runs import NodeRuns, Run
from ff_agent.validator import Validator
from ff_rpc import TokenValidator, Unauthenticated
from fireflyer.scheduler.v1 import scheduler_pb2 as pb
from hfreduce import query_status

logger = logging.getLogger(__name__)

RETRY_S = 0.5
PRUNE_EVERY_S = 60.0
PROGRESS_TIMEOUT_S = 2.0


@dataclass(kw_only=True)
class NodeIdentity:
    """What the agent tells the scheduler this node is: its name, its devices and where its AgentService listens."""

    hostname: str
    devices: list[node_devices.DeviceInfo]
    # host:port of this agent's AgentService (known once the server is bound).
    address: str = ""


class Agent:
    """The node agent: launches and supervises runs, keeps the scheduler informed, validates the node.

    Every method runs on the one event loop; the ``*_loop`` coroutines are the background tasks ``server.main``
    starts, each returning when ``stop`` is set.
    """

    def __init__(
        self,
        settings: AgentSettings,
        identity: NodeIdentity,
        runs: NodeRuns,
        link: SchedulerLink,
        validator: Validator,
        tokens: TokenValidator | None = None,
    ) -> None:
        self.settings = settings
        self.tokens = tokens
        # Resolved at start (``auto`` becomes one of the two); see server.ranks_run_as_at_start.
        self.ranks_run_as = settings.ranks_run_as
        self.identity = identity
        self.runs = runs
        self.link = link
        self.validator = validator
        self.node_id = 0
        self.registered = asyncio.Event()
        self.last_validation: pb.Validation | None = None
        self._report_interval_s = settings.report_interval_s
        self._progress: dict[int, tuple[float, list[RankProgress]]] = {}
        # run id -> local rank -> when its process was first seen stopped (state T), while it stays so
        self._stopped: dict[int, dict[int, float]] = {}
        runs.node_id_of = lambda: self.node_id

    # ---- runs ----

    async def start_run(self, order: StartOrder) -> Run:
        """Check the order, learn whose its token is, and launch the ranks as that user (idempotent per run id).

        The identity registry says whose the token is. Nothing is launched when any of it fails.

        Raises:
            InvalidRequest: the order is malformed, or the token is refused or cannot be checked.
        """
        existing = self.runs.runs.get(order.run_id)
        if existing is not None:
            return existing
        launch = self.runs.check(order)
        owner = await self._owner(order.token)
        run_as = ranks_user(order.user_name, owner, mode=self.ranks_run_as, agent_uid=os.geteuid())
        return self.runs.launch(launch, run_as)

    async def _owner(self, token: str) -> Owner:
        if self.tokens is None:
            raise InvalidRequest("token: this agent has no identity registry to check it with")
        try:
            who = await self.tokens.validate(token)
        except Unauthenticated as exc:
            raise InvalidRequest(f"token: the identity registry refused it ({exc})") from None
        return Owner(uid=who.uid, name=who.name, gids=who.gids, is_cluster=who.is_cluster)

    # ---- registration and reports ----

    def _register_request(self) -> pb.RegisterNodeRequest:
        kind = {True: pb.DEVICE_KIND_CUDA_GPU, False: pb.DEVICE_KIND_CPU_SLOT}
        return pb.RegisterNodeRequest(
            node_id=self.node_id,
            hostname=self.identity.hostname,
            agent_address=self.identity.address,
            master_ip=self.settings.master_ip,
            devices=[
                pb.Device(index=d.index, kind=kind[d.gpu], name=d.name, memory_bytes=d.memory_bytes)
                for d in self.identity.devices
            ],
            num_cpus=node_devices.num_cpus(),
            memory_bytes=node_devices.memory_bytes(),
            zone=self.settings.zone,
            node_group=self.settings.node_group,
            runs=[r.report(self.node_id) for r in self.runs.active],
        )

    async def _register(self) -> None:
        resp = await self.link.register(self._register_request())
        self._report_interval_s = min(self.settings.report_interval_s, resp.report_interval_s or 1e9)
        self._stop_unwanted(resp.runs_to_stop)
        if not self.registered.is_set():
            logger.info("registered with the scheduler", extra={"node_id": self.node_id, "at": self.link.address})
        self.registered.set()

    def _stop_unwanted(self, keys: Iterable[pb.RunKey]) -> None:
        for key in keys:
            self.runs.stop(key.run_id, 0.0, "the scheduler no longer has this run on this node")

    async def report_loop(self, stop: asyncio.Event) -> None:
        """Register with the scheduler (again after any failed call), then report runs whenever they change.

        Also stops the runs the scheduler no longer places here and prunes old run folders.
        """
        connected = False
        last_prune = time.monotonic()
        while not stop.is_set():
            if not connected:
                try:
                    await self._register()
                    connected = True
                except LINK_ERRORS as err:
                    logger.debug("registering with the scheduler failed: %s", err)
                    await _sleep(stop, RETRY_S)
                    continue
            pending = [r for r in self.runs.runs.values() if not r.final_reported]
            if pending:
                final = [r for r in pending if r.exited]  # as sent: a run may exit during the call
                try:
                    resp = await self.link.report_runs([r.report(self.node_id) for r in pending])
                    for r in final:
                        r.final_reported = True
                    self._stop_unwanted(resp.runs_to_stop)
                except LINK_ERRORS as err:
                    logger.warning("reporting runs failed (will register again): %s", err)
                    connected = False
                    continue
            if time.monotonic() - last_prune > PRUNE_EVERY_S:
                self.runs.prune(self.settings.log_retention_s)
                last_prune = time.monotonic()
            await self.runs.wait_dirty(self._report_interval_s)

    async def poll_loop(self, stop: asyncio.Event) -> None:
        """Advance the runs (exits, SDK events, deadlines) every ``poll_interval_s``; a failing tick is logged."""
        while not stop.is_set():
            try:
                await self.runs.tick()
            except Exception:
                logger.exception("supervising runs failed")
            await _sleep(stop, self.settings.poll_interval_s)

    # ---- validator ----

    async def validate(self, checks: list[str]) -> pb.Validation:
        """Run the validator's ``checks`` (all when empty) and report the result to the scheduler (best effort)."""
        validation = await self.validator.run(checks)
        self.last_validation = validation
        try:
            await self.link.report_health(validation)
        except LINK_ERRORS as err:
            logger.warning("reporting node health failed: %s", err)
        return validation

    async def validator_loop(self, stop: asyncio.Event) -> None:
        """Validate the node every ``validator_interval_s`` (and at start if asked), only while it runs nothing."""
        interval = self.settings.validator_interval_s
        if interval <= 0 and not self.settings.validate_at_start:
            return
        await self.registered.wait()
        due = time.monotonic() + (0.0 if self.settings.validate_at_start else interval)
        while not stop.is_set():
            await _sleep(stop, max(0.0, due - time.monotonic()))
            if stop.is_set() or (interval <= 0 and not self.settings.validate_at_start):
                return
            if self.runs.active:
                due = time.monotonic() + 10.0  # busy: validate when the node is idle
                continue
            await self.validate([])
            if interval <= 0:
                return
            due = time.monotonic() + interval

    # ---- hang detection ----

    async def progress(self, run: Run) -> tuple[float, list[RankProgress]]:
        """The group's collective progress, from hfreduce's control server, as ``(sampled_at, ranks)``.

        The server is where the ranks said it is (a group formed through torch's store, as haiscale's DDP does,
        serves it on a free port), else the run's master. ``ranks`` is empty when it cannot be reached.
        """
        order = run.order
        try:
            addr, port = await asyncio.to_thread(control_address, run)
            status = await asyncio.to_thread(query_status, addr, port, PROGRESS_TIMEOUT_S)
            ranks = [RankProgress.from_status(e) for e in status]
        except (OSError, ValueError, KeyError, TypeError, ConnectionError):
            ranks = []
        sampled = (time.time(), ranks)
        self._progress[order.run_id] = sampled
        return sampled

    async def hang_loop(self, stop: asyncio.Event) -> None:
        """Mark a run failed (infrastructure, hang) when one of this node's ranks stays stopped or falls behind.

        A rank is hung when its process stays stopped for half of ``hang_threshold_s``, or when its collective
        progress trails the others' by ``hang_threshold_s``.
        """
        threshold = self.settings.hang_threshold_s
        while self.settings.hang_detection and not stop.is_set():
            await _sleep(stop, self.settings.hang_check_interval_s)
            active = list(self.runs.active)
            self._stopped = {r.order.run_id: self._stopped.get(r.order.run_id, {}) for r in active}
            for run in active:
                if run.stopping or run.suspend is not None or run.failure is not None:
                    continue
                mine = self._stopped_ranks(run, threshold / 2)
                now = time.time()
                if not mine:
                    now, ranks = await self.progress(run)
                    mine = [h for h in lagging_ranks(ranks, now, threshold) if h.node_rank == run.order.node_rank]
                if not mine:
                    continue
                hang = mine[0]
                logger.warning("%s", hang.message, extra={"run_id": run.order.run_id})
                run.failure = Failure(
                    failure_class=FailureClass.INFRASTRUCTURE,
                    local_rank=hang.local_rank,
                    exit_code=0,
                    signal=0,
                    failed_at=now,
                    message=hang.message,
                    hang=True,
                )
                await self.runs.mark_changed()

    def _stopped_ranks(self, run: Run, threshold_s: float) -> list[Hang]:
        """This node's ranks of ``run`` whose processes have stayed stopped for ``threshold_s``."""
        now = time.time()
        stopped = {r.local_rank for r in run.ranks if r.running and procs.stopped(r.proc.pid)}
        since = track_stopped(self._stopped.get(run.order.run_id, {}), stopped, now)
        self._stopped[run.order.run_id] = since
        return stopped_hangs(since, now, threshold_s, node_rank=run.order.node_rank, ranks_per_node=len(run.ranks))


def control_address(run: Run) -> tuple[str, int]:
    """The run's hfreduce control server as ``(host, port)``: the master host, at the port the ranks wrote.

    The host is the run's master (node rank 0's, where rank 0 serves it); the port is the one its ranks wrote (a
    group formed through torch's store serves it on a free port), else the master port.

    Only the port is taken from the file: the ranks write it as their user, and this agent (root, perhaps) must
    not be pointed at another host.
    """
    try:
        port = json.loads(run.collective_file.read_text())["port"]
    except (OSError, ValueError, KeyError, TypeError):
        return run.order.master_ip, run.order.master_port
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        return run.order.master_ip, run.order.master_port
    return run.order.master_ip, port


async def _sleep(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
