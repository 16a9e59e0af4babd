"""The alert log: conditions become alerts once they held ``for_s``, and resolve when they are gone.

Every change (fired, resolved) is appended to a JSON-lines file when one is given, so the log and the
alerts firing survive a restart of the service (the file is replayed at start).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from pathlib import Path

from ff_telemetry.alerts.conditions import Condition
from ff_telemetry.alerts.config import Rule

logger = logging.getLogger(__name__)

MAX_PAGE = 1000
DEFAULT_PAGE = 100

Key = tuple[str, tuple[tuple[str, str], ...]]  # rule name, condition labels


class AlertState(StrEnum):
    """Whether an alert's condition still holds."""

    FIRING = "firing"
    RESOLVED = "resolved"


@dataclass(frozen=True)
class AlertRecord:
    """One alert: which rule fired for which labels, when, and when it resolved (0: firing)."""

    alert_id: int
    rule: str
    kind: str
    severity: str
    labels: Mapping[str, str]
    summary: str
    fired_at: float
    config_version: int
    resolved_at: float = 0.0

    @property
    def state(self) -> AlertState:
        """Firing until it has a resolve time."""
        return AlertState.RESOLVED if self.resolved_at else AlertState.FIRING

    @property
    def key(self) -> Key:
        """The rule and the sorted labels: one alert at a time fires per key."""
        return self.rule, tuple(sorted(self.labels.items()))


@dataclass(frozen=True, kw_only=True)
class AlertFilter:
    """What ListAlerts asks for; ``visible`` says which label sets the caller may see."""

    state: AlertState | None = None
    since_at: float = 0.0
    rule: str = ""
    visible: Callable[[Mapping[str, str]], bool] = field(default=lambda labels: True)


class AlertLog:
    """Alerts, oldest first in memory (at most ``max_kept``: the oldest resolved ones go first)."""

    def __init__(self, path: Path | None = None, max_kept: int = 10_000) -> None:
        self.path = path
        self.max_kept = max_kept
        self._records: dict[int, AlertRecord] = {}
        self._firing: dict[Key, int] = {}
        self._pending: dict[Key, float] = {}
        self._next_id = 1
        if path is not None and path.exists():
            self._replay(path)

    def firing(self) -> list[AlertRecord]:
        """The alerts firing now, oldest first."""
        return [self._records[i] for i in self._firing.values()]

    def update(self, rule: Rule, found: Iterable[Condition], now: float, config_version: int) -> list[AlertRecord]:
        """Apply one evaluation of ``rule``; the alerts that fired or resolved by it."""
        current = {(rule.name, c.key): c for c in found}
        changes = [self._resolve(key, now) for key in list(self._firing) if key[0] == rule.name and key not in current]
        for key in [k for k in self._pending if k[0] == rule.name and k not in current]:
            del self._pending[key]
        for key, cond in current.items():
            if key in self._firing:
                continue
            since = self._pending.setdefault(key, now)
            if now - since >= rule.for_s:
                del self._pending[key]
                changes.append(self._fire(key, rule, cond, now, config_version))
        return changes

    def retire(self, rule_names: Sequence[str], now: float) -> list[AlertRecord]:
        """Resolve the alerts of rules that are no longer in the config."""
        gone = [key for key in self._firing if key[0] not in rule_names]
        self._pending = {k: v for k, v in self._pending.items() if k[0] in rule_names}
        return [self._resolve(key, now) for key in gone]

    def list(self, flt: AlertFilter, page_size: int = 0, page_token: str = "") -> tuple[list[AlertRecord], str]:
        """Newest first; ``page_token`` is the id to continue below (ValueError when it is not one)."""
        size = min(page_size or DEFAULT_PAGE, MAX_PAGE)
        below = int(page_token) if page_token else None
        out: list[AlertRecord] = []
        for alert_id in sorted(self._records, reverse=True):
            rec = self._records[alert_id]
            if below is not None and alert_id >= below:
                continue
            if self._matches(rec, flt):
                if len(out) == size:
                    return out, str(out[-1].alert_id)
                out.append(rec)
        return out, ""

    @staticmethod
    def _matches(rec: AlertRecord, flt: AlertFilter) -> bool:
        if flt.state is not None and rec.state is not flt.state:
            return False
        if flt.rule and rec.rule != flt.rule:
            return False
        if flt.since_at and rec.fired_at < flt.since_at and (not rec.resolved_at or rec.resolved_at < flt.since_at):
            return False
        return flt.visible(rec.labels)

    def _fire(self, key: Key, rule: Rule, cond: Condition, now: float, version: int) -> AlertRecord:
        rec = AlertRecord(
            alert_id=self._next_id,
            rule=rule.name,
            kind=rule.kind.value,
            severity=rule.severity.value,
            labels=dict(cond.labels),
            summary=cond.summary,
            fired_at=now,
            config_version=version,
        )
        self._next_id += 1
        self._firing[key] = rec.alert_id
        self._keep(rec)
        logger.warning("alert firing: %s: %s", rec.rule, rec.summary, extra={"alert_id": rec.alert_id})
        return rec

    def _resolve(self, key: Key, now: float) -> AlertRecord:
        rec = replace(self._records[self._firing.pop(key)], resolved_at=now)
        self._keep(rec)
        logger.info("alert resolved: %s: %s", rec.rule, rec.summary, extra={"alert_id": rec.alert_id})
        return rec

    def _keep(self, rec: AlertRecord) -> None:
        self._records[rec.alert_id] = rec
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(json.dumps({**asdict(rec), "labels": dict(rec.labels)}) + "\n")
        if len(self._records) > self.max_kept:
            oldest = next((i for i, r in self._records.items() if r.resolved_at), None)
            if oldest is not None:
                del self._records[oldest]

    def _replay(self, path: Path) -> None:
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines, 1):
            try:
                rec = AlertRecord(**json.loads(line))
            except (ValueError, TypeError) as exc:
                logger.warning("alert log %s line %d is not an alert (%s): skipped", path, number, exc)
                continue
            self._records[rec.alert_id] = rec
            self._next_id = max(self._next_id, rec.alert_id + 1)
            if rec.resolved_at:
                self._firing.pop(rec.key, None)
            else:
                self._firing[rec.key] = rec.alert_id
        self._trim()
        if len(lines) > 2 * len(self._records):
            self._rewrite(path)

    def _trim(self) -> None:
        resolved = [i for i, r in self._records.items() if r.resolved_at]
        for alert_id in resolved[: max(0, len(self._records) - self.max_kept)]:
            del self._records[alert_id]

    def _rewrite(self, path: Path) -> None:
        """The file holds one line per change: at start it is written again with what is kept (atomically)."""
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("w") as f:
            for rec in self._records.values():
                f.write(json.dumps({**asdict(rec), "labels": dict(rec.labels)}) + "\n")
        tmp.replace(path)
