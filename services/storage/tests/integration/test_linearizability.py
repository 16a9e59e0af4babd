"""Linearizability under storage crashes: writers and readers on shared chunks while the storage services
heading the chains are SIGKILLed and restarted at random times; every operation's start, end and result is
recorded and checked per chunk as a register. Two clusters side by side: with update ids (the default) the
history is linearizable; with them off (``--update-ids false``) the checker finds the violation they prevent,
a write retried after its head died committed a second time after another writer's acknowledged write (X ->
Y -> X). bench/storage_linearizability.py runs the same longer."""

from __future__ import annotations

import asyncio
from pathlib import Path

from ff_storage.chaos import ChaosStats, run_chaos
from ff_storage.core.linearizability import check_history
from ff_storage.testing import StorageCluster, start_cluster, tail_logs

RUN_S = 30.0
NO_IDS_MAX_S = 50.0  # ends at the first violation (after 10-40 s in the runs measured)


async def _chaos(cluster: StorageCluster, ids_on: bool) -> ChaosStats:
    try:
        return await run_chaos(cluster, duration_s=RUN_S if ids_on else NO_IDS_MAX_S, seed=17,
                               kill_every_s=(1.0, 3.0), down_for_s=(0.5, 2.0),
                               stop_when=None if ids_on else (lambda h: not check_history(h).ok))  # fmt: skip
    except BaseException:
        print(tail_logs(cluster.folder))
        raise


async def test_linearizable_with_update_ids_and_not_without(tmp_path: Path) -> None:
    clusters: list[StorageCluster] = []
    try:
        for name, on in (("ids", True), ("no-ids", False)):  # one at a time: starting is the heavy part
            clusters.append(await start_cluster(tmp_path / name, targets_per_disk=1,
                                                extra={"update-ids": str(on).lower()}))  # fmt: skip
        with_ids, without = await asyncio.gather(_chaos(clusters[0], True), _chaos(clusters[1], False))
    finally:
        for c in clusters:
            for node in c.nodes:  # no graceful stop needed (nor waited for)
                node.kill()
            c.stop()
    verdict = check_history(with_ids.history)
    assert verdict.ok, verdict.describe()
    counts = (with_ids.kills, with_ids.writes_ok, with_ids.reads_ok)
    assert counts[0] >= 2 and counts[1] >= 100 and counts[2] >= 100, f"kills, writes, reads: {counts}"
    found = check_history(without.history)
    assert not found.ok, f"no violation without update ids in {without.kills} kills ({len(without.history)} ops)"
