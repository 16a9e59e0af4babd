"""What training code imports (HAI's ``hfai.client``): suspend hooks, whole-life state, watchdog, experiments.

Priorities too. Inside a task the agent sets ``HFAI_RUN_DIR`` (see ``hfai.runcontrol``), the task id, and the
state the run started with; outside a task (plain ``python train.py``) the hooks say there is nothing to
suspend and the whole-life state is 0.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

from hfai import config, runcontrol
from hfai.api import SchedulerApi
from hfai.runcontrol import RunControl
from hfai.spec import task_spec

T = TypeVar("T")

WHOLE_LIFE_STATE_ENV = "MARSV2_WHOLE_LIFE_STATE"
TASK_ID_ENV = "MARSV2_TASK_ID"
ACK_TIMEOUT_S = 30.0

_state: dict[str, Any] = {}


class NotInTask(RuntimeError):
    """A call that only makes sense inside a task run by the cluster (or hfai's local mode)."""


def _control() -> RunControl:
    control = RunControl.from_env()
    if control is None:
        raise NotInTask(f"not running as a task ({runcontrol.RUN_DIR_ENV} is not set)")
    return control


def _is_rank0() -> bool:
    return os.environ.get("RANK", "0") == "0"


def receive_suspend_command() -> bool:
    """Whether the scheduler asked this task to suspend (only rank 0 of node rank 0 is told, as in HAI).

    The first True is acknowledged to the scheduler; the task then has its grace to save a checkpoint
    and call ``go_suspend()``.
    """
    control = RunControl.from_env()
    if control is None or not _is_rank0() or not control.suspend_requested():
        return False
    if not _state.get("received"):
        control.append(runcontrol.RECEIVED)
        _state["received"] = True
    return True


def go_suspend(timeout_s: float | None = None) -> None:
    """Tell the scheduler the checkpoint is saved: stop this run now and queue the task again.

    Any rank may call it. Like HAI's, it does not return: the agent stops the run. ``timeout_s`` (for
    tests) bounds the wait; then the process ends itself with SIGTERM.
    """
    _control().append(runcontrol.GO_SUSPEND)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while deadline is None or time.monotonic() < deadline:
        time.sleep(0.1)
    os.kill(os.getpid(), signal.SIGTERM)


def set_whole_life_state(value: int) -> None:
    """Keep an integer across the runs of this task (e.g. the epoch); returns once it is stored."""
    if not isinstance(value, int) or isinstance(value, bool) or not -(2**63) <= value < 2**63:
        raise ValueError("whole_life_state must be a 64-bit integer")
    control = _control()
    seq = control.append(runcontrol.WHOLE_LIFE_STATE, value=value)
    if not control.wait_acked(seq, ACK_TIMEOUT_S):
        raise TimeoutError(f"the agent did not store whole_life_state within {ACK_TIMEOUT_S:g} s")
    _state["whole_life_state"] = value


def get_whole_life_state() -> int:
    """The state this run started with (or the last one set in it); 0 for a first run."""
    if "whole_life_state" in _state:
        return int(_state["whole_life_state"])
    return int(os.environ.get(WHOLE_LIFE_STATE_ENV, "0") or 0)


def set_watchdog_time(seconds: float) -> None:
    """Fail the run when it writes no log line for this long (HAI's default: 1800 s)."""
    if not runcontrol.is_seconds(seconds, positive=True):
        raise ValueError(f"the watchdog time must be a finite number > 0, not {seconds!r}")
    _control().append(runcontrol.WATCHDOG_TIME, seconds=float(seconds))


def report_checkpoint(path: str, step: int = 0, taken_at: float | None = None) -> None:
    """Tell the scheduler a checkpoint is durable.

    Args:
        path: the checkpoint (its manifest) in 3FS.
        step: the task's step counter at the checkpoint.
        taken_at: when its state was captured (``time.time()`` at the snapshot, before the write). During a
            suspend the scheduler stops the run at once on a checkpoint taken after rank 0 read the flag;
            without ``taken_at`` (or one taken before) the run goes on until ``go_suspend()`` or the grace.
    """
    if taken_at is not None and not runcontrol.is_seconds(taken_at):
        raise ValueError(f"taken_at must be a time in seconds >= 0, not {taken_at!r}")
    if not runcontrol.is_checkpoint_path(path):
        raise ValueError(f"path must be a string of 1 to {runcontrol.MAX_PATH_CHARS} characters")
    if not runcontrol.is_int64(int(step)):
        raise ValueError(f"step must be a 64-bit integer, not {step!r}")
    _control().append(runcontrol.CHECKPOINT, path=path, step=int(step), taken_at=float(taken_at or 0.0))


def _run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def _api() -> SchedulerApi:
    return SchedulerApi.from_config(config.load())


async def _with_api(method: str, *args: Any, **kw: Any) -> Any:
    async with _api() as api:
        return await getattr(api, method)(*args, **kw)


def set_priority(level: int | None, task_id: int | None = None) -> None:
    """Change this task's priority (or another task's with ``task_id``); None means AUTO."""
    tid = task_id if task_id is not None else int(os.environ.get(TASK_ID_ENV, "0") or 0)
    if not tid:
        raise NotInTask(f"no task id: pass task_id or run as a task ({TASK_ID_ENV})")
    _run(_with_api("set_priority", tid, level))


class Experiment:
    """A task on the cluster (HAI's experiment)."""

    def __init__(self, task: Any) -> None:
        self.task = task

    @property
    def id(self) -> int:
        """The task id."""
        return int(self.task.task_id)

    @property
    def state(self) -> str:
        """The task's state when last fetched, lower case without the prefix (``queued``, ``running``, ...)."""
        from fireflyer.scheduler.v1 import scheduler_pb2

        return str(scheduler_pb2.TaskState.Name(self.task.state)).removeprefix("TASK_STATE_").lower()

    def refresh(self) -> Experiment:
        """Fetches the task again (with its runs); returns ``self``. Raises RpcError when the scheduler refuses."""
        self.task = _run(_with_api("get", self.id, True))
        return self

    def suspend(self) -> Experiment:
        """Suspends the task through the suspend protocol (it queues again); a task not running is left as it is."""
        self.task = _run(_with_api("suspend", self.id))
        return self

    def stop(self) -> Experiment:
        """Stops the task for good (it ends STOPPED); returns ``self`` with the scheduler's answer."""
        self.task = _run(_with_api("stop", self.id))
        return self

    def logs(self, rank: int = 0) -> str:
        """The log of node rank ``rank`` of the latest run so far (undecodable bytes replaced)."""

        async def read() -> bytes:
            async with _api() as api:
                return b"".join([chunk async for chunk in api.logs(self.id, node_rank=rank)])

        return _run(read()).decode(errors="replace")

    def __repr__(self) -> str:
        return f"Experiment(id={self.id}, name={self.task.spec.name!r}, state={self.state})"


def create_experiment(
    argv: list[str],
    *,
    nodes: int = 1,
    priority: int | None = None,
    group: str = "",
    name: str = "",
    env: dict[str, str] | None = None,
    **options: Any,
) -> Experiment:
    """Submit a task: ``create_experiment(["python", "train.py"], nodes=2, priority=30)``."""
    spec = task_spec(argv, nodes=nodes, priority=priority, group=group, name=name, env=env or {}, **options)
    return Experiment(_run(_with_api("submit", spec)))


def get_experiments(*, all_users: bool = False) -> list[Experiment]:
    """The user's tasks, newest first (``all_users``: everyone's, for admins)."""
    return [Experiment(t) for t in _run(_with_api("list", all_users=all_users))]


def get_experiment(task_id: int) -> Experiment:
    """The task ``task_id`` with its runs; raises RpcError (NOT_FOUND) when there is none."""
    return Experiment(_run(_with_api("get", task_id, True)))


def iter_experiments() -> Iterator[Experiment]:
    """The user's tasks, newest first, as HAI's iterator (fetched at once, not page by page)."""
    yield from get_experiments()


__all__ = [
    "Experiment",
    "NotInTask",
    "create_experiment",
    "get_experiment",
    "get_experiments",
    "get_whole_life_state",
    "go_suspend",
    "receive_suspend_command",
    "report_checkpoint",
    "set_priority",
    "set_watchdog_time",
    "set_whole_life_state",
]
