"""Services run as processes for tests and benchmarks: started with a ready file, stopped by a signal.

A service process is a real process running ``python -m ff_<service> ...`` with its own environment, log and pid.
It is forked from a fork server of the test process that has imported the service's modules once (``spawn``): a
cluster of four services started from scratch spends ~4 s of CPU importing before it serves (7.9x slower to start
than forked ones, measured on a loaded 2-core machine), and the suite starts hundreds of them. Set
``FF_TEST_FORK_SERVICES=0`` to start each with a fresh interpreter instead.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Self, TypeAlias, TypeVar

if TYPE_CHECKING:  # (imported where used: `python -m ff_testing.forkserver` must not find it imported already)
    from ff_testing.forkserver import ForkedProcess, ForkServer

# A service's process: forked by the fork server, or a subprocess (the parts both have: pid, poll, wait, kill, ...).
Process: TypeAlias = "subprocess.Popen[bytes] | ForkedProcess"

_FORK_SWITCH = "FF_TEST_FORK_SERVICES"
# The cluster token of every test cluster (its services get it through their environment).
CLUSTER_TOKEN = "test-cluster-token"


class _ServiceForks:
    """The process's service fork server: started on first use, stopped at exit, modules imported as asked."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._server: ForkServer | None = None
        self._preloaded: set[str] = set()

    def with_module(self, module: str) -> ForkServer:
        with self._lock:
            if self._server is None or not self._server.usable:
                from ff_testing.forkserver import ForkServer

                if self._server is not None:
                    self._server.close()
                # One BLAS thread: numpy (imported with some services) would otherwise start threads in the server
                # before every fork, and a child's own OMP_NUM_THREADS comes too late to change that.
                self._server = ForkServer([], env={"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"})
                self._preloaded = set()
                atexit.register(self._server.close)
            if module not in self._preloaded:
                self._preloaded.add(module)
                with contextlib.suppress(RuntimeError):  # not importable by the server: each child imports it
                    self._server.preload([module])
            return self._server


_SERVICE_FORKS = _ServiceForks()


def spawn(args: Sequence[str], *, log: IO[bytes], env: Mapping[str, str]) -> Process:
    """Start ``args`` with stdout and stderr to ``log`` and stdin from /dev/null.

    ``python -m <package> ...`` of this interpreter is forked from this process's service fork server, which
    imports ``<package>.__main__`` on first use (where it can: a package only the child's environment finds is
    imported by the child); any other command (or every one, with ``FF_TEST_FORK_SERVICES=0``)
    runs as a subprocess.
    """
    module = args[2] if len(args) >= 3 and args[0] == sys.executable and args[1] == "-m" else None
    if module is None or os.environ.get(_FORK_SWITCH, "1") == "0":
        return subprocess.Popen(list(args), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    server = _SERVICE_FORKS.with_module(f"{module}.__main__")
    return server.start(args, env=env, stdout=log, stderr=log)


async def wait_ready(ready: Path, proc: Process | None = None, timeout_s: float = 30.0) -> dict[str, Any]:
    """The content of a service's ready file once it is written (``ff_rpc.write_ready_file``).

    Raises:
        RuntimeError: ``proc`` (the service's process, None for one in this process) exited before it
            wrote the file (with the end of its log, where there is one).
        TimeoutError: the file was not written within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = await asyncio.to_thread(_read_if_exists, ready)
        if text is not None:
            return dict(json.loads(text))
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(
                f"{ready.name}: process exited with {proc.returncode} before it was ready{_log_tail(ready)}"
            )
        await asyncio.sleep(0.05)
    raise TimeoutError(f"{ready} was not written in time")


def _log_tail(ready: Path, lines: int = 25) -> str:
    """The end of the service's log (``<name>.log`` next to ``<name>.ready.json``); "" when there is none.

    So a service that died at start says why in the test's failure.
    """
    log = ready.with_name(ready.name.removesuffix(".ready.json") + ".log")
    text = _read_if_exists(log)
    if not text:
        return ""
    return f"; the end of {log.name}:\n" + "\n".join(text.splitlines()[-lines:])


def _read_if_exists(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def module_args(module: str, flags: Mapping[str, str]) -> list[str]:
    """The command line ``python -m <module> --<flag> <value> ...`` with this interpreter."""
    args = [sys.executable, "-m", module]
    for k, v in flags.items():
        args += [f"--{k}", v]
    return args


@dataclass
class ServiceProcess:
    """A service process: ``args`` with ``--ready-file <folder>/<name>.ready.json``, logging to ``<folder>/<name>.log``.

    ``info`` is its ready file's content once ``ready()`` returned.
    """

    name: str
    folder: Path
    args: list[str]
    env: dict[str, str]
    proc: Process | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def ready_file(self) -> Path:
        """Where the service writes its ready file: ``<folder>/<name>.ready.json``."""
        return self.folder / f"{self.name}.ready.json"

    @property
    def log(self) -> Path:
        """The process's output: ``<folder>/<name>.log``."""
        return self.folder / f"{self.name}.log"

    @property
    def address(self) -> str:
        """The gRPC address the service serves on, from its ready file (after ``ready``)."""
        return str(self.info["grpc"])

    def start(self) -> None:
        """Starts the process (a stale ready file removed first); returns at once: ``ready`` waits for it."""
        self.ready_file.unlink(missing_ok=True)
        with (self.folder / f"{self.name}.log").open("ab") as out:
            self.proc = spawn([*self.args, "--ready-file", str(self.ready_file)], log=out, env=self.env)

    async def ready(self, timeout_s: float = 30.0) -> Self:
        """Waits for the ready file, keeps its content in ``info``, returns this process; raises as ``wait_ready``."""
        self.info = await wait_ready(self.ready_file, self.proc, timeout_s)
        return self

    def kill(self) -> None:
        """SIGKILL, and waits (10 s at most) for the process to exit; nothing if it is not running."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def terminate(self, timeout_s: float = 10.0, *, wait: bool = True) -> None:
        """SIGTERM; with ``wait``, until it exited (``wait_stopped``: SIGKILL past ``timeout_s``)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            if wait:
                self.wait_stopped(timeout_s)

    def wait_stopped(self, timeout_s: float = 30.0) -> None:
        """Wait for the process to exit after its SIGTERM; SIGKILL if it has not within ``timeout_s``."""
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()


P = TypeVar("P", bound=ServiceProcess)


def service_process(
    service: str,
    folder: Path,
    name: str,
    *,
    cluster_token: str,
    settings: Mapping[str, object],
    kind: type[P] = ServiceProcess,  # type: ignore[assignment]
) -> P:
    """``python -m ff_<service>`` named ``name`` in ``folder`` (its ready file and log there), not yet started.

    ``settings`` are its settings fields, given as ``--flags`` (``state_dir`` -> ``--state-dir``, booleans as
    ``true``/``false``); the cluster token goes through its environment (``FF_<SERVICE>_CLUSTER_TOKEN``), not the
    command line, as the appliance gives it. ``kind``: the ServiceProcess class to make.
    """
    flags = {k.replace("_", "-"): str(v).lower() if isinstance(v, bool) else str(v) for k, v in settings.items()}
    env = {**os.environ, f"FF_{service.upper()}_CLUSTER_TOKEN": cluster_token}
    folder.mkdir(parents=True, exist_ok=True)
    return kind(name, folder, module_args(f"ff_{service}", flags), env)


def stop_all(processes: Iterable[ServiceProcess], timeout_s: float = 10.0) -> None:
    """SIGTERM to every process at once, then wait for each (SIGKILL past ``timeout_s``).

    At once, so they shut down together instead of one after another.
    """
    running = [p for p in processes if p.proc is not None and p.proc.poll() is None]
    for p in running:
        assert p.proc is not None
        p.proc.terminate()
    deadline = time.monotonic() + timeout_s
    for p in running:
        assert p.proc is not None
        try:
            p.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()


def kill_all(processes: Iterable[ServiceProcess]) -> None:
    """SIGKILL every running process at once (a power loss), then wait for each (10 s at most)."""
    running = [p.proc for p in processes if p.proc is not None and p.proc.poll() is None]
    for proc in running:
        proc.kill()
    for proc in running:
        proc.wait(timeout=10)
