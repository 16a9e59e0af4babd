"""Linearizability under storage crashes: writers and readers on shared chunks while the storage services
heading the chains are SIGKILLed and restarted at random times; every operation's start, end and result is
recorded and checked per chunk as a register (``core.linearizability``): with update ids, no violation.

Without update ids the same workload finds the duplicate commit they prevent (X -> Y -> X) within 10-40 s on
a quiet machine, but not reliably within CI's time on a loaded one; that run is bench/storage_linearizability.py
(``--modes off``). In the suite, test_exactly_once.py shows it deterministically (and the checker finding it
in that history), and the checker's unit tests include a history recorded by that bench."""

from __future__ import annotations

from pathlib import Path

from ff_storage.core.linearizability import check_history
from ff_testing.chaos import run_chaos
from ff_testing.cluster import start_cluster, tail_logs

RUN_S = 30.0  # about 10 head kills (one every 1-3 s), a few hundred operations


async def test_reads_and_writes_stay_linearizable_while_chain_heads_are_killed(tmp_path: Path) -> None:
    cluster = await start_cluster(tmp_path / "cluster", targets_per_disk=1)
    try:
        stats = await run_chaos(cluster, duration_s=RUN_S, seed=17, kill_every_s=(1.0, 3.0), down_for_s=(0.5, 2.0))
    except BaseException:
        print(tail_logs(cluster.folder))
        raise
    finally:
        for node in cluster.nodes:  # no graceful stop needed (nor waited for)
            node.kill()
        cluster.stop()
    verdict = check_history(stats.history)
    assert verdict.ok, verdict.describe()
    counts = (stats.kills, stats.writes_ok, stats.reads_ok)
    assert counts[0] >= 3 and counts[1] >= 30 and counts[2] >= 30, f"kills, writes, reads: {counts}"
