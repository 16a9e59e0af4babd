"""One rank of a torch.distributed test, as its own process: ``python torch_worker.py SCENARIO OUT_JSON``.

The layout comes from the environment as torchrun would set it (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE) plus FF_HFREDUCE_NODE_RANK, which makes ranks on this one host count as
different nodes. Each scenario writes a JSON report the test asserts on.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
TIMEOUT = datetime.timedelta(seconds=float(os.environ.get("TEST_TIMEOUT_S", "20")))


def scenario_rendezvous() -> dict[str, Any]:
    """group_from_store on the store of a gloo default group, as haiscale does: layout and an allreduce."""
    from hfreduce.distributed import group_from_store, join_store

    dist.init_process_group("gloo", rank=RANK, world_size=WORLD, timeout=TIMEOUT)
    store = dist.distributed_c10d._get_default_store()
    group = group_from_store(store, RANK, WORLD, prefix="test-a", timeout_s=20)
    buf = torch.full((1000,), float(RANK + 1))
    group.allreduce(buf)
    second, layout = join_store(store, RANK, WORLD, prefix="test-b", timeout_s=20)
    buf2 = torch.full((10,), float(RANK))
    second.allreduce(buf2, op="max")
    report = {
        "hf_rank": group.rank,
        "node_rank": group.config.node_rank,
        "local_rank": group.config.local_rank,
        "num_nodes": group.config.num_nodes,
        "local_world_size": group.config.local_world_size,
        "sum": buf.tolist()[:3],
        "max": buf2.tolist()[:3],
        "torch_ranks": list(layout.torch_ranks),
    }
    second.close()
    group.close()
    dist.destroy_process_group()
    return report


def scenario_rendezvous_missing() -> dict[str, Any]:
    """Rank WORLD-1 never calls group_from_store: the others raise RendezvousError naming it."""
    from hfreduce import RendezvousError
    from hfreduce.distributed import group_from_store

    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), WORLD, RANK == 0, timeout=TIMEOUT)
    if RANK == WORLD - 1:
        time.sleep(4)
        return {"skipped": True}
    start = time.monotonic()
    try:
        group_from_store(store, RANK, WORLD, timeout_s=1.5)
    except RendezvousError as exc:
        return {
            "error": type(exc).__name__,
            "message": str(exc),
            "missing": list(exc.missing_ranks),
            "elapsed_s": time.monotonic() - start,
        }
    return {"error": None}


SCENARIOS: dict[str, Callable[[], dict[str, Any]]] = {
    name.removeprefix("scenario_"): fn for name, fn in globals().items() if name.startswith("scenario_")
}


def main() -> None:
    scenario, out = sys.argv[1], sys.argv[2]
    try:
        report = SCENARIOS[scenario]()
    except BaseException as exc:
        report = {"crash": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    with open(out, "w") as f:
        json.dump(report, f)
    os._exit(0)  # do not wait for torch's or hfreduce's background threads


if __name__ == "__main__":
    main()
