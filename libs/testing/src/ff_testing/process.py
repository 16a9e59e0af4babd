"""Services run as subprocesses for tests and benchmarks: started with a ready file, stopped by a signal."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


async def wait_ready(
    ready: Path, proc: subprocess.Popen[bytes] | None = None, timeout_s: float = 30.0
) -> dict[str, Any]:
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
    proc: subprocess.Popen[bytes] | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def ready_file(self) -> Path:
        """Where the service writes its ready file: ``<folder>/<name>.ready.json``."""
        return self.folder / f"{self.name}.ready.json"

    def start(self) -> None:
        """Starts the process (a stale ready file removed first); returns at once: ``ready`` waits for it."""
        self.ready_file.unlink(missing_ok=True)
        with (self.folder / f"{self.name}.log").open("ab") as out:
            self.proc = subprocess.Popen(
                [*self.args, "--ready-file", str(self.ready_file)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
            )

    async def ready(self, timeout_s: float = 30.0) -> None:
        """Waits for the ready file and keeps its content in ``info``; raises as ``wait_ready``."""
        self.info = await wait_ready(self.ready_file, self.proc, timeout_s)

    def kill(self) -> None:
        """SIGKILL, and waits (10 s at most) for the process to exit; nothing if it is not running."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def terminate(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if the process has not exited within ``timeout_s``."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()


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
