"""``fireflyer demo --tour`` (each service's calls, the demo before it trained): it passes, and passes again on the same
cluster."""

from __future__ import annotations

import re

import pytest

from .conftest import Appliance

DEMO_TIMEOUT_S = 240.0  # about 40 s each on an idle 2-core machine; a loaded CI runner can take several times that


@pytest.mark.timeout(3 * DEMO_TIMEOUT_S)
def test_demo_runs_twice(appliance: Appliance) -> None:
    first = appliance.ok("demo", "--tour", timeout_s=DEMO_TIMEOUT_S)
    for expected in (
        "[1/24] create group 'demo' and user 'demo-user' in it",
        "refused: PERMISSION_DENIED: user 'demo-user' is not an admin",
        "is refused: ABORTED:",
        "whoami with it is refused after",
        "UNAUTHENTICATED",
        "acknowledged by every chain's tail",
        "24 reads (8 chunks x 3 replicas) all equal to what was written",
        "'train-auto': 2 nodes, priority NORMAL, queued (waiting_for_nodes)",
        "'over-quota': 1 nodes, priority ABOVE_NORMAL, queued (quota_exceeded)",
        "8 nodes on this cluster: FAILED_PRECONDITION: the task asks for 8 nodes, but node group 'default' has 2",
        "StopTask of task",
        "read back byte-exact",
        "refused: EDQUOT",
        "emptied: the files' chunks are freed",
        "$ hf3fs cat /demo/tools-",
        "pd.read_parquet gave an equal frame",
        "WORLD_SIZE=2 RANK=1 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2",
        "(stage CAN_SUSPEND); checkpoint",
        "finished at step",
        "succeeded after 2 runs",
    ):
        assert expected in first.out, first.out
    assert re.search(rf"stop it with: \S*fireflyer down --state-dir {re.escape(str(appliance.state_dir))}\n", first.out)
    second = appliance.ok("demo", "--tour", timeout_s=DEMO_TIMEOUT_S)
    assert "mgmtd-1: already running" in second.out
    assert "group demo exists already: reused" in second.out
    assert "user demo-user exists already: reused" in second.out
    assert "[24/24] done" in second.out
    assert "storage: found 2 chains of 3 (6 targets), all serving" in second.out
    assert appliance.ok("status").out.rstrip().endswith("healthy")
