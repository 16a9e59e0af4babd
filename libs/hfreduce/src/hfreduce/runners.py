"""How a rank's pipeline tasks run: on threads of their own, or together on one event loop.

A task is a generator (reduce up one tree, broadcast down it, one side of a ring step) that does its sends and
receives through its runner and yields what it waits for.

- ``ThreadRunner``: each task on its own thread, with blocking sockets (kernel timeouts), as HFReduce runs
  its up and down phases. Sends, receives and numpy work release the GIL, so they run in parallel where the
  rank has cores to spare.
- ``EventLoop``: every task of the rank on the calling thread, over non-blocking sockets and one
  edge-triggered epoll set. Where the ranks of a node outnumber its cores (the 2-core dev box runs two ranks
  per emulated node, four in all), the threads buy no parallelism and their hand-offs cost: the loop took 7 %
  less CPU per registered 2x2 allreduce there (bench/results/hfreduce_allreduce.md).

``choose`` picks one from ``GroupConfig.pipeline`` and the cores this process may use.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Generator, Sequence
from pathlib import Path
from typing import Any, Protocol

from hfreduce.config import PipelineMode
from hfreduce.transport import Link, LinkError, Wait

Task = Generator["Wait | Until", None, Any]

_EDGE = select.EPOLLIN | select.EPOLLOUT | select.EPOLLRDHUP | select.EPOLLET
_READABLE = select.EPOLLIN | select.EPOLLRDHUP | select.EPOLLHUP | select.EPOLLERR
_WRITABLE = select.EPOLLOUT | select.EPOLLHUP | select.EPOLLERR
_ABORT_POLL_S = 0.1
_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # cgroup v2: "<quota> <period>" or "max <period>"
MAX_TASKS = 4  # per run: two trees x (up, down), or a ring step's send and receive
# ``auto`` runs threads when each local rank has at least this many cores: its up and down threads of two
# trees then have cores to overlap on.
CORES_PER_RANK_FOR_THREADS = 2


@dataclasses.dataclass(frozen=True)
class Until:
    """Wait until ``ready()`` holds (another task makes it so); ``what`` names it in a timeout."""

    ready: Callable[[], bool]
    what: str


class Handoff:
    """Chunks passed from one task to another (a tree root's up task to its down task), in order."""

    def __init__(self) -> None:
        self._items: collections.deque[Any] = collections.deque()
        self._cond = threading.Condition()

    def put(self, item: Any) -> None:
        """Append ``item`` and wake a task blocked in ``wait`` (thread-safe)."""
        with self._cond:
            self._items.append(item)
            self._cond.notify_all()

    def ready(self) -> bool:
        """Whether an item is waiting: the condition an event-loop task parks on."""
        return bool(self._items)

    def pop(self) -> Any:
        """Take the oldest item (IndexError if there is none: call once ``ready`` or ``wait`` says so)."""
        with self._cond:
            return self._items.popleft()

    def wait(self, timeout_s: float, abort: threading.Event, what: str) -> None:
        """Block until an item is there (threads); fails on ``abort`` or after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not self._items:
                if abort.is_set():
                    raise RuntimeError("aborted")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{what} not done within {timeout_s:g} s")
                self._cond.wait(min(left, _ABORT_POLL_S))


class Runner(Protocol):
    """What a pipeline needs of its runner: run tasks, and the steps tasks delegate to (``yield from``)."""

    mode: str  # "threads" or "loop"

    def run(self, tasks: Sequence[Task], *, in_order: bool = False) -> list[Any]:
        """Run ``tasks`` to completion; return their return values in order.

        With ``in_order`` they run one after the other (small messages, where each task's sends fit the socket
        buffers). The first failure shuts the rank's links and is raised.
        """

    def send(self, link: Link, data: memoryview) -> Task:
        """A step that sends all of ``data`` on ``link``."""

    def recv(self, link: Link, buf: memoryview) -> Task:
        """A step that fills all of ``buf`` from ``link``."""

    def take(self, handoff: Handoff, what: str) -> Task:
        """Wait for ``handoff``'s next item and return it."""

    def close(self) -> None:
        """Release the runner's threads or epoll set; the rank runs no more tasks."""


def choose(mode: PipelineMode, local_world_size: int, timeout_s: float, on_failure: Callable[[], None]) -> Runner:
    """The runner for ``mode``.

    ``auto`` picks threads when this rank has ``CORES_PER_RANK_FOR_THREADS`` cores of the node's to itself, else
    the event loop.
    """
    if mode == "auto":
        mode = "threads" if usable_cores() >= CORES_PER_RANK_FOR_THREADS * local_world_size else "loop"
    if mode == "threads":
        return ThreadRunner(timeout_s, on_failure)
    return EventLoop(timeout_s, on_failure)


def usable_cores() -> float:
    """The cores this process may run on: its CPU affinity, capped by its cgroup's CPU quota (containers)."""
    cores: float = len(os.sched_getaffinity(0))
    try:
        quota, period = _CPU_MAX.read_text().split()[:2]
    except (OSError, ValueError):
        return cores
    if quota != "max":
        cores = min(cores, int(quota) / int(period))
    return cores


class ThreadRunner:
    """Each task on its own thread, sockets blocking with kernel timeouts (``Link``).

    The first failure shuts the rank's links (``on_failure``) so the other threads' blocked calls fail at once.
    """

    mode = "threads"

    def __init__(self, timeout_s: float, on_failure: Callable[[], None]) -> None:
        self.timeout_s = timeout_s
        self.on_failure = on_failure
        self._pool = concurrent.futures.ThreadPoolExecutor(MAX_TASKS, thread_name_prefix="hfreduce-pipe")
        self._abort = threading.Event()

    def run(self, tasks: Sequence[Task], *, in_order: bool = False) -> list[Any]:
        """Run ``tasks`` on the pool's threads (``Runner.run``); the first error raised is the root cause.

        Raises:
            ValueError: more than ``MAX_TASKS`` tasks, which the pool could not run at once.
        """
        if len(tasks) > MAX_TASKS:  # the ones beyond the pool would wait for threads that wait for them
            raise ValueError(f"at most {MAX_TASKS} tasks run at once, got {len(tasks)}")
        self._abort.clear()
        if in_order:
            try:
                return [self._drive(task) for task in tasks]
            except BaseException:
                self.on_failure()
                raise
        futures = [self._pool.submit(self._drive, task) for task in tasks]
        done, _ = concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_EXCEPTION)
        primary = [f.exception() for f in done if f.exception() is not None]
        if primary:
            self._abort.set()
            self.on_failure()  # unblock threads stuck on sockets; their errors are consequences
        concurrent.futures.wait(futures)
        errors = primary or [f.exception() for f in futures if f.exception() is not None]
        if errors:
            raise errors[0]  # type: ignore[misc]
        return [f.result() for f in futures]

    @staticmethod
    def _drive(task: Task) -> Any:
        try:
            wait = next(task)
        except StopIteration as stop:
            return stop.value
        task.close()
        raise RuntimeError(f"a task of a thread runner waited on {wait!r}; its runner blocks instead")

    def send(self, link: Link, data: memoryview) -> Task:
        """``Runner.send``: a blocking send on the task's thread."""
        yield from ()  # a task that never waits: the kernel blocks the thread instead
        link.send(data)

    def recv(self, link: Link, buf: memoryview) -> Task:
        """``Runner.recv``: a blocking receive on the task's thread."""
        yield from ()
        link.recv_into(buf)

    def take(self, handoff: Handoff, what: str) -> Task:
        """``Runner.take``: blocks the task's thread until an item is there or the run fails."""
        yield from ()
        handoff.wait(self.timeout_s, self._abort, what)
        return handoff.pop()

    def close(self) -> None:
        """Shut the thread pool down without waiting for running tasks (their links are closed next)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


@dataclasses.dataclass
class _Parked:
    index: int
    wait: Wait | Until
    since: float


class _Run:
    """The state of one ``EventLoop.run``: tasks ready to step, and tasks parked on sockets or conditions."""

    def __init__(self, tasks: Sequence[Task]) -> None:
        self.tasks = tasks
        self.results: list[Any] = [None] * len(tasks)
        self.pending = len(tasks)
        self.ready: collections.deque[int] = collections.deque(range(len(tasks)))
        self.readers: dict[int, _Parked] = {}  # fd -> the task waiting to receive on it
        self.writers: dict[int, _Parked] = {}  # fd -> the task waiting to send on it
        self.conditions: list[_Parked] = []

    def resume_met(self) -> None:
        """Move tasks whose condition now holds to the front of the ready queue."""
        if not self.conditions:
            return
        still = []
        for parked in self.conditions:
            if parked.wait.ready():  # type: ignore[union-attr]
                self.ready.appendleft(parked.index)
            else:
                still.append(parked)
        self.conditions = still

    def parked(self) -> list[_Parked]:
        return [*self.readers.values(), *self.writers.values(), *self.conditions]


class EventLoop:
    """Runs a set of tasks to completion in the calling thread.

    A task waiting on a socket resumes when epoll reports the socket ready. Tasks retry their send or receive
    until the kernel answers EAGAIN before they wait, as edge-triggered epoll needs. A task that waits
    ``timeout_s`` without progress fails the run: LinkError(kind="timeout") naming the peer it waits on, or
    TimeoutError for a condition, so a dead or silent rank surfaces within the timeout. A link shut down by
    ``Group.abort`` from another thread wakes its task, which then fails with LinkError(kind="closed").
    """

    mode = "loop"

    def __init__(self, timeout_s: float, on_failure: Callable[[], None] = lambda: None) -> None:
        self.timeout_s = timeout_s
        self.on_failure = on_failure
        self._epoll = select.epoll()
        self._registered: dict[int, socket.socket] = {}  # fd -> the socket registered under it

    def close(self) -> None:
        """Close the epoll set."""
        self._epoll.close()

    def send(self, link: Link, data: memoryview) -> Task:
        """``Runner.send``: non-blocking sends, parking on the socket whenever the kernel answers EAGAIN."""
        return link.send_steps(data)

    def recv(self, link: Link, buf: memoryview) -> Task:
        """``Runner.recv``: non-blocking receives, parking on the socket whenever the kernel answers EAGAIN."""
        return link.recv_steps(buf)

    def take(self, handoff: Handoff, what: str) -> Task:
        """``Runner.take``: parks the task until another task of the run puts an item."""
        if not handoff.ready():
            yield Until(handoff.ready, what)
        return handoff.pop()

    def run(self, tasks: Sequence[Task], *, in_order: bool = False) -> list[Any]:
        """Run ``tasks`` until all finish; return their return values, in order.

        The first error closes the other tasks, shuts the rank's links (``on_failure``: whatever the error, the
        streams are mid-chunk) and is raised. Interleaving never blocks, so ``in_order`` changes nothing here.
        """
        run = _Run(tasks)
        try:
            while run.pending:
                while run.ready:
                    self._step(run, run.ready.popleft())
                if run.pending:
                    self._poll(run)
        except BaseException:
            for task in tasks:
                with contextlib.suppress(Exception):  # the first error is the one to report
                    task.close()
            self.on_failure()
            raise
        return run.results

    def _step(self, run: _Run, index: int) -> None:
        try:
            wait = next(run.tasks[index])
        except StopIteration as stop:
            run.results[index] = stop.value
            run.pending -= 1
            run.resume_met()
            return
        parked = _Parked(index, wait, time.monotonic())
        if isinstance(wait, Until):
            run.conditions.append(parked)
        else:
            waiting = run.writers if wait.write else run.readers
            fd = self._register(wait)
            if fd in waiting:
                raise RuntimeError(f"two tasks wait to {'send' if wait.write else 'receive'} on one link")
            waiting[fd] = parked
        run.resume_met()  # this step may have met a condition (another task's, or its own)

    def _poll(self, run: _Run) -> None:
        oldest = min(p.since for p in run.parked())
        wait_s = max(0.0, oldest + self.timeout_s - time.monotonic()) + 0.001
        for fd, events in self._epoll.poll(wait_s):
            if events & _READABLE and fd in run.readers:
                run.ready.append(run.readers.pop(fd).index)
            if events & _WRITABLE and fd in run.writers:
                run.ready.append(run.writers.pop(fd).index)
        self._check_deadlines(run)  # a task still parked may be overdue even while others progress

    def _register(self, wait: Wait) -> int:
        """The socket's fd, added to the epoll set the first time it is waited on (it stays for later runs)."""
        sock = wait.link.sock
        fd = sock.fileno()
        if fd < 0:
            raise LinkError(wait.link.peer, "closed", "socket closed")
        if self._registered.get(fd) is not sock:
            if fd in self._registered:  # a new socket under a closed one's number
                with contextlib.suppress(OSError):
                    self._epoll.unregister(fd)
            self._epoll.register(fd, _EDGE)
            self._registered[fd] = sock
        return fd

    def _check_deadlines(self, run: _Run) -> None:
        """Fail on the longest overdue wait, a silent peer before a hand-off (which waits on that peer)."""
        now = time.monotonic()
        overdue = [p for p in run.parked() if now - p.since >= self.timeout_s]
        for parked in sorted(overdue, key=lambda p: (isinstance(p.wait, Until), p.since)):
            if isinstance(parked.wait, Until):
                raise TimeoutError(f"{parked.wait.what} not done within {self.timeout_s:g} s")
            raise LinkError(parked.wait.link.peer, "timeout", f"no progress for {self.timeout_s:g} s")
