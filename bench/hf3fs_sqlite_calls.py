"""Where a SQLite transaction's time goes on the 3FS mount: its file-system calls, timed one by one.

Starts the bench cluster and mount (``_hf3fs_common.bench_cluster``) and replays, ``--tx`` times, the calls that
SQLite 3 makes for one transaction in journal mode delete (what ``bench/hf3fs_small_files.py``'s "sqlite calls" step
replays, there timed as a whole): the change counter read at BEGIN, the journal created, its pages written, fdatasync,
the folder's fdatasync, the journal header, fdatasync, the database's pages (one grows the file), fdatasync, close,
unlink. Prints, per call kind, the median and mean milliseconds, and the milliseconds per transaction, for
``--files`` databases in a row. Absolute times swing with the machine's load: compare two trees side by side.

    .venv/bin/python bench/hf3fs_sqlite_calls.py --tx 40
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _hf3fs_common import bench_cluster, replay_sqlite_transactions


def replay(base: Path, num_tx: int) -> tuple[float, dict[str, list[float]]]:
    """``num_tx`` transactions' calls in ``base`` (made here); (seconds in all, seconds per call by kind)."""
    times: dict[str, list[float]] = collections.defaultdict(list)

    def timed(kind: str, fn: Callable[..., Any], *args: Any) -> Any:
        t0 = time.perf_counter()
        out = fn(*args)
        times[kind].append(time.perf_counter() - t0)
        return out

    t0 = time.perf_counter()
    replay_sqlite_transactions(base, num_tx, timed)
    return time.perf_counter() - t0, times


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tx", type=int, default=40, help="transactions per database")
    p.add_argument("--files", type=int, default=2, help="databases, one after another")
    p.add_argument("--dir", type=Path, default=None, help="where the cluster lives")
    a = p.parse_args()
    with bench_cluster("hf3fs-sqlite-calls-", a.dir, with_mount=True) as c:
        if c.mount is None:
            print("no FUSE here: nothing to measure")
            return 1
        print(f"load average {os.getloadavg()[0]:.1f}")
        for n in range(a.files):
            total, times = replay(c.mount / "bench" / f"db{n}", a.tx)
            print(f"database {n + 1}: {total:.3f} s for {a.tx} transactions ({1000 * total / a.tx:.1f} ms each)")
            for kind, vals in times.items():
                med, mean = 1000 * statistics.median(vals), 1000 * statistics.mean(vals)
                print(f"  {kind:<20} median {med:7.2f} ms   mean {mean:7.2f} ms")
        print(f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
