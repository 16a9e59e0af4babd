"""Launches real hfreduce ranks as separate processes (loopback, or one network namespace per node)."""

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

WORKER = Path(__file__).with_name("worker.py")
Launch = Callable[..., list[dict[str, Any]]]


@pytest.fixture
def launch(tmp_path: Path, torch_forks: ForkServer) -> Iterator[Launch]:
    """Start the ranks of a ``worker.py`` scenario (or of another ``worker``'s): forked from the session's fork
    server (numpy, hfreduce and torch imported once), or as new processes under ``node_prefix`` (a network
    namespace per node)."""
    procs: list[subprocess.Popen[bytes] | ForkedProcess] = []

    def run(
        nodes: int,
        local: int,
        scenario: str,
        *,
        env: dict[str, str] | None = None,
        timeout_s: float = 90,
        master: str = "127.0.0.1",
        node_prefix: Callable[[int], list[str]] | None = None,
        skip_ranks: tuple[int, ...] = (),
        node_env: Callable[[int], dict[str, str]] | None = None,
        worker: Path = WORKER,
    ) -> list[dict[str, Any]]:
        port = free_port()
        outs = []
        for node in range(nodes):
            for lr in range(local):
                rank = node * local + lr
                out = tmp_path / f"rank{rank}-{scenario}.json"
                outs.append(out)
                if rank in skip_ranks:
                    continue
                penv = {
                    **os.environ,
                    "MASTER_ADDR": master,
                    "MASTER_PORT": str(port),
                    "FF_HFREDUCE_NUM_NODES": str(nodes),
                    "FF_HFREDUCE_NODE_RANK": str(node),
                    "LOCAL_RANK": str(lr),
                    "LOCAL_WORLD_SIZE": str(local),
                    "FF_HFREDUCE_TIMEOUT_S": "20",
                    "FF_HFREDUCE_CHUNK_SIZE_BYTES": "4096",
                    "FF_HFREDUCE_SHM_SLOT_BYTES": "65536",
                    **(env or {}),
                    **(node_env(node) if node_env else {}),
                }
                cmd = [sys.executable, str(worker), scenario, str(out)]
                if node_prefix is None:
                    procs.append(torch_forks.start(cmd, env=penv))
                else:
                    procs.append(subprocess.Popen([*node_prefix(node), *cmd], env=penv))
        deadline = time.monotonic() + timeout_s
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        return [json.loads(o.read_text()) if o.exists() else {"missing": str(o)} for o in outs]

    yield run
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


TORCH_WORKER = Path(__file__).with_name("torch_worker.py")
TorchLaunch = Callable[..., list[dict[str, Any]]]


def launch_torch(
    forks: ForkServer,
    tmp_path: Path,
    nodes: int,
    local: int,
    scenario: str,
    *,
    env: dict[str, str] | None = None,
    timeout_s: float = 240,
    interleaved: bool = False,
    worker: Path = TORCH_WORKER,
) -> list[dict[str, Any]]:
    """Start ``nodes x local`` ranks of ``torch_worker.py`` as torchrun would (RANK, WORLD_SIZE, LOCAL_RANK,
    LOCAL_WORLD_SIZE, MASTER_ADDR/PORT), each node simulated by FF_HFREDUCE_NODE_RANK, forked from ``forks``
    (torch imported once); return their reports.
    ``interleaved``: rank r on node r % nodes (a cyclic placement) instead of r // local."""
    port = free_port()
    outs, procs = [], []
    try:
        for rank in range(nodes * local):
            out = tmp_path / f"rank{rank}-{scenario}.json"
            outs.append(out)
            penv = {
                **os.environ,
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "RANK": str(rank),
                "WORLD_SIZE": str(nodes * local),
                "LOCAL_RANK": str(rank // nodes if interleaved else rank % local),
                "LOCAL_WORLD_SIZE": str(local),
                "FF_HFREDUCE_NODE_RANK": str(rank % nodes if interleaved else rank // local),
                "OMP_NUM_THREADS": "1",
                **(env or {}),
            }
            procs.append(forks.start([sys.executable, str(worker), scenario, str(out)], env=penv))
        deadline = time.monotonic() + timeout_s
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [json.loads(o.read_text()) if o.exists() else {"crash": f"no report {o.name}"} for o in outs]


@pytest.fixture
def torch_launch(torch_forks: ForkServer, tmp_path: Path) -> TorchLaunch:
    """``launch_torch`` into this test's temporary folder."""
    return lambda *args, **kwargs: launch_torch(torch_forks, tmp_path, *args, **kwargs)
