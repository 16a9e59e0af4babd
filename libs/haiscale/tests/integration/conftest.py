"""Launches haiscale DDP ranks as real processes on this machine, nodes simulated by FF_HFREDUCE_NODE_RANK."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ff_testing import free_port
from ff_testing.forkserver import ForkedProcess, ForkServer

WORKER = Path(__file__).with_name("ddp_worker.py")
Launch = Callable[..., list[dict[str, Any]]]


@pytest.fixture
def launch(tmp_path: Path, torch_forks: ForkServer) -> Iterator[Launch]:
    """Start the ranks of a ``ddp_worker.py`` scenario, forked from the session's fork server (torch imported once)."""
    procs: list[ForkedProcess] = []

    def run(
        nodes: int, local: int, scenario: str, *, env: dict[str, str] | None = None, timeout_s: float = 90
    ) -> list[dict[str, Any]]:
        port = free_port()
        outs = []
        for rank in range(nodes * local):
            out = tmp_path / f"rank{rank}-{scenario}.json"
            outs.append(out)
            penv = {
                **os.environ,
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "RANK": str(rank),
                "WORLD_SIZE": str(nodes * local),
                "FF_HFREDUCE_NODE_RANK": str(rank // local),
                "FF_HFREDUCE_TIMEOUT_S": "20",
                "OMP_NUM_THREADS": "1",
                "TEST_STACKS_AFTER_S": str(timeout_s - 5),
                **(env or {}),
            }
            procs.append(torch_forks.start([sys.executable, str(WORKER), scenario, str(out)], env=penv))
        deadline = time.monotonic() + timeout_s
        for p in procs:
            try:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                stacks = {o.name: Path(f"{o}.stacks").read_text() for o in outs if Path(f"{o}.stacks").exists()}
                pytest.fail(f"ranks of {scenario!r} still running after {timeout_s} s; their stacks: {stacks}")
        return [json.loads(o.read_text()) if o.exists() else {"missing": str(o)} for o in outs]

    yield run
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
