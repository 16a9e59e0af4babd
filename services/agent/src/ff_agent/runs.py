"""The runs of this node: start, watch, relay, suspend, stop, and log their ranks.

The agent starts ranks, watches them exit, relays what the task tells the SDK, enforces the suspend deadlines,
stops whole process trees, and merges the ranks' logs.

One ``NodeRuns`` per agent; ``tick()`` is called every ``poll_interval_s`` by the agent's loop and does
every periodic step of every run (a poll, not a process per run: cheap with a few runs per node).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import pwd
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from ff_agent import procs
from ff_agent.core.errors import InvalidRequest, NotFoundError
from ff_agent.core.failures import ErrorRecord, Failure, RankExit, root_cause
from ff_agent.core.launch import RUN_DIR_ENV, NodeFacts, RunAs, StartOrder, check_order, plan_ranks
from ff_agent.core.suspend import SuspendClock
from ff_agent.link import LINK_ERRORS, SchedulerLink
from ff_rpc import RpcError
from fireflyer.scheduler.v1 import scheduler_pb2 as pb
from hfai import runcontrol
from hfai.runcontrol import Event, RunControl

CHECKPOINT_REFUSALS = frozenset(
    {
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.INVALID_ARGUMENT,
    }
)

logger = logging.getLogger(__name__)

HOOK_DIR = str(Path(__file__).parent / "rank_hook")
PIDS_FILE = "pids.json"
NODE_LOG = "node.log"
LOG_TAIL_BYTES = 4096


@dataclass
class Rank:
    """One local rank's process and what the agent learned of it; ``exit_code`` is None while it runs."""

    local_rank: int
    proc: subprocess.Popen[bytes]
    log_path: Path
    error_path: Path
    started_at: float
    exit_code: int | None = None
    signal: int = 0
    exited_at: float = 0.0
    stopped_by_agent: bool = False
    error: ErrorRecord | None = None
    mux_offset: int = 0

    @property
    def running(self) -> bool:
        """Whether the rank's process has not been seen to exit (its children may outlive it)."""
        return self.exit_code is None

    def as_exit(self) -> RankExit:
        """How the rank ended, for root-cause analysis (reads the end of its log); only for an exited rank."""
        return RankExit(
            local_rank=self.local_rank,
            exit_code=self.exit_code or 0,
            signal=self.signal,
            exited_at=self.exited_at,
            stopped_by_agent=self.stopped_by_agent,
            error=self.error,
            log_tail=_tail(self.log_path),
        )


@dataclass
class Run:
    """One run's share on this node: its order, folder, ranks, and where it is in its life.

    Owned by ``NodeRuns``; only the event loop changes it.
    """

    order: StartOrder
    folder: Path
    control: RunControl
    ranks: list[Rank]
    phase: int = pb.NODE_RUN_PHASE_RUNNING
    suspend: SuspendClock | None = None
    suspend_stage: int = pb.SUSPEND_STAGE_NONE
    stop_started_at: float = 0.0
    term_grace_s: float = 0.0
    stop_why: str = ""
    failure: Failure | None = None
    exited_at: float = 0.0
    pending_events: list[Event] = field(default_factory=list)
    # Reported EXITED to the scheduler (then it leaves the periodic reports).
    final_reported: bool = False

    @property
    def key(self) -> tuple[int, int]:
        """``(task_id, run_id)``."""
        return self.order.task_id, self.order.run_id

    @property
    def collective_file(self) -> Path:
        """Where the ranks write their hfreduce group's control address (a group formed through a store)."""
        return collective_file(self.folder)

    @property
    def exited(self) -> bool:
        """Whether every process of the run is gone (its last report may still be pending)."""
        return self.phase == pb.NODE_RUN_PHASE_EXITED

    @property
    def stopping(self) -> bool:
        """Whether the agent has sent the run SIGTERM (by order, suspend deadline or agent shutdown)."""
        return self.stop_started_at > 0

    @property
    def sids(self) -> list[int]:
        """The ranks' session ids (each rank leads its own session, so sid = its pid)."""
        return [r.proc.pid for r in self.ranks]

    def log_path(self, local_rank: int | None) -> Path:
        """One rank's log file, or the node log (every rank's lines, prefixed) when ``local_rank`` is None.

        Raises:
            InvalidRequest: this node runs no such local rank.
        """
        if local_rank is None:
            return self.folder / NODE_LOG
        if not 0 <= local_rank < len(self.ranks):
            raise InvalidRequest(f"local_rank {local_rank}: this node runs local ranks 0..{len(self.ranks) - 1}")
        return self.ranks[local_rank].log_path

    def last_output_at(self) -> float:
        """When a rank last wrote to its log (epoch seconds), else when the last rank started: the watchdog's input."""
        times = [r.started_at for r in self.ranks]
        for r in self.ranks:
            with contextlib.suppress(OSError):
                times.append(r.log_path.stat().st_mtime)
        return max(times)

    def report(self, node_id: int) -> pb.RunReport:
        """The run's state as the scheduler takes it: phase, suspend stage, every rank and the root-cause failure."""
        last = self.last_output_at()
        report = pb.RunReport(
            task_id=self.order.task_id,
            run_id=self.order.run_id,
            node_rank=self.order.node_rank,
            phase=self.phase,  # type: ignore[arg-type]
            suspend_stage=self.suspend_stage,  # type: ignore[arg-type]
            reported_at=time.time(),
            ranks=[
                pb.RankStatus(
                    local_rank=r.local_rank,
                    pid=r.proc.pid,
                    state=pb.RANK_STATE_RUNNING if r.running else pb.RANK_STATE_EXITED,
                    exit_code=r.exit_code or 0,
                    signal=r.signal,
                    started_at=r.started_at,
                    exited_at=r.exited_at,
                    last_output_at=last,
                    error_summary=(f"{r.error.exc_type}: {r.error.message}" if r.error else "")[:1000],
                )
                for r in self.ranks
            ],
        )
        if self.failure is not None:
            f = self.failure
            report.failure.CopyFrom(
                pb.RunFailure(
                    failure_class=int(f.failure_class),  # type: ignore[arg-type]
                    node_id=node_id,
                    node_rank=self.order.node_rank,
                    local_rank=f.local_rank,
                    exit_code=f.exit_code,
                    signal=f.signal,
                    failed_at=f.failed_at,
                    message=f.message,
                    hang=f.hang,
                )
            )
        return report


@dataclass(frozen=True, kw_only=True)
class RunsOptions:
    """The settings ``NodeRuns`` needs (from ``AgentSettings``); ``base_env`` is the agent's own environment."""

    state_dir: Path
    term_grace_s: float
    python_executable: str
    base_env: dict[str, str]


def _refused_checkpoint(event: Event, err: Exception) -> bool:
    """Whether the scheduler checked and refused a checkpoint (no such manifest, another user's).

    Retrying cannot help, and the events after it (go_suspend) must not wait behind it.
    """
    return event.kind == runcontrol.CHECKPOINT and isinstance(err, RpcError) and err.code in CHECKPOINT_REFUSALS


class NodeRuns:
    """Every run on this node, and the operations the servicer and the loops call."""

    def __init__(self, options: RunsOptions, node: NodeFacts, link: SchedulerLink) -> None:
        self.options = options
        self.node = node
        self.link = link
        self.runs: dict[int, Run] = {}
        self.changed = asyncio.Condition()
        self._dirty = asyncio.Event()
        self.runs_dir = options.state_dir / "runs"
        self._relay_failing: set[int] = set()  # runs whose last relay raised (logged once, not every tick)
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        self.node_id_of: Callable[[], int] = lambda: 0

    @property
    def active(self) -> list[Run]:
        """The runs that have not exited."""
        return [r for r in self.runs.values() if not r.exited]

    def get(self, run_id: int) -> Run:
        """The run ``run_id``, exited or not.

        Raises:
            NotFoundError: the run is not (or no longer) on this node.
        """
        run = self.runs.get(run_id)
        if run is None:
            raise NotFoundError(f"run {run_id} is not on this node")
        return run

    async def mark_changed(self) -> None:
        """Wake the report loop (``wait_dirty``) and every waiter on ``changed`` (the servicer's watch streams)."""
        self._dirty.set()
        async with self.changed:
            self.changed.notify_all()

    async def wait_dirty(self, timeout_s: float) -> None:
        """Wait until a run changed or ``timeout_s`` passed, whichever is first, then clear the mark."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._dirty.wait(), timeout_s)
        self._dirty.clear()

    # ---- start ----

    def check(self, order: StartOrder) -> Launch:
        """What ``launch`` will start, every field of the order checked (InvalidRequest); no side effect."""
        devices = check_order(order, self.node)
        argv = self._resolve_argv(order)
        folder = self.runs_dir / f"{order.task_id}-{order.run_id}"
        if order.working_dir:
            cwd = Path(order.working_dir)
            if not cwd.is_absolute() or not _is_dir(cwd):
                raise InvalidRequest(f"working_dir {order.working_dir!r} is not an existing absolute folder here")
        else:
            cwd = folder / "work"
        return Launch(order=order, devices=tuple(devices), argv=argv, folder=folder, cwd=cwd)

    def launch(self, launch: Launch, run_as: RunAs | None) -> Run:
        """Start a checked order's ranks (idempotent per run id) as ``run_as`` (None: as the agent)."""
        existing = self.runs.get(launch.order.run_id)
        if existing is not None:
            return existing
        order, folder, cwd = launch.order, launch.folder, launch.cwd
        control = _make_run_folder(launch, run_as)
        plans = plan_ranks(
            order,
            self.node,
            launch.devices,
            base_env=self.options.base_env,
            run_dir=str(control.folder),
            error_dir=str(folder / "errors"),
            hook_dir=HOOK_DIR,
            collective_file=str(collective_file(folder)),
        )
        ranks: list[Rank] = []
        try:
            for plan in plans:
                log_path = folder / "logs" / f"rank{plan.local_rank}.log"
                env = plan.env if run_as is None else {**plan.env, **_user_env(run_as, cwd)}
                proc = procs.spawn(launch.argv, env, cwd, log_path, run_as)
                ranks.append(
                    Rank(
                        plan.local_rank, proc, log_path, folder / "errors" / f"rank{plan.local_rank}.json", time.time()
                    )
                )
        except OSError as exc:
            self._kill_now(ranks)
            shutil.rmtree(folder, ignore_errors=True)
            raise InvalidRequest(f"cannot execute {order.argv[0]!r}: {exc.strerror or exc}") from None
        (folder / PIDS_FILE).write_text(json.dumps({"sids": [r.proc.pid for r in ranks]}))
        run = Run(order, folder, control, ranks)
        self.runs[order.run_id] = run
        logger.info(
            "run started",
            extra={
                "task_id": order.task_id,
                "run_id": order.run_id,
                "num_ranks": len(ranks),
                "argv": launch.argv[:8],
                "uid": os.geteuid() if run_as is None else run_as.uid,
            },
        )
        return run

    def _resolve_argv(self, order: StartOrder) -> list[str]:
        argv = list(order.argv)
        if argv[0] in ("python", "python3"):
            argv[0] = self.options.python_executable
        path = order.env.get("PATH") or self.options.base_env.get("PATH", "")
        cwd = order.working_dir or None
        if "/" in argv[0]:
            candidate = Path(argv[0]) if Path(argv[0]).is_absolute() or cwd is None else Path(cwd) / argv[0]
            found = str(candidate) if candidate.is_file() and _executable(candidate) else None
        else:
            found = shutil.which(argv[0], path=path)
        if found is None:
            raise InvalidRequest(f"command not found or not executable: {order.argv[0]!r}")
        argv[0] = found
        return argv

    @staticmethod
    def _kill_now(ranks: list[Rank]) -> None:
        procs.signal_sessions([r.proc.pid for r in ranks], signal.SIGKILL)
        for r in ranks:
            r.proc.wait()

    # ---- suspend and stop ----

    def suspend(self, run_id: int, ack_window_s: float, grace_s: float, term_grace_s: float) -> Run:
        """Start the suspend protocol (idempotent): raise the flag on node rank 0, start the deadlines everywhere.

        ``tick`` stops the run when its deadlines (``core.suspend``) say so; ``term_grace_s`` 0 takes the
        agent's default.

        Raises:
            NotFoundError: the run is not on this node.
        """
        run = self.get(run_id)
        if run.exited or run.stopping or run.suspend is not None:
            return run
        flag_node = run.order.node_rank == 0
        run.suspend = SuspendClock(
            requested_at=time.time(),
            ack_window_s=ack_window_s,
            grace_s=grace_s,
            term_grace_s=term_grace_s or self.options.term_grace_s,
            flag_node=flag_node,
        )
        if flag_node:
            run.control.raise_suspend()
        run.suspend_stage = pb.SUSPEND_STAGE_SENT
        run.phase = pb.NODE_RUN_PHASE_SUSPENDING
        logger.info("suspend flag %s", "raised" if flag_node else "noted", extra={"run_id": run_id})
        return run

    def stop(self, run_id: int, term_grace_s: float, why: str) -> Run | None:
        """SIGTERM to every process tree of the run now; SIGKILL after the grace (by ``tick``)."""
        run = self.runs.get(run_id)
        if run is None or run.exited or run.stopping:
            return run
        run.stop_started_at = time.time()
        run.term_grace_s = term_grace_s or self.options.term_grace_s
        run.stop_why = why
        for r in run.ranks:
            if r.running:
                r.stopped_by_agent = True
        run.phase = pb.NODE_RUN_PHASE_STOPPING
        procs.signal_sessions(run.sids, signal.SIGTERM)
        logger.info("run stopping: %s", why, extra={"run_id": run_id, "term_grace_s": run.term_grace_s})
        return run

    # ---- the periodic step ----

    async def tick(self) -> None:
        """One periodic step of every run: reap exits, relay SDK events, apply deadlines, merge logs, finish."""
        changed = False
        for run in list(self.runs.values()):
            if run.exited:
                continue
            changed |= self._reap(run)
            changed |= await self._relay_guarded(run)
            changed |= self._deadlines(run)
            self._mux_logs(run, final=False)
            changed |= self._finish_if_gone(run)
        if changed:
            await self.mark_changed()

    def _reap(self, run: Run) -> bool:
        changed = False
        for r in run.ranks:
            if not r.running:
                continue
            code = r.proc.poll()
            if code is None:
                continue
            r.exit_code, r.signal = (0, -code) if code < 0 else (code, 0)
            r.exited_at = time.time()
            r.error = _read_error_file(r.error_path)
            changed = True
            logger.info(
                "rank exited",
                extra={"run_id": run.order.run_id, "local_rank": r.local_rank, "exit_code": code},
            )
        if changed:
            run.failure = root_cause([r.as_exit() for r in run.ranks if not r.running])
        return changed

    async def _relay_guarded(self, run: Run) -> bool:
        """``_relay``, whose failure stops neither this run's supervision nor any other run's.

        Whatever it raises (a rank may make its event file unreadable, e.g. a directory in its place) is logged
        once per run, with the run id, and the relay is tried again next tick.
        """
        run_id = run.order.run_id
        try:
            changed = await self._relay(run)
        except Exception:
            if run_id not in self._relay_failing:
                self._relay_failing.add(run_id)
                logger.exception("relaying the events of run %d failed", run_id, extra={"run_id": run_id})
            return False
        self._relay_failing.discard(run_id)
        return changed

    async def _relay(self, run: Run) -> bool:
        """Events the task wrote through the SDK, relayed to the scheduler and acknowledged in order."""
        run.pending_events.extend(run.control.new_events())
        changed = False
        while run.pending_events:
            event = run.pending_events[0]
            try:
                changed |= await self._relay_one(run, event)
            except LINK_ERRORS as err:
                if not _refused_checkpoint(event, err):
                    logger.warning("relaying %s of run %d failed: %s", event.kind, run.order.run_id, err)
                    return changed  # tried again next tick, in order
                logger.warning(
                    "run %d: the scheduler did not count checkpoint %s: %s",
                    run.order.run_id,
                    event.data.get("path"),
                    err,
                )
            except Exception:  # not the link: this event would fail again every tick and hold up those after it
                logger.exception("run %d: event %s dropped, relaying it failed", run.order.run_id, event.kind)
            run.control.ack(event.seq)
            run.pending_events.pop(0)
        return changed

    async def _relay_one(self, run: Run, event: Event) -> bool:
        now = time.time()
        task_id, run_id = run.key
        if event.kind == runcontrol.RECEIVED:
            # When rank 0 read the flag, on this node's clock: a checkpoint it takes after counts for the suspend.
            read_at = min(now, event.written_at)
            await self.link.suspend_stage(task_id, run_id, pb.SUSPEND_STAGE_RECEIVED, read_at)
            if run.suspend is not None:
                run.suspend.received(now)
            run.suspend_stage = max(run.suspend_stage, pb.SUSPEND_STAGE_RECEIVED)
            return True
        if event.kind == runcontrol.GO_SUSPEND:
            await self.link.suspend_stage(task_id, run_id, pb.SUSPEND_STAGE_CAN_SUSPEND, now)
            run.suspend_stage = pb.SUSPEND_STAGE_CAN_SUSPEND
            if run.suspend is not None:
                run.suspend.go_suspend(now)
            else:
                self.stop(run_id, 0.0, "the task called go_suspend()")
            return True
        if event.kind == runcontrol.WHOLE_LIFE_STATE:
            await self.link.update_run(task_id, run_id, whole_life_state=int(event.data["value"]))
        elif event.kind == runcontrol.WATCHDOG_TIME:
            await self.link.update_run(task_id, run_id, watchdog_time_s=float(event.data["seconds"]))
        elif event.kind == runcontrol.CHECKPOINT:
            path, step, taken_at = (
                str(event.data["path"]),
                int(event.data["step"]),
                float(event.data.get("taken_at", 0)),
            )
            await self.link.report_checkpoint(task_id, run_id, path, step, taken_at)
        return False

    def _deadlines(self, run: Run) -> bool:
        now = time.time()
        if run.suspend is not None and not run.stopping:
            why = run.suspend.stop_due(now)
            if why is not None:
                self.stop(run.order.run_id, run.suspend.term_grace_s, f"suspend: {why}")
                return True
        killing = run.stopping and now >= run.stop_started_at + run.term_grace_s
        if killing and procs.signal_sessions(run.sids, signal.SIGKILL):
            logger.warning("run %d: SIGKILL after the %g s grace", run.order.run_id, run.term_grace_s)
        if not run.stopping and all(not r.running for r in run.ranks) and procs.session_members(run.sids):
            # Every rank ended, but something it started lives on in its session: that goes too.
            self.stop(run.order.run_id, 0.0, "the ranks exited; stopping what they left behind")
            return True
        return False

    def _finish_if_gone(self, run: Run) -> bool:
        if any(r.running for r in run.ranks) or procs.session_members(run.sids):
            return False
        self._mux_logs(run, final=True)
        run.phase = pb.NODE_RUN_PHASE_EXITED
        run.exited_at = time.time()
        (run.folder / PIDS_FILE).unlink(missing_ok=True)  # nothing of it is left to kill after a restart
        if run.suspend is not None:
            run.control.clear_suspend()
        logger.info(
            "run exited",
            extra={"run_id": run.order.run_id, "failure": run.failure.message if run.failure else ""},
        )
        return True

    def _mux_logs(self, run: Run, *, final: bool) -> None:
        """Append the ranks' new complete lines to the node log, each prefixed with its local rank."""
        out: list[bytes] = []
        for r in run.ranks:
            try:
                with r.log_path.open("rb") as f:
                    f.seek(r.mux_offset)
                    data = f.read()
            except OSError:
                continue
            cut = len(data) if final else data.rfind(b"\n") + 1
            if cut <= 0:
                continue
            r.mux_offset += cut
            prefix = f"[{r.local_rank}] ".encode()
            lines = data[:cut].splitlines(keepends=True)
            out.extend(prefix + (line if line.endswith(b"\n") else line + b"\n") for line in lines)
        if out:
            with (run.folder / NODE_LOG).open("ab") as f:
                f.write(b"".join(out))

    # ---- agent start and shutdown ----

    def kill_leftovers(self) -> int:
        """Processes of runs a previous agent on this node started (it died): killed; how many.

        Only processes of those sessions that still carry the run's control folder in their environment
        are killed: a session id whose leader is gone may have been reused by an unrelated process.
        """
        killed = 0
        for pids in self.runs_dir.glob(f"*/{PIDS_FILE}"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                sids = [int(s) for s in json.loads(pids.read_text())["sids"]]
                marker = f"{RUN_DIR_ENV}={pids.parent / 'control'}".encode()
                for pid in procs.session_members(sids):
                    if procs.environ_has(pid, marker):
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.kill(pid, signal.SIGKILL)
                            killed += 1
                pids.unlink()
        return killed

    def prune(self, retention_s: float) -> None:
        """Forget exited runs (and delete their folders) older than the log retention."""
        cutoff = time.time() - retention_s
        for run_id, run in list(self.runs.items()):
            if run.exited and run.final_reported and run.exited_at < cutoff:
                shutil.rmtree(run.folder, ignore_errors=True)
                del self.runs[run_id]

    async def shutdown(self, term_grace_s: float) -> None:
        """Stop every run (the agent is going away and its ranks with it)."""
        for run in self.active:
            self.stop(run.order.run_id, term_grace_s, "the agent is stopping")
        deadline = time.monotonic() + term_grace_s + 5.0
        while self.active and time.monotonic() < deadline:
            for run in self.active:
                self._reap(run)
                self._deadlines(run)
                self._finish_if_gone(run)
            await asyncio.sleep(0.05)


@dataclass(frozen=True, kw_only=True)
class Launch:
    """A checked start order: what to run, where, on which devices."""

    order: StartOrder
    devices: tuple[int, ...]
    argv: list[str]
    folder: Path
    cwd: Path


def _make_run_folder(launch: Launch, run_as: RunAs | None) -> RunControl:
    """Make the run's folder and return its SDK control folder.

    With ``run_as``, what the ranks write is theirs: the working folder the agent made, ``errors/``,
    ``collective/`` and the SDK's event file; everything the agent writes (the suspend flag, acks, logs, pids)
    stays root's, in folders the ranks cannot change, so no rank can point it elsewhere.
    """
    folder = launch.folder
    for sub in ("control", "logs", "errors", "collective"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    made_cwd = not launch.order.working_dir
    launch.cwd.mkdir(parents=True, exist_ok=True)
    control = RunControl(folder / "control").create()
    if run_as is not None:
        events = control.folder / runcontrol.EVENTS_FILE
        events.touch(mode=0o644)
        owned = [folder / "errors", folder / "collective", events, *([launch.cwd] if made_cwd else [])]
        for path in owned:
            os.chown(path, run_as.uid, run_as.gid)
        for path in (folder, folder / "control", folder / "logs"):
            path.chmod(0o755)
    return control


def collective_file(run_folder: Path) -> Path:
    """Where a run's ranks write their hfreduce group's control address (``FF_HFREDUCE_CONTROL_FILE``)."""
    return run_folder / "collective" / "control.json"


def _user_env(run_as: RunAs, cwd: Path) -> dict[str, str]:
    """Who the ranks are, for tools that read it (home: the user's own where this host knows it)."""
    try:
        home = pwd.getpwuid(run_as.uid).pw_dir
    except KeyError:
        home = str(cwd)
    return {"USER": run_as.user_name, "LOGNAME": run_as.user_name, "HOME": home}


def _is_dir(path: Path) -> bool:
    """Whether ``path`` is a folder; False for a name the system cannot even look up (too long, NUL)."""
    try:
        return path.is_dir()
    except (OSError, ValueError):
        return False


def _executable(path: Path) -> bool:
    return os.access(path, os.X_OK)


def _read_error_file(path: Path) -> ErrorRecord | None:
    """The rank's error file; never through a symbolic link (the folder is the rank's own)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            data = json.loads(f.read(1 << 20))
        return ErrorRecord(
            timestamp=float(data["timestamp"]), exc_type=str(data["exc_type"]), message=str(data.get("message", ""))
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _tail(path: Path) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - LOG_TAIL_BYTES))
            return f.read().decode(errors="replace")
    except OSError:
        return ""
