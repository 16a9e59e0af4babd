"""One evaluation round: rules whose source could not be read keep their alerts as they are."""

from __future__ import annotations

import asyncio

from ff_telemetry.alerts.conditions import ClusterView, NodeFact, TaskFact
from ff_telemetry.alerts.config import AlertConfig
from ff_telemetry.alerts.engine import AlertEngine
from ff_telemetry.alerts.log import AlertLog, AlertState
from ff_telemetry.alerts.sources import Snapshot, Source

CONFIG = AlertConfig.model_validate(
    {
        "version": 7,
        "rules": [
            {"name": "lost", "kind": "node_lost", "severity": "critical"},
            {"name": "stuck", "kind": "task_no_progress", "window_s": 60},
        ],
    }
)


class Snapshots:
    """Answers the snapshots it is given, one per round."""

    def __init__(self, *snapshots: Snapshot) -> None:
        self.queue = list(snapshots)

    async def snapshot(self, now: float, window_s: float) -> Snapshot:
        return self.queue.pop(0)


def test_a_source_down_keeps_its_rules_alerts_and_they_resolve_once_it_answers() -> None:
    lost = ClusterView(now=0.0, nodes=[NodeFact(3, "storage", "s3", False)], tasks=[TaskFact(1, "a", 2, 0.0)])
    everything = frozenset(Source)
    rounds = Snapshots(
        Snapshot(lost, everything),
        Snapshot(ClusterView(now=0.0), frozenset({Source.SCHEDULER, Source.METRICS})),  # mgmtd unreachable
        Snapshot(ClusterView(now=0.0), everything),
    )
    clock = iter([10.0, 20.0, 30.0])
    engine = AlertEngine(CONFIG, rounds, AlertLog(), clock=lambda: next(clock))
    (fired,) = asyncio.run(engine.evaluate_once())
    assert (fired.rule, fired.severity, fired.config_version, fired.fired_at) == ("lost", "critical", 7, 10.0)
    assert asyncio.run(engine.evaluate_once()) == []  # mgmtd unknown: the node is not found again
    (resolved,) = asyncio.run(engine.evaluate_once())
    assert (resolved.alert_id, resolved.state, resolved.resolved_at) == (fired.alert_id, AlertState.RESOLVED, 30.0)
