"""The alert loop: every ``interval_s`` read a snapshot, evaluate each rule, update the log, notify."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Protocol

from ff_telemetry.alerts.conditions import conditions
from ff_telemetry.alerts.config import AlertConfig, RuleKind
from ff_telemetry.alerts.log import AlertLog, AlertRecord
from ff_telemetry.alerts.sources import Snapshot, Source
from ff_telemetry.alerts.webhook import WebhookSink

logger = logging.getLogger(__name__)

# The facts each kind of rule needs; a rule whose source could not be read keeps its alerts as they are.
RULE_SOURCES: dict[RuleKind, frozenset[Source]] = {
    RuleKind.NODE_LOST: frozenset({Source.MGMTD}),
    RuleKind.TARGET_NOT_SERVING: frozenset({Source.MGMTD}),
    RuleKind.CHAIN_NOT_SERVING: frozenset({Source.MGMTD}),
    RuleKind.TASK_NO_PROGRESS: frozenset({Source.SCHEDULER, Source.METRICS}),
    RuleKind.VALIDATOR_FAILED: frozenset({Source.SCHEDULER}),
    RuleKind.STORAGE_NEAR_FULL: frozenset({Source.METRICS}),
    RuleKind.LOSS_NAN: frozenset({Source.METRICS}),
    RuleKind.LOSS_EXPLODING: frozenset({Source.METRICS}),
}


class SnapshotSource(Protocol):
    """Where the engine reads the facts from (``sources.ClusterSources``; tests give their own)."""

    async def snapshot(self, now: float, window_s: float) -> Snapshot:
        """Every fact at ``now``, with ``window_s`` of series history; unreadable sources are left unknown."""
        ...


class AlertEngine:
    """Evaluates the config's rules every ``interval_s``, keeps the log and hands changes to the webhook sink."""

    def __init__(
        self,
        config: AlertConfig,
        sources: SnapshotSource,
        log: AlertLog,
        sink: WebhookSink | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.sources = sources
        self.log = log
        self.sink = sink or WebhookSink(config.webhooks)
        self._clock = clock
        # History the rules look at: twice the longest window (progress compares against the window before).
        self._history_s = 2 * max([r.window_s for r in config.rules] or [0.0]) + config.interval_s

    async def evaluate_once(self) -> list[AlertRecord]:
        """One round: the alerts that fired or resolved."""
        now = self._clock()
        snapshot = await self.sources.snapshot(now, self._history_s)
        changes = self.log.retire([r.name for r in self.config.rules], now)
        for rule in self.config.rules:
            if not RULE_SOURCES[rule.kind] <= snapshot.known:
                continue
            changes += self.log.update(rule, conditions(rule, snapshot.view), now, self.config.version)
        self.sink.notify(changes)
        return changes

    async def run(self, stop: asyncio.Event) -> None:
        """Evaluate every ``interval_s`` (a failing round is logged) and deliver webhooks until ``stop``."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.sink.run(stop))
            while not stop.is_set():
                try:
                    await self.evaluate_once()
                except Exception:
                    logger.exception("evaluating the alert rules failed")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.config.interval_s)
