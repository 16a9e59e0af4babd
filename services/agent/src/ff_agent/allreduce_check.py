"""One rank of the validator's intra-node hfreduce allreduce (``python -m ff_agent.allreduce_check``).

Rank ``r`` of ``n`` contributes ``(r + 1) * arange(elems)``; every rank must get ``n(n+1)/2 * arange``.
Prints one JSON line: ``{"ok": bool, "max_error": float, "seconds": float}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from hfreduce import Group, GroupConfig


def main(argv: list[str] | None = None) -> int:
    """Run this rank's allreduce and print the JSON verdict; returns 0 even when the sum is wrong (``ok`` says)."""
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--local-rank", type=int, required=True)
    p.add_argument("--local-world-size", type=int, required=True)
    p.add_argument("--elems", type=int, default=1 << 20)
    p.add_argument("--timeout-s", type=float, default=30.0)
    a = p.parse_args(argv)
    group = Group(
        GroupConfig(
            master_addr="127.0.0.1",
            master_port=a.port,
            node_rank=0,
            num_nodes=1,
            local_rank=a.local_rank,
            local_world_size=a.local_world_size,
            timeout_s=a.timeout_s,
        )
    )
    try:
        base = np.arange(a.elems, dtype=np.float32) % 1024
        buf = base * (a.local_rank + 1)
        started = time.perf_counter()
        group.allreduce(buf)
        seconds = time.perf_counter() - started
        n = a.local_world_size
        expected = base * (n * (n + 1) // 2)
        max_error = float(np.max(np.abs(buf - expected))) if a.elems else 0.0
    finally:
        group.close()
    print(json.dumps({"ok": max_error == 0.0, "max_error": max_error, "seconds": seconds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
