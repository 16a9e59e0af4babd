"""Linearizability under storage crashes: writers and readers on shared chunks while storage services are
SIGKILLed and restarted at random; the recorded history must be linearizable per chunk (update ids on).
The run with update ids off, which shows the violation they prevent, is bench/storage_linearizability.py."""

from __future__ import annotations

from pathlib import Path

from ff_storage.chaos import run_chaos
from ff_storage.core.linearizability import check_history
from ff_storage.testing import start_cluster, tail_logs


async def test_reads_and_writes_stay_linearizable_while_storage_services_are_killed(tmp_path: Path) -> None:
    cluster = await start_cluster(tmp_path / "cluster", targets_per_disk=1)
    try:
        stats = await run_chaos(cluster, duration_s=40.0, seed=17)
    finally:
        cluster.stop()
    verdict = check_history(stats.history)
    assert stats.kills >= 3, stats.kills
    assert stats.writes_ok >= 100 and stats.reads_ok >= 100, (stats.writes_ok, stats.reads_ok)
    assert verdict.ok, verdict.describe() + "\n" + tail_logs(cluster.folder)
