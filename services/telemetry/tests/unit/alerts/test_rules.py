"""Alert rules on cluster snapshots, and the log's firing/resolved bookkeeping (pure)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from ff_telemetry.alerts.conditions import (
    ClusterView,
    NodeFact,
    SeriesFact,
    TargetFact,
    TaskFact,
    ValidationFact,
    conditions,
)
from ff_telemetry.alerts.config import AlertConfigError, Rule, RuleKind, load_config
from ff_telemetry.alerts.log import AlertFilter, AlertLog, AlertState
from ff_telemetry.alerts.sources import storage_used


def _rule(kind: RuleKind, **kw: object) -> Rule:
    return Rule.model_validate({"name": kind.value, "kind": kind, **kw})


def test_the_default_config_has_every_kind_once() -> None:
    cfg = load_config()
    assert cfg.version >= 1
    assert sorted(r.kind for r in cfg.rules) == sorted(RuleKind)


def test_a_bad_config_names_the_file_and_the_field(tmp_path: Path) -> None:
    path = tmp_path / "alerts.toml"
    path.write_text('version = 1\n[[rules]]\nname = "x"\nkind = "disk_on_fire"\n')
    with pytest.raises(AlertConfigError, match=r"alerts.toml: rules.0.kind"):
        load_config(path)
    path.write_text('version = 1\n[[rules]]\nname = "x"\nkind = "loss_nan"\n[[rules]]\nname = "x"\nkind = "loss_nan"\n')
    with pytest.raises(AlertConfigError, match="unique"):
        load_config(path)
    with pytest.raises(AlertConfigError, match="not TOML"):
        path.write_text("version = = 1")
        load_config(path)
    with pytest.raises(AlertConfigError, match=r"missing\.toml"):
        load_config(tmp_path / "missing.toml")


def test_node_lost_and_validator_failed() -> None:
    view = ClusterView(
        now=100.0,
        nodes=[NodeFact(1, "storage", "s1", True), NodeFact(2, "agent", "a1", False)],
        validations=[ValidationFact(2, "a1", False, ("gemm",)), ValidationFact(3, "a2", True)],
    )
    (lost,) = conditions(_rule(RuleKind.NODE_LOST), view)
    assert lost.labels == {"node_id": "2", "node_type": "agent", "node": "a1"}
    assert conditions(_rule(RuleKind.NODE_LOST, node_types=["storage"]), view) == []
    (failed,) = conditions(_rule(RuleKind.VALIDATOR_FAILED), view)
    assert failed.labels["node_id"] == "2" and "gemm" in failed.summary


def test_targets_and_chains_not_serving() -> None:
    view = ClusterView(
        now=0.0,
        targets=[
            TargetFact(101, 1, 1, "serving"), TargetFact(102, 2, 1, "offline"),
            TargetFact(201, 1, 2, "lastsrv"), TargetFact(202, 2, 2, "offline"),
        ],
    )  # fmt: skip
    assert [c.labels["target_id"] for c in conditions(_rule(RuleKind.TARGET_NOT_SERVING), view)] == [
        "102",
        "201",
        "202",
    ]
    (chain,) = conditions(_rule(RuleKind.CHAIN_NOT_SERVING), view)
    assert chain.labels == {"chain_id": "2"} and "201: lastsrv" in chain.summary


def _steps(task_id: int, run_id: int, points: list[tuple[float, float]]) -> SeriesFact:
    return SeriesFact({"task_id": str(task_id), "run_id": str(run_id), "rank": "0"}, tuple(points))


def test_task_without_progress_over_the_window() -> None:
    rule = _rule(RuleKind.TASK_NO_PROGRESS, window_s=60)
    tasks = [TaskFact(1, "alice", 10, 0.0), TaskFact(2, "bob", 20, 0.0), TaskFact(3, "carol", 30, 990.0)]
    steps = [
        _steps(1, 10, [(900.0, 5.0), (950.0, 6.0), (999.0, 7.0)]),  # growing
        _steps(2, 20, [(900.0, 5.0), (950.0, 6.0), (980.0, 6.0)]),  # stuck at 6 since 950 (before 940? no)
        _steps(3, 30, [(995.0, 1.0)]),  # started 10 s ago
    ]
    view = ClusterView(now=1000.0, tasks=tasks, steps=steps)
    assert conditions(rule, view) == []  # task 2 still moved within the last 60 s (950 > 940)
    later = ClusterView(now=1020.0, tasks=tasks, steps=steps)
    (stuck,) = [c for c in conditions(rule, later) if c.labels["task_id"] == "2"]
    assert stuck.labels == {"task_id": "2", "run_id": "20", "user": "bob"} and "step 6" in stuck.summary
    silent = ClusterView(now=2000.0, tasks=tasks[:1], steps=steps[:1])  # no step at all for 1000 s
    assert [c.labels["task_id"] for c in conditions(rule, silent)] == ["1"]
    other_run = ClusterView(now=2000.0, tasks=[TaskFact(1, "alice", 11, 0.0)], steps=steps[:1])
    assert conditions(rule, other_run) == []  # steps of an earlier run do not count for the new one


def test_loss_nan_and_exploding() -> None:
    labels = {"task_id": "4", "run_id": "40", "rank": "1", "user": "alice", "node": "n1"}
    nan = SeriesFact(labels, ((1.0, 2.0), (2.0, math.nan)))
    boom = SeriesFact({**labels, "rank": "2"}, ((1.0, 2.0), (2.0, 1.0), (3.0, 50.0)))
    calm = SeriesFact({**labels, "rank": "3"}, ((1.0, 2.0), (2.0, 1.0), (3.0, 1.5)))
    view = ClusterView(now=3.0, losses=[nan, boom, calm])
    (c,) = conditions(_rule(RuleKind.LOSS_NAN), view)
    assert c.labels == {"task_id": "4", "run_id": "40", "rank": "1", "user": "alice"} and "nan" in c.summary
    (e,) = conditions(_rule(RuleKind.LOSS_EXPLODING, factor=10, window_s=60), view)
    assert e.labels["rank"] == "2" and "50" in e.summary


def test_storage_near_full() -> None:
    view = ClusterView(now=0.0, storage_used=[({"target_id": "1", "x": "y"}, 0.95), ({"target_id": "2"}, 0.5)])
    (c,) = conditions(_rule(RuleKind.STORAGE_NEAR_FULL, threshold=0.9), view)
    assert c.labels == {"target_id": "1"} and "95%" in c.summary


def test_an_alert_fires_after_for_s_resolves_when_gone_and_survives_a_restart(tmp_path: Path) -> None:
    rule = _rule(RuleKind.NODE_LOST, for_s=10)
    lost = ClusterView(now=0.0, nodes=[NodeFact(2, "agent", "a1", False)])
    log = AlertLog(tmp_path / "alerts.jsonl")
    assert log.update(rule, conditions(rule, lost), 100.0, 1) == []  # pending
    assert log.update(rule, conditions(rule, lost), 105.0, 1) == []
    (fired,) = log.update(rule, conditions(rule, lost), 110.0, 1)
    assert (fired.state, fired.fired_at, fired.config_version) == (AlertState.FIRING, 110.0, 1)
    assert log.update(rule, conditions(rule, lost), 120.0, 1) == []  # still firing: no new alert
    again = AlertLog(tmp_path / "alerts.jsonl")
    assert [a.alert_id for a in again.firing()] == [fired.alert_id]
    (resolved,) = again.update(rule, [], 130.0, 1)
    assert (resolved.alert_id, resolved.state, resolved.resolved_at) == (fired.alert_id, AlertState.RESOLVED, 130.0)
    assert again.update(rule, [], 140.0, 1) == [] and again.firing() == []
    (listed,), _ = AlertLog(tmp_path / "alerts.jsonl").list(AlertFilter())
    assert listed == resolved


def test_a_blip_shorter_than_for_s_never_fires() -> None:
    rule = _rule(RuleKind.NODE_LOST, for_s=10)
    lost = conditions(rule, ClusterView(now=0.0, nodes=[NodeFact(2, "agent", "a1", False)]))
    log = AlertLog()
    log.update(rule, lost, 0.0, 1)
    log.update(rule, [], 5.0, 1)
    assert log.update(rule, lost, 12.0, 1) == []  # pending again from 12
    assert len(log.update(rule, lost, 22.0, 1)) == 1


def test_listing_filters_pages_and_hides_other_users_alerts() -> None:
    rule = _rule(RuleKind.LOSS_NAN)
    log = AlertLog()
    losses = [
        SeriesFact({"task_id": str(i), "user": u}, ((0.0, math.nan),)) for i, u in enumerate(["alice", "bob", "alice"])
    ]
    log.update(rule, conditions(rule, ClusterView(now=0.0, losses=losses)), 0.0, 1)
    node = _rule(RuleKind.NODE_LOST)
    log.update(node, conditions(node, ClusterView(now=0.0, nodes=[NodeFact(2, "agent", "a", False)])), 5.0, 1)
    log.update(node, [], 6.0, 1)
    alice = AlertFilter(visible=lambda labels: labels.get("user", "alice") == "alice")
    page, token = log.list(alice, page_size=2)
    assert [a.alert_id for a in page] == [4, 3] and token == "3"
    page, token = log.list(alice, page_size=2, page_token=token)
    assert [a.alert_id for a in page] == [1] and token == ""
    assert [a.alert_id for a in log.list(AlertFilter(state=AlertState.RESOLVED))[0]] == [4]
    assert [a.alert_id for a in log.list(AlertFilter(since_at=2.0))[0]] == [4]
    assert [a.alert_id for a in log.list(AlertFilter(rule="node_lost"))[0]] == [4]
    with pytest.raises(ValueError):
        log.list(AlertFilter(), page_token="x")
    retired = log.retire(["node_lost"], 9.0)  # the loss rule left the config: its alerts resolve
    assert sorted(a.alert_id for a in retired) == [1, 2, 3] and log.firing() == []


def test_storage_use_is_the_file_systems_free_share() -> None:
    free = [SeriesFact({"target_id": "1"}, ((0.0, 50.0), (1.0, 5.0))), SeriesFact({"target_id": "2"}, ((1.0, 1.0),))]
    capacity = [SeriesFact({"target_id": "1"}, ((1.0, 100.0),))]  # target 2: capacity unknown, left out
    assert storage_used(free, capacity) == [({"target_id": "1"}, pytest.approx(0.95))]


def test_the_log_file_is_compacted_at_start_to_what_is_kept(tmp_path: Path) -> None:
    rule = _rule(RuleKind.NODE_LOST)
    lost = conditions(rule, ClusterView(now=0.0, nodes=[NodeFact(2, "agent", "a1", False)]))
    log = AlertLog(tmp_path / "alerts.jsonl", max_kept=3)
    for i in range(10):  # 10 alerts fired and resolved: 20 lines
        log.update(rule, lost, float(2 * i), 1)
        log.update(rule, [], float(2 * i + 1), 1)
    log.update(rule, lost, 100.0, 1)  # one still firing
    assert len((tmp_path / "alerts.jsonl").read_text().splitlines()) == 21
    again = AlertLog(tmp_path / "alerts.jsonl", max_kept=3)
    kept, _ = again.list(AlertFilter())
    assert [a.alert_id for a in kept] == [11, 10, 9] and kept[0].state is AlertState.FIRING
    assert len((tmp_path / "alerts.jsonl").read_text().splitlines()) == 3
    assert [a.alert_id for a in AlertLog(tmp_path / "alerts.jsonl").firing()] == [11]
