"""Real processes: start detached, recognise them by pid and marker, notice early exits, stop or kill."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from ff_appliance.supervisor import (
    Started,
    SupervisorError,
    pid_alive,
    reap,
    running_pid,
    start_detached,
    terminate,
    wait_ready_file,
)

# Writes its ready file, then lives until killed; with "stubborn" it ignores SIGTERM.
CHILD = """
import json, signal, sys, time
if sys.argv[2] == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("child up", flush=True)
open(sys.argv[1], "w").write(json.dumps({"grpc": "127.0.0.1:1"}))
time.sleep(60)
"""


def _start(tmp_path: Path, mode: str) -> tuple[Started, Path]:
    ready = tmp_path / f"{mode}.ready.json"
    started = start_detached(
        mode,
        [sys.executable, "-c", CHILD, str(ready), mode],
        log_file=tmp_path / "logs" / f"{mode}.log",
        pid_file=tmp_path / "run" / f"{mode}.pid",
        env={"PYTHONUNBUFFERED": "1"},
    )
    return started, ready


async def test_start_find_and_stop(tmp_path: Path) -> None:
    started, ready = _start(tmp_path, "polite")
    assert await wait_ready_file(started, ready, time.monotonic() + 10) == {"grpc": "127.0.0.1:1"}
    pid_file = tmp_path / "run" / "polite.pid"
    assert running_pid(pid_file, str(ready)) == started.pid
    assert running_pid(pid_file, "some other instance's marker") is None  # a recycled pid is not ours
    assert terminate({"polite": started.pid}, timeout_s=5.0) == []
    reap(started)
    assert not pid_alive(started.pid)
    assert running_pid(pid_file, str(ready)) is None
    assert "child up" in (tmp_path / "logs" / "polite.log").read_text()


async def test_a_process_ignoring_sigterm_is_killed(tmp_path: Path) -> None:
    started, ready = _start(tmp_path, "stubborn")
    await wait_ready_file(started, ready, time.monotonic() + 10)
    t0 = time.monotonic()
    assert terminate({"stubborn": started.pid}, timeout_s=0.5) == ["stubborn"]
    assert time.monotonic() - t0 < 5.0
    reap(started)
    assert not pid_alive(started.pid)


async def test_an_early_exit_names_the_log_and_shows_this_start_only(tmp_path: Path) -> None:
    log = tmp_path / "crash.log"
    log.write_text("old run line\n")
    started = start_detached(
        "crash",
        [sys.executable, "-c", "import sys; print('bad flag --x'); sys.exit(3)"],
        log_file=log,
        pid_file=tmp_path / "crash.pid",
    )
    with pytest.raises(SupervisorError) as exc:
        await wait_ready_file(started, tmp_path / "never.json", time.monotonic() + 10)
    message = str(exc.value)
    assert message.startswith("crash exited with code 3 while starting\nsee its log: ")
    assert "bad flag --x" in message
    assert "old run line" not in message
    assert "old run line" in log.read_text()  # appended to, never truncated


async def test_not_ready_in_time(tmp_path: Path) -> None:
    started = start_detached(
        "slow",
        [sys.executable, "-c", "import time; time.sleep(30)"],
        log_file=tmp_path / "slow.log",
        pid_file=tmp_path / "slow.pid",
    )
    try:
        with pytest.raises(SupervisorError, match="slow did not become ready in time"):
            await wait_ready_file(started, tmp_path / "never.json", time.monotonic() + 0.3)
    finally:
        terminate({"slow": started.pid}, timeout_s=5.0)
        reap(started)
