"""The cluster plan: created once, reused as is, grown on request, never shrunk; secrets and layout."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from ff_appliance.state import (
    ClusterPlan,
    InstancePlan,
    PlanError,
    StateDir,
    ensure_cluster_token,
    extend_plan,
    load_plan,
    read_secret,
    save_plan,
    write_secret,
)


class FakePorts:
    """Hands out increasing ports, skipping excluded ones, and records every request."""

    def __init__(self, first: int = 20000) -> None:
        self.next = first
        self.calls: list[tuple[int, frozenset[int]]] = []

    def __call__(self, count: int, exclude: set[int]) -> list[int]:
        self.calls.append((count, frozenset(exclude)))
        ports: list[int] = []
        while len(ports) < count:
            if self.next not in exclude:
                ports.append(self.next)
            self.next += 1
        return ports


DEFAULTS = {"mgmtd": 1, "meta": 1}


def test_first_plan_has_default_instances_with_distinct_ids_and_ports() -> None:
    plan = extend_plan(None, {}, DEFAULTS, FakePorts())
    assert [(i.name, i.service, i.node_id) for i in plan.instances] == [("mgmtd-1", "mgmtd", 1), ("meta-1", "meta", 2)]
    ports = [p for i in plan.instances for p in (i.grpc_port, i.metrics_port)]
    assert ports == [20000, 20001, 20002, 20003]
    assert plan.instances[0].grpc_address == "127.0.0.1:20000"
    assert plan.instances[0].metrics_url == "http://127.0.0.1:20001/metrics"


def test_count_asked_for_a_new_plan() -> None:
    plan = extend_plan(None, {"mgmtd": 3}, DEFAULTS, FakePorts())
    assert [i.name for i in plan.of_service("mgmtd")] == ["mgmtd-1", "mgmtd-2", "mgmtd-3"]
    assert [i.node_id for i in plan.instances] == [1, 2, 3, 4]


def test_existing_plan_is_reused_unchanged_without_picking_ports() -> None:
    first = extend_plan(None, {"mgmtd": 2}, DEFAULTS, FakePorts())
    picker = FakePorts(first=30000)
    again = extend_plan(first, {}, DEFAULTS, picker)
    same_count = extend_plan(first, {"mgmtd": 2, "meta": None}, DEFAULTS, picker)
    assert again is first
    assert same_count is first
    assert picker.calls == []


def test_growing_keeps_existing_instances_and_avoids_their_ports() -> None:
    first = extend_plan(None, {}, DEFAULTS, FakePorts())
    grown = extend_plan(first, {"mgmtd": 2}, DEFAULTS, FakePorts(first=20000))
    assert grown.instances[:2] == first.instances
    new = grown.find("mgmtd-2")
    assert new.node_id == 3  # ids are never reused or renumbered
    assert {new.grpc_port, new.metrics_port} == {20004, 20005}
    assert grown.created_at == first.created_at


def test_a_service_added_by_a_later_version_joins_an_old_plan() -> None:
    old = extend_plan(None, {}, {"mgmtd": 1}, FakePorts())
    grown = extend_plan(old, {}, {"mgmtd": 1, "storage": 2}, FakePorts())
    assert [(i.name, i.node_id) for i in grown.instances] == [("mgmtd-1", 1), ("storage-1", 2), ("storage-2", 3)]


@pytest.mark.parametrize("count", [0, 1])
def test_shrinking_is_refused(count: int) -> None:
    plan = extend_plan(None, {"mgmtd": 2}, DEFAULTS, FakePorts())
    with pytest.raises(PlanError, match="cannot run"):
        extend_plan(plan, {"mgmtd": count}, DEFAULTS, FakePorts())


def test_plan_round_trips_through_its_file(tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    assert load_plan(state) is None
    plan = extend_plan(None, {"mgmtd": 2}, DEFAULTS, FakePorts())
    save_plan(state, plan)
    assert load_plan(state) == plan
    assert state.plan_file.read_text() == plan.to_json()


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        '{"format_version": 99, "instances": [], "created_at": 0}',
        '{"format_version": 1}',
        '{"format_version": 1, "created_at": 0, "instances": [{"name": "x"}]}',
    ],
)
def test_bad_plan_files_are_refused_with_a_plan_error(text: str) -> None:
    with pytest.raises(PlanError):
        ClusterPlan.from_json(text)


def test_find_unknown_instance() -> None:
    plan = ClusterPlan(
        instances=(InstancePlan(name="mgmtd-1", service="mgmtd", node_id=1, grpc_port=1, metrics_port=2),)
    )
    assert plan.find("mgmtd-1").node_id == 1
    with pytest.raises(PlanError, match="no instance"):
        plan.find("mgmtd-9")


def test_layout(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "s")
    state.create_dirs()
    assert state.log_file("mgmtd-1") == tmp_path / "s" / "logs" / "mgmtd-1.log"
    assert state.pid_file("mgmtd-1") == tmp_path / "s" / "run" / "mgmtd-1.pid"
    assert state.ready_file("mgmtd-1") == tmp_path / "s" / "run" / "mgmtd-1.ready.json"
    assert state.data_dir("mgmtd") == tmp_path / "s" / "mgmtd"
    assert state.admin_token_file == tmp_path / "s" / "secrets" / "admin_token"
    assert stat.S_IMODE(state.secrets_dir.stat().st_mode) == 0o700
    assert state.process_marker("mgmtd-1") != state.process_marker("mgmtd-2")


def test_secrets_are_private_and_the_cluster_token_is_created_once(tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    token = ensure_cluster_token(state)
    assert len(token) >= 32
    assert ensure_cluster_token(state) == token
    assert stat.S_IMODE(state.cluster_token_file.stat().st_mode) == 0o600
    write_secret(state.admin_token_file, "s3cret")
    assert read_secret(state.admin_token_file) == "s3cret"
    assert stat.S_IMODE(state.admin_token_file.stat().st_mode) == 0o600
    assert read_secret(tmp_path / "missing") is None
