"""The command line each planned instance is started with."""

from __future__ import annotations

import sys
from pathlib import Path

from ff_appliance.lifecycle import stop_waves
from ff_appliance.services import MGMTD, SERVICES, LaunchContext, command, default_counts, spec_for
from ff_appliance.state import ClusterPlan, InstancePlan, StateDir
from ff_config.ports import port_in_use


def _plan() -> ClusterPlan:
    return ClusterPlan(
        instances=(
            InstancePlan(name="mgmtd-1", service="mgmtd", node_id=1, grpc_port=7001, metrics_port=7002),
            InstancePlan(name="mgmtd-2", service="mgmtd", node_id=2, grpc_port=7003, metrics_port=7004),
        )
    )


def _flags(argv: list[str]) -> dict[str, str]:
    return dict(zip(argv[3::2], argv[4::2], strict=True))


def test_mgmtd_instances_share_one_data_dir_and_keep_their_identity(tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    ctx = LaunchContext(state=state, plan=_plan(), log_level="DEBUG")
    spec = spec_for(ctx.plan.find("mgmtd-2"))
    argv = command(spec, ctx, ctx.plan.find("mgmtd-2"))
    assert argv[:3] == [sys.executable, "-m", "ff_mgmtd"]
    assert _flags(argv) == {
        "--listen-address": "127.0.0.1:7003",
        "--metrics-address": "127.0.0.1:7004",
        "--node-id": "2",
        "--instance-id": "mgmtd-2",
        "--cluster-token-file": str(state.cluster_token_file),
        "--ready-file": str(state.ready_file("mgmtd-2")),
        "--log-level": "DEBUG",
        "--state-dir": str(state.data_dir("mgmtd")),
    }
    assert state.process_marker("mgmtd-2") in argv


def test_mgmtd_addresses_and_defaults() -> None:
    ctx = LaunchContext(state=StateDir(Path("/s")), plan=_plan())
    assert ctx.mgmtd_addresses == ["127.0.0.1:7001", "127.0.0.1:7003"]
    assert next(iter(default_counts())) == MGMTD  # mgmtd starts first: everything registers with it
    assert SERVICES[0].node_type_name == "MGMTD"


def test_telemetry_starts_after_the_scheduler_and_before_the_agents_with_a_free_http_port(tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    plan = ClusterPlan(
        instances=(
            *_plan().instances,
            InstancePlan(name="telemetry-1", service="telemetry", node_id=3, grpc_port=7005, metrics_port=7006),
        )
    )
    ctx = LaunchContext(state=state, plan=plan)
    instance = plan.find("telemetry-1")
    argv = command(spec_for(instance), ctx, instance)
    assert argv[:3] == [sys.executable, "-m", "ff_telemetry"]
    flags = _flags(argv)
    assert flags["--mgmtd-addresses"] == "127.0.0.1:7001,127.0.0.1:7003"
    assert flags["--state-dir"] == str(state.data_dir("telemetry"))
    assert flags["--http-address"] == "127.0.0.1:0"
    assert flags["--listen-address"] == "127.0.0.1:7005"
    order = list(default_counts())
    assert order.index("scheduler") < order.index("telemetry") < order.index("agent")
    assert default_counts()["telemetry"] == 1
    # its start overlaps the agents' (they retry their pushes until it registers); no other service overlaps
    assert [s.name for s in SERVICES if s.overlaps_next] == ["telemetry"]


def test_down_stops_agents_first_then_the_independent_services_together_then_storage_then_mgmtd() -> None:
    order = [s.name for s in reversed(SERVICES)]
    assert stop_waves(["retired", *order]) == [
        ["retired"],
        ["agent"],
        ["telemetry", "scheduler", "meta"],
        ["storage"],
        ["mgmtd"],
    ]


def test_the_scheduler_gives_ranks_a_master_port_free_at_its_start(tmp_path: Path) -> None:
    plan = ClusterPlan(
        instances=(
            *_plan().instances,
            InstancePlan(name="scheduler-1", service="scheduler", node_id=3, grpc_port=7005, metrics_port=7006),
        )
    )
    ctx = LaunchContext(state=StateDir(tmp_path), plan=plan)
    instance = plan.find("scheduler-1")
    port = int(_flags(command(spec_for(instance), ctx, instance))["--master-port"])
    assert port != 2222 and not port_in_use(port)  # not HAI's fixed one another cluster may hold
