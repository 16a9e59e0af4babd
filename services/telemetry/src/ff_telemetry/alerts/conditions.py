"""What is wrong now, rule by rule: a snapshot of the cluster in, conditions out (pure, no I/O).

The snapshot (``ClusterView``) holds the truth of each fact where it lives: node liveness and target
states from mgmtd, running tasks and node validations from the scheduler, training progress, losses and
storage capacity from the collected series.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ff_telemetry.alerts.config import Rule, RuleKind


@dataclass(frozen=True)
class NodeFact:
    """A registered node as mgmtd shows it."""

    node_id: int
    node_type: str  # "storage", "agent", ...
    hostname: str
    alive: bool


@dataclass(frozen=True)
class TargetFact:
    """A storage target and its public state, as mgmtd shows it."""

    target_id: int
    node_id: int
    chain_id: int
    state: str  # "serving", "syncing", "waiting", "lastsrv", "offline"


@dataclass(frozen=True)
class TaskFact:
    """A running task's current run, as the scheduler shows it (``started_at``: unix seconds)."""

    task_id: int
    user: str
    run_id: int
    started_at: float


@dataclass(frozen=True)
class ValidationFact:
    """A node's last validator verdict, as the scheduler shows it."""

    node_id: int
    hostname: str
    passed: bool
    failed_checks: tuple[str, ...] = ()


@dataclass(frozen=True)
class SeriesFact:
    """A series' samples in the window the rules look at, oldest first."""

    labels: Mapping[str, str]
    points: tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class ClusterView:
    """Every fact the rules look at, read at ``now`` (unix seconds)."""

    now: float
    nodes: Sequence[NodeFact] = ()
    targets: Sequence[TargetFact] = ()
    tasks: Sequence[TaskFact] = ()
    validations: Sequence[ValidationFact] = ()
    # hfai_step and hfai_loss series of training ranks (labels task_id, run_id, rank, user...).
    steps: Sequence[SeriesFact] = ()
    losses: Sequence[SeriesFact] = ()
    # Per storage target: (labels with target_id, used share 0..1).
    storage_used: Sequence[tuple[Mapping[str, str], float]] = ()


@dataclass(frozen=True)
class Condition:
    """One thing wrong: what it is about (labels) and a sentence for people."""

    labels: Mapping[str, str]
    summary: str
    key: tuple[tuple[str, str], ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", tuple(sorted(self.labels.items())))


def conditions(rule: Rule, view: ClusterView) -> list[Condition]:
    """The conditions of ``rule`` that hold in ``view`` (``for_s`` is the alert log's business)."""
    return _CHECKS[rule.kind](rule, view)


def _node_lost(rule: Rule, view: ClusterView) -> list[Condition]:
    return [
        Condition(
            {"node_id": str(n.node_id), "node_type": n.node_type, "node": n.hostname},
            f"{n.node_type} node {n.node_id} ({n.hostname}) is lost: no heartbeat for a whole lease",
        )
        for n in view.nodes
        if not n.alive and (not rule.node_types or n.node_type in rule.node_types)
    ]


def _target_not_serving(rule: Rule, view: ClusterView) -> list[Condition]:
    return [
        Condition(
            {"target_id": str(t.target_id), "chain_id": str(t.chain_id), "node_id": str(t.node_id)},
            f"storage target {t.target_id} of chain {t.chain_id} (node {t.node_id}) is {t.state}, not serving",
        )
        for t in view.targets
        if t.state != "serving"
    ]


def _chain_not_serving(rule: Rule, view: ClusterView) -> list[Condition]:
    chains: dict[int, list[TargetFact]] = {}
    for t in view.targets:
        chains.setdefault(t.chain_id, []).append(t)
    return [
        Condition(
            {"chain_id": str(chain_id)},
            f"chain {chain_id} has no serving target ({', '.join(f'{t.target_id}: {t.state}' for t in targets)})",
        )
        for chain_id, targets in sorted(chains.items())
        if not any(t.state == "serving" for t in targets)
    ]


def _task_no_progress(rule: Rule, view: ClusterView) -> list[Condition]:
    """A running task whose step has not moved for ``window_s``, and that has run at least that long.

    It reported steps in its current run, none of them above the highest it had reached ``window_s`` ago (or
    none at all in the window).
    """
    out = []
    since = view.now - rule.window_s
    for task in view.tasks:
        if task.started_at > since:
            continue
        series = [s for s in view.steps if s.labels.get("task_id") == str(task.task_id)]
        points = [p for s in series if s.labels.get("run_id", str(task.run_id)) == str(task.run_id) for p in s.points]
        if not points:
            continue
        before = [v for at, v in points if at <= since]
        recent = [v for at, v in points if at > since]
        if recent and (not before or max(recent) > max(before)):
            continue
        minutes = rule.window_s / 60
        out.append(
            Condition(
                {"task_id": str(task.task_id), "run_id": str(task.run_id), "user": task.user},
                f"task {task.task_id} ({task.user}) made no progress for {minutes:g} min "
                f"(step {max(v for _, v in points):g})",
            )
        )
    return out


def _validator_failed(rule: Rule, view: ClusterView) -> list[Condition]:
    return [
        Condition(
            {"node_id": str(v.node_id), "node": v.hostname},
            f"node {v.node_id} ({v.hostname}) failed validation: {', '.join(v.failed_checks) or 'failed'}",
        )
        for v in view.validations
        if not v.passed
    ]


def _storage_near_full(rule: Rule, view: ClusterView) -> list[Condition]:
    return [
        Condition(
            {k: labels[k] for k in ("target_id", "node_id") if k in labels},
            f"storage target {labels.get('target_id', '?')} is {used:.0%} full (threshold {rule.threshold:.0%})",
        )
        for labels, used in view.storage_used
        if used >= rule.threshold
    ]


def _rank_labels(labels: Mapping[str, str]) -> dict[str, str]:
    return {k: labels[k] for k in ("task_id", "run_id", "rank", "user") if k in labels}


def _loss_nan(rule: Rule, view: ClusterView) -> list[Condition]:
    out = []
    for s in view.losses:
        if s.points and not math.isfinite(s.points[-1][1]):
            labels = _rank_labels(s.labels)
            value = s.points[-1][1]
            out.append(
                Condition(labels, f"task {labels.get('task_id', '?')} rank {labels.get('rank', '?')}: loss is {value}")
            )
    return out


def _loss_exploding(rule: Rule, view: ClusterView) -> list[Condition]:
    out = []
    since = view.now - rule.window_s
    for s in view.losses:
        window = [v for at, v in s.points if at >= since and math.isfinite(v)]
        if len(window) < 2 or not s.points or not math.isfinite(s.points[-1][1]):
            continue
        last, lowest = s.points[-1][1], min(window)
        if lowest > 0 and last > rule.factor * lowest:
            labels = _rank_labels(s.labels)
            out.append(
                Condition(
                    labels,
                    f"task {labels.get('task_id', '?')} rank {labels.get('rank', '?')}: loss {last:g} is over "
                    f"{rule.factor:g}x its lowest {lowest:g} in {rule.window_s / 60:g} min",
                )
            )
    return out


_CHECKS: dict[RuleKind, Callable[[Rule, ClusterView], list[Condition]]] = {
    RuleKind.NODE_LOST: _node_lost,
    RuleKind.TARGET_NOT_SERVING: _target_not_serving,
    RuleKind.CHAIN_NOT_SERVING: _chain_not_serving,
    RuleKind.TASK_NO_PROGRESS: _task_no_progress,
    RuleKind.VALIDATOR_FAILED: _validator_failed,
    RuleKind.STORAGE_NEAR_FULL: _storage_near_full,
    RuleKind.LOSS_NAN: _loss_nan,
    RuleKind.LOSS_EXPLODING: _loss_exploding,
}
