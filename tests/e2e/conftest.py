"""Drive the appliance the way a user does: the ``fireflyer`` command, in a temp state folder.

Every cluster a test brings up is brought down in teardown, and no service process may survive it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ff_appliance.supervisor import pid_alive
from ff_testing.environ import clean_env

COMMAND_TIMEOUT_S = 60.0


def _fireflyer_argv() -> list[str]:
    """The installed console script next to this interpreter, else ``python -m ff_appliance``."""
    script = Path(sys.executable).parent / "fireflyer"
    if script.exists():
        return [str(script)]
    found = shutil.which("fireflyer")
    return [found] if found else [sys.executable, "-m", "ff_appliance"]


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


@dataclass
class Appliance:
    """The ``fireflyer`` CLI bound to one state folder, with a clean environment."""

    state_dir: Path

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return clean_env(extra)

    def run(self, *args: str, env: dict[str, str] | None = None, timeout_s: float = COMMAND_TIMEOUT_S) -> Result:
        proc = subprocess.run(
            [*_fireflyer_argv(), *args, "--state-dir", str(self.state_dir)], capture_output=True, text=True,
            env=self.env(env), timeout=timeout_s, check=False,
        )  # fmt: skip
        return Result(proc.returncode, proc.stdout, proc.stderr)

    def ok(self, *args: str, env: dict[str, str] | None = None, timeout_s: float = COMMAND_TIMEOUT_S) -> Result:
        result = self.run(*args, env=env, timeout_s=timeout_s)
        assert result.code == 0, f"fireflyer {' '.join(args)} exited {result.code}\n{result.out}\n{result.err}"
        return result

    def pids(self) -> dict[str, int]:
        run_dir = self.state_dir / "run"
        return {p.name.removesuffix(".pid"): int(p.read_text()) for p in sorted(run_dir.glob("*.pid"))}

    def down_and_check(self) -> None:
        """``down``, then prove every process it knew of is gone (SIGKILL leftovers so none leaks)."""
        pids = self.pids()
        result = self.run("down")
        leftover = {name: pid for name, pid in pids.items() if pid_alive(pid)}
        for pid in leftover.values():
            os.kill(pid, signal.SIGKILL)
        assert result.code == 0, result.err
        assert not leftover, f"still running after down: {leftover}"
        assert self.pids() == {}


@pytest.fixture
def appliance(tmp_path: Path) -> Iterator[Appliance]:
    """A state folder for one cluster; whatever the test leaves running is stopped and checked."""
    app = Appliance(tmp_path / "state")
    try:
        yield app
    finally:
        if app.state_dir.exists():
            app.down_and_check()


def wait_for_code(app: Appliance, code: str, *args: str, timeout_s: float = 5.0) -> Result:
    """Repeat a command until it fails with ``code`` (token checks may be cached for a moment)."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = app.run(*args)
        if f"fireflyer: {code}:" in result.err or time.monotonic() > deadline:
            return result
        time.sleep(0.2)
