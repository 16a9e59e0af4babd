"""Storage linearizability under crashes, with update ids on and off (the longer run of the suite's test).

Each run starts a real cluster (mgmtd and three storage services as processes, a chain of 3, as the
integration tests do), runs ``ff_testing.chaos.run_chaos`` (writers and readers on a few shared chunks, each
write a unique value; a storage service SIGKILLed every few seconds and restarted) for ``--duration`` seconds,
and checks the recorded history with ``ff_storage.core.linearizability.check_history``. It prints, per mode,
the time run, the operations, kills, unknown-outcome writes, the verdict, and for a violation the operations
no order explains. Without update ids (``--update-ids false`` on every storage service) a write retried after
the head died can be committed a second time after other writers' acknowledged writes, which readers see as
X -> Y -> X; the run stops at the first violation (whether a kill lands between the replicas' commit and the
head's answer is chance: 10-40 s on a quiet machine). With update ids the run goes the whole duration.

    .venv/bin/python bench/storage_linearizability.py                   # 2 x 120 s
    .venv/bin/python bench/storage_linearizability.py --duration 600 --modes off
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from ff_storage.core.linearizability import check_history
from ff_testing.chaos import run_chaos
from ff_testing.cluster import start_cluster


async def one_run(folder: Path, ids_on: bool, duration_s: float, seed: int) -> bool:
    cluster = await start_cluster(folder, targets_per_disk=1, extra={"update-ids": str(ids_on).lower()})
    began = time.monotonic()
    try:
        stats = await run_chaos(
            cluster,
            duration_s=duration_s,
            seed=seed,
            kill_every_s=(1.0, 3.0),
            down_for_s=(0.5, 2.0),
            stop_when=None if ids_on else (lambda h: not check_history(h).ok),
        )
    finally:
        for node in cluster.nodes:
            node.kill()
        cluster.stop()
    ran = time.monotonic() - began
    checked = time.monotonic()
    verdict = check_history(stats.history)
    print(
        f"update ids {'on ' if ids_on else 'off'}: {ran:.0f} s, {len(stats.history)} operations ({stats.writes_ok} "
        f"writes acknowledged, {stats.writes_unknown} of unknown outcome, {stats.reads_ok} reads), {stats.kills} "
        f"kills; checked in {time.monotonic() - checked:.1f} s: {verdict.describe()}",
        flush=True,
    )
    return verdict.ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of kills per run")
    parser.add_argument("--modes", choices=["both", "on", "off"], default="both")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    modes = {"both": [True, False], "on": [True], "off": [False]}[args.modes]
    with tempfile.TemporaryDirectory(prefix="ff-lin-") as tmp:
        for n, ids_on in enumerate(modes):
            asyncio.run(one_run(Path(tmp) / f"run{n}", ids_on, args.duration, args.seed))


if __name__ == "__main__":
    main()
