"""One rank of a test of misused torch.distributed calls on backend "hfreduce": ``python torch_misuse_worker.py
CASE OUT_JSON``. The rank reports what the call raised (type and message), then whether the group still works."""

from __future__ import annotations

import datetime
import gc
import json
import os
import sys
import threading
from typing import Any

import torch
import torch.distributed as dist

import hfreduce.distributed  # noqa: F401 (registers the backend)


def call(case: str, rank: int) -> Any:
    if case == "meta":
        dist.all_reduce(torch.ones(10, device="meta"))
    elif case == "expanded":  # claims 2**31 + 5 elements over one float: must be refused, not staged (8 GiB)
        dist.all_reduce(torch.ones(1).expand(2**31 + 5))
    elif case == "a2a_splits":  # rank 0 wants 7 and 3 rows from ranks 0 and 1, which send it 5 each
        out, inp = torch.zeros(10), torch.arange(10, dtype=torch.float32)
        dist.all_to_all_single(out, inp, [7, 3] if rank == 0 else [5, 5], [5, 5])
    elif case == "recreate":  # destroy the default group and make it again, six times; count what is held
        held = []
        for _ in range(6):
            dist.destroy_process_group()
            gc.collect()  # what the destroyed group holds goes now, not whenever the collector runs
            dist.init_process_group("hfreduce", timeout=datetime.timedelta(seconds=60))
            t = torch.ones(4)
            dist.all_reduce(t)
            held.append(
                {"sum": t.tolist(), "threads": threading.active_count(), "fds": len(os.listdir("/proc/self/fd"))}
            )
        return held
    else:
        raise ValueError(case)


def main() -> None:
    case, out_path = sys.argv[1], sys.argv[2]
    rank = int(os.environ["RANK"])
    dist.init_process_group("hfreduce", timeout=datetime.timedelta(seconds=60))
    result: dict[str, Any] = {"rank": rank}
    try:
        result["held"] = call(case, rank)
        result["error"] = None
    except Exception as exc:
        result.update(error=type(exc).__name__, message=str(exc))
    t = torch.ones(4)
    dist.all_reduce(t)  # the group still works: the misuse was refused before anything moved
    result["after"] = t.tolist()
    dist.destroy_process_group()
    with open(out_path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(out_path + ".tmp", out_path)


if __name__ == "__main__":
    main()
