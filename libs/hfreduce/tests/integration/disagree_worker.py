"""One rank of a test where the ranks call different collectives: ``python disagree_worker.py CASE OUT_JSON``.

Rank 0 (or the last rank, or each rank: see ``call``) makes a call that differs from the others'; the rank reports
what the call raised or returned, how long it took, and what the next collective raises.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import numpy as np

from hfreduce import Group, GroupConfig


def call(group: Group, case: str) -> Any:
    """The collective of ``case`` as this rank makes it; returns what the rank would read as its result."""
    rank, last, world = group.rank, group.world_size - 1, group.world_size
    if case == "count":
        buf = np.ones(1000 if rank == 0 else 2000, dtype=np.float32)
        group.allreduce(buf)
        return buf
    if case == "small_count":  # one message, reduced by each node's local rank 0
        buf = np.ones(10 if rank == 0 else 20, dtype=np.float32)
        group.allreduce(buf)
        return buf
    if case == "dtype":
        buf = np.ones(1000, dtype=np.float16 if rank == last else np.float32)
        group.allreduce(buf)
        return buf
    if case == "reduce_op":
        buf = np.full(1000, rank + 1, dtype=np.float32)
        group.allreduce(buf, "max" if rank == last else "sum")
        return buf
    if case == "kind":
        buf = np.full(1000, rank + 1, dtype=np.float32)
        if rank == last:
            group.broadcast(buf, 0)
        else:
            group.allreduce(buf)
        return buf
    if case == "root":
        buf = np.full(1000, rank + 1, dtype=np.float32)
        group.broadcast(buf, rank)
        return buf
    if case == "allgather":
        n = 100 if rank == 0 else 150
        out = np.zeros(n * world, dtype=np.float32)
        group.allgather(out, np.full(n, rank, dtype=np.float32))
        return out
    if case == "reduce_scatter":
        n = 100 if rank == 0 else 150
        out = np.zeros(n, dtype=np.float32)
        group.reduce_scatter(out, np.full(n * world, rank + 1, dtype=np.float32))
        return out
    if case == "registered":  # each node's local rank 0 passes its registered buffer, the others a plain array
        reg = group.alloc(1000)
        reg[:] = rank + 1
        plain = np.full(1000, rank + 1, dtype=np.float32)
        buf = reg if group.config.local_rank == 0 else plain
        group.allreduce(buf)
        return buf
    raise ValueError(case)


def alloc_sizes(group: Group) -> dict[str, Any]:
    """Local rank 0 allocates a registered buffer of 1,000 elements, the others one of 2,000; then all of 500."""
    report: dict[str, Any] = {}
    try:
        group.alloc(1000 if group.config.local_rank == 0 else 2000)
        report["alloc_error"] = None
    except Exception as exc:
        report.update(alloc_error=type(exc).__name__, alloc_message=str(exc))
    buf = group.alloc(500)
    buf[:] = group.rank + 1
    group.allreduce(buf)
    report["result"] = np.asarray(buf, dtype=np.float64)[:4].tolist()
    return report


def main() -> None:
    case, out_path = sys.argv[1], sys.argv[2]
    group = Group(GroupConfig.from_env())
    result: dict[str, Any] = {"rank": group.rank}
    if case == "alloc_sizes":
        result.update(alloc_sizes(group))
        group.close()
        _write(out_path, result)
        return
    start = time.monotonic()
    try:
        got = call(group, case)
        result.update(error=None, result=np.asarray(got, dtype=np.float64)[:4].tolist())
    except Exception as exc:
        result.update(error=type(exc).__name__, message=str(exc), culprit=getattr(exc, "rank", None))
    result["elapsed_s"] = time.monotonic() - start
    try:
        group.allreduce(np.ones(4, dtype=np.float32))
        result["next"] = "returned"
    except Exception as exc:
        result["next"] = type(exc).__name__
    _write(out_path, result)
    os._exit(0)  # the group is broken; leave without waiting for peers


def _write(path: str, result: dict[str, Any]) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main()
