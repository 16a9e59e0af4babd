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
from ff_storage.testing import start_cluster, tail_logs

RUN_S = 40.0
NO_IDS_MAX_S = 60.0  # ends at the first violation (10-40 s in the runs measured)


async def _run(folder: Path, ids_on: bool, duration_s: float, seed: int) -> ChaosStats:
    cluster = await start_cluster(folder, targets_per_disk=1, extra={"update-ids": str(ids_on).lower()})
    try:
        return await run_chaos(cluster, duration_s=duration_s, seed=seed, kill_every_s=(1.0, 3.0),
                               down_for_s=(0.5, 2.0),
                               stop_when=None if ids_on else (lambda h: not check_history(h).ok))  # fmt: skip
    except BaseException:
        print(tail_logs(folder))
        raise
    finally:
        cluster.stop()


async def test_linearizable_with_update_ids_and_not_without(tmp_path: Path) -> None:
    with_ids, without = await asyncio.gather(_run(tmp_path / "ids", True, RUN_S, 17),
                                             _run(tmp_path / "no-ids", False, NO_IDS_MAX_S, 17))  # fmt: skip
    verdict = check_history(with_ids.history)
    assert with_ids.kills >= 5, with_ids.kills
    assert with_ids.writes_ok >= 100 and with_ids.reads_ok >= 100, (with_ids.writes_ok, with_ids.reads_ok)
    assert verdict.ok, verdict.describe()
    found = check_history(without.history)
    assert not found.ok, f"no violation without update ids in {without.kills} kills ({len(without.history)} ops)"
