"""A rank dies or hangs: every other rank raises, naming it, within the timeout; nothing is left behind."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from ff_testing import free_port
from hfreduce import Group, GroupClosedError, GroupConfig
from hfreduce.counters import Counters

from .conftest import Launch

TIMEOUT_S = 3.0
SHM = Path("/dev/shm")


def shm_entries() -> set[str]:
    return set(os.listdir(SHM)) if SHM.is_dir() else set()


@pytest.mark.parametrize("pipeline", ["threads", "loop"])
@pytest.mark.parametrize(("kind", "victim"), [("kill", 3), ("kill", 0), ("hang", 2)])
def test_every_survivor_names_the_failed_rank(launch: Launch, kind: str, victim: int, pipeline: str) -> None:
    before = shm_entries()
    results = launch(
        2,
        2,
        "fault",
        env={
            "FF_HFREDUCE_TIMEOUT_S": str(TIMEOUT_S),
            "TEST_FAULT": kind,
            "TEST_VICTIM": str(victim),
            "FF_HFREDUCE_CHUNK_SIZE_BYTES": "65536",
            "FF_HFREDUCE_PIPELINE": pipeline,
        },
        timeout_s=60,
    )
    survivors = [r for i, r in enumerate(results) if i != victim]
    assert len(survivors) == 3
    for res in survivors:
        assert res["error"] == "PeerFailureError", res
        assert res["culprit"] == victim, res
        assert f"rank {victim} " in res["message"]
        limit = TIMEOUT_S if kind == "kill" else TIMEOUT_S + 2.0  # a death shows at once, a hang after the timeout
        assert res["elapsed_s"] <= limit, res
    if kind == "hang":
        status = next(r["status"] for r in survivors if r["status"] is not None)
        by_rank = {s["rank"]: s for s in status}
        assert by_rank[victim]["seq"] < max(s["seq"] for s in status)  # readable from another process
        assert by_rank[victim]["state"] == "idle"
        assert "did not enter" in survivors[0]["message"]
    else:
        assert "died" in survivors[0]["message"]
    # memfd segments never get a name in /dev/shm, even when a rank is SIGKILLed (other users of the
    # machine may add their own entries meanwhile, so only ours are checked)
    assert not [e for e in shm_entries() - before if "hfreduce" in e]


def test_rendezvous_names_the_rank_that_never_arrives(launch: Launch) -> None:
    results = launch(2, 2, "correctness", env={"FF_HFREDUCE_TIMEOUT_S": "2"}, skip_ranks=(2,), timeout_s=30)
    arrived = [r for i, r in enumerate(results) if i != 2]
    for res in arrived:
        assert res["error"] == "RendezvousError", res
        assert 2 in res["missing"], res


def test_rendezvous_fails_clearly_without_rank_zero(launch: Launch) -> None:
    results = launch(2, 1, "correctness", env={"FF_HFREDUCE_TIMEOUT_S": "1.5"}, skip_ranks=(0,), timeout_s=30)
    assert results[1]["error"] == "RendezvousError"
    assert results[1]["missing"] == [0]
    assert "rank 0" in results[1]["message"]


def test_any_error_inside_a_collective_breaks_the_group() -> None:
    """Not only link failures: whatever stops a collective midway may leave a chunk half-sent, so the group
    refuses further calls, naming the first error (a 1x1 group in this process, real control server)."""
    group = Group(GroupConfig(master_addr="127.0.0.1", master_port=free_port(), node_rank=0, num_nodes=1))
    try:
        with pytest.raises(MemoryError):
            group._rt.run("allreduce", _raise_memory_error)
        with pytest.raises(GroupClosedError, match="broken by an earlier failure"):
            group.allreduce(np.ones(4, dtype=np.float32))
    finally:
        group.close()


def _raise_memory_error() -> Counters:
    raise MemoryError("scratch buffer")
