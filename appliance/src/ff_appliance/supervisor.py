"""Local processes: start detached with a log file and a pid file, find them again, stop them."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

POLL_INTERVAL_S = 0.05
LOG_TAIL_LINES = 15
START_MARKER = "--- fireflyer: starting"


class SupervisorError(Exception):
    """A process could not be started, or did not become ready."""


@dataclass
class Started:
    """A process this CLI started (its Popen is kept to notice an early exit and to reap it).

    ``main_pid``: the process that does the work when it is not the one started (a container's PID 1, whose
    podman client is the one started); its pid file then names it.
    """

    name: str
    process: subprocess.Popen[bytes]
    log_file: Path
    main_pid: int | None = None

    @property
    def pid(self) -> int:
        """The pid its pid file records: ``main_pid`` if known, else the started process's."""
        return self.main_pid if self.main_pid is not None else self.process.pid


def start_detached(
    name: str, argv: list[str], *, log_file: Path, pid_file: Path, env: Mapping[str, str] | None = None
) -> Started:
    """Start ``argv`` in its own session, output appended to ``log_file``; outlives this CLI."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("ab") as log:
        log.write(f"\n{START_MARKER} {name} at {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
        log.flush()
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=dict(env) if env is not None else None,
            close_fds=True,
        )
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    pid_file.write_text(f"{process.pid}\n")
    return Started(name, process, log_file)


def _read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting to be reaped is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs: trust kill(0)
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def process_matches(pid: int, marker: str) -> bool:
    """Whether ``pid``'s command line contains ``marker`` (guards against a recycled pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return not Path("/proc/self").exists()
    except OSError:
        return True
    return marker.encode() in cmdline


def running_pid(pid_file: Path, marker: str) -> int | None:
    """The pid recorded in ``pid_file`` if that process still runs and is the one we started."""
    pid = _read_pid(pid_file)
    if pid is None or not pid_alive(pid) or not process_matches(pid, marker):
        return None
    return pid


async def wait_ready_file(started: Started, ready_file: Path, deadline: float) -> dict[str, Any]:
    """Wait until the process writes its ready file (before the monotonic ``deadline``); its content.

    Raises:
        SupervisorError: the process exited first, or the deadline passed (the message shows the log).
    """
    while True:
        code = started.process.poll()
        if code is not None:
            raise SupervisorError(
                f"{started.name} exited with code {code} while starting\n{describe_log(started.log_file)}"
            )
        content = _read_json(ready_file)
        if content is not None:
            return content
        if time.monotonic() >= deadline:
            raise SupervisorError(f"{started.name} did not become ready in time\n{describe_log(started.log_file)}")
        await asyncio.sleep(POLL_INTERVAL_S)


def _read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None while it does not exist (ready files are written atomically)."""
    try:
        content: dict[str, Any] = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return content


def describe_log(log_file: Path, lines: int = LOG_TAIL_LINES) -> str:
    """Where the log is, and the last lines of the latest start: the first place to look when it fails."""
    try:
        text = log_file.read_text(errors="replace")
    except FileNotFoundError:
        text = ""
    latest = text.rpartition(START_MARKER)[2].partition("\n")[2] if START_MARKER in text else text
    tail = latest.splitlines()[-lines:]
    body = "".join(f"  | {line}\n" for line in tail)
    return f"see its log: {log_file}" + (f" (last {len(tail)} lines:)\n{body}" if tail else "")


def terminate(pids: Mapping[str, int], timeout_s: float) -> list[str]:
    """SIGTERM every process, wait up to ``timeout_s`` for all to exit, then SIGKILL the rest.

    Returns:
        The names of the processes that had to be killed.
    """
    for pid in pids.values():
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    remaining = dict(pids)
    while remaining and time.monotonic() < deadline:
        remaining = {name: pid for name, pid in remaining.items() if pid_alive(pid)}
        if remaining:
            time.sleep(POLL_INTERVAL_S)
    for pid in remaining.values():
        _signal(pid, signal.SIGKILL)
    kill_deadline = time.monotonic() + 5.0
    while any(pid_alive(p) for p in remaining.values()) and time.monotonic() < kill_deadline:
        time.sleep(POLL_INTERVAL_S)
    return sorted(remaining)


def reap(started: Started) -> None:
    """Collect the exit status of a child this CLI started and stopped (no zombie is left)."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        started.process.wait(timeout=0.1)


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


@contextlib.contextmanager
def exclusive_lock(lock_file: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_file``: one ``up`` or ``down`` at a time per state folder.

    Raises:
        SupervisorError: another fireflyer command holds it.
    """
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with lock_file.open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SupervisorError(f"another fireflyer command is working on this state folder ({lock_file})") from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
