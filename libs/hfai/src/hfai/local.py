"""Local mode: run a script here the way the cluster would, and simulate a suspend after N seconds.

This process plays the node agent: it gives the script the task environment (RANK 0 of 1, the
whole-life state, a run-control folder), raises the suspend flag after ``suspend_after_s``, stops the
script when it calls ``go_suspend()`` (or when the acknowledge window or the grace runs out), and runs
it again from the top with the whole-life state it set: what a suspend and resume on the cluster does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from hfai import runcontrol
from hfai.client import TASK_ID_ENV, WHOLE_LIFE_STATE_ENV
from hfai.runcontrol import RunControl

POLL_S = 0.05


@dataclass(frozen=True, kw_only=True)
class LocalOptions:
    """How ``run_local`` plays the agent.

    Attributes:
        suspend_after_s: raise the suspend flag this long after the first run starts; None: never.
        whole_life_state: what the first run reads as its whole-life state.
        ack_window_s: how long rank 0 has to acknowledge the flag (``receive_suspend_command``).
        grace_s: how long the script has to call ``go_suspend()`` once it acknowledged.
        term_grace_s: between SIGTERM and SIGKILL when the script is stopped.
    """

    suspend_after_s: float | None = None
    whole_life_state: int = 0
    ack_window_s: float = 5.0
    grace_s: float = 60.0
    term_grace_s: float = 5.0


@dataclass
class _Run:
    proc: subprocess.Popen[bytes]
    control: RunControl
    started: float
    whole_life_state: int
    flagged_at: float | None = None
    received_at: float | None = None
    suspended: str = ""


def run_local(argv: list[str], options: LocalOptions, out: TextIO) -> int:
    """Run ``argv`` (at most twice: before and after the simulated suspend); the last exit code."""
    wls = options.whole_life_state
    with tempfile.TemporaryDirectory(prefix="hfai-local-") as tmp:
        for run_index in range(2):
            run = _start(argv, Path(tmp) / f"run{run_index}", wls)
            print(f"hfai local: run {run_index} started (pid {run.proc.pid}, whole_life_state={wls})", file=out)
            simulate = options.suspend_after_s if run_index == 0 else None
            code = _supervise(run, simulate, options, out)
            wls = run.whole_life_state
            if not run.suspended:
                print(f"hfai local: run {run_index} exited with {code}", file=out)
                return code
            print(
                f"hfai local: run {run_index} suspended ({run.suspended}); queued again with whole_life_state={wls}",
                file=out,
            )
    return 0


def _start(argv: list[str], folder: Path, wls: int) -> _Run:
    control = RunControl(folder).create()
    env = {
        **os.environ,
        runcontrol.RUN_DIR_ENV: str(folder),
        WHOLE_LIFE_STATE_ENV: str(wls),
        TASK_ID_ENV: "0",
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_IP": "127.0.0.1",
        "MASTER_PORT": "2222",
    }
    proc = subprocess.Popen(argv, env=env, start_new_session=True)
    return _Run(proc, control, time.monotonic(), wls)


def _supervise(run: _Run, suspend_after_s: float | None, options: LocalOptions, out: TextIO) -> int:
    while run.proc.poll() is None:
        _relay(run)
        now = time.monotonic()
        if suspend_after_s is not None and run.flagged_at is None and now - run.started >= suspend_after_s:
            run.control.raise_suspend()
            run.flagged_at = now
            print(f"hfai local: suspend flag raised after {suspend_after_s:g} s", file=out)
        if run.flagged_at is not None and not run.suspended:
            if run.received_at is None and now - run.flagged_at > options.ack_window_s:
                _stop(run, "not acknowledged: forced", options)
            elif run.received_at is not None and now - run.received_at > options.grace_s:
                _stop(run, "grace over: forced", options)
        time.sleep(POLL_S)
    _relay(run)
    return run.proc.returncode


def _relay(run: _Run) -> None:
    """What an agent does with the events: store them (here: keep them) and acknowledge."""
    for event in run.control.new_events():
        if event.kind == runcontrol.WHOLE_LIFE_STATE:
            run.whole_life_state = int(event.data["value"])
        elif event.kind == runcontrol.RECEIVED and run.received_at is None:
            run.received_at = time.monotonic()
        elif event.kind == runcontrol.GO_SUSPEND and not run.suspended:
            run.control.ack(event.seq)
            _stop(run, "go_suspend()", LocalOptions())
            continue
        run.control.ack(event.seq)


def _stop(run: _Run, why: str, options: LocalOptions) -> None:
    run.suspended = why
    with contextlib.suppress(ProcessLookupError):
        os.killpg(run.proc.pid, signal.SIGTERM)
    try:
        run.proc.wait(timeout=options.term_grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.proc.pid, signal.SIGKILL)
        run.proc.wait()
