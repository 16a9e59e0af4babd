"""Status verdicts and table formatting."""

from __future__ import annotations

from dataclasses import replace

from ff_appliance.health import Health
from ff_appliance.status import ClusterStatus, NodeRow, ServiceRow, format_table, render_status


def _service(name: str, node_id: int, *, primary: bool | None, pid: int | None = 100) -> ServiceRow:
    return ServiceRow(
        instance=name,
        service="mgmtd",
        node_id=node_id,
        pid=pid,
        grpc_address=f"127.0.0.1:{7000 + node_id}",
        metrics_url="",
        health=Health.SERVING if pid else Health.UNREACHABLE,
        primary=primary,
    )


def _node(node_id: int, status: str = "ALIVE") -> NodeRow:
    return NodeRow(
        node_id=node_id,
        node_type="MGMTD",
        instance=f"mgmtd-{node_id}",
        hostname="h",
        status=status,
        enabled=True,
        heartbeat_age_s=0.5,
    )


HEALTHY = ClusterStatus(
    state_dir="/s",
    cluster_id="c1",
    routing_version=3,
    services=(_service("mgmtd-1", 1, primary=True), _service("mgmtd-2", 2, primary=False)),
    nodes=(_node(1), _node(2)),
)


def test_healthy_cluster() -> None:
    assert HEALTHY.problems() == []
    assert HEALTHY.healthy
    assert HEALTHY.to_dict()["healthy"] is True
    assert HEALTHY.to_dict()["services"][0]["health"] == "SERVING"


def test_each_problem_is_named() -> None:
    status = replace(
        HEALTHY,
        services=(_service("mgmtd-1", 1, primary=None, pid=None), _service("mgmtd-2", 2, primary=False)),
        nodes=(_node(1, "DEAD"),),
    )
    assert status.problems() == [
        "mgmtd-1 is not running",
        "0 mgmtd instances say they are primary (expected exactly 1)",
        "node 1 (mgmtd-1) is DEAD",
        "node 2 (mgmtd-2) is not registered",
    ]
    assert not status.healthy


def test_two_primaries_and_no_routing_info_are_problems() -> None:
    status = replace(
        HEALTHY,
        services=(_service("mgmtd-1", 1, primary=True), _service("mgmtd-2", 2, primary=True)),
        nodes=(),
        routing_error="UNAVAILABLE: no primary",
    )
    assert status.problems() == [
        "2 mgmtd instances say they are primary (expected exactly 1)",
        "routing info unavailable: UNAVAILABLE: no primary",
    ]


def test_format_table_aligns_columns_and_renders_values() -> None:
    table = format_table(["id", "name", "ok"], [[1, "alpha", True], [22, None, False]])
    assert table.splitlines() == [
        "id  name   ok",
        "1   alpha  yes",
        "22  -      no",
    ]


def test_render_status_shows_both_tables_and_the_verdict() -> None:
    text = render_status(HEALTHY)
    assert "cluster c1  routing version 3" in text
    assert "mgmtd-2   100  yes      127.0.0.1:7002  SERVING  no" in text
    assert "2     MGMTD  mgmtd-2   h         ALIVE   yes      0.5s ago" in text
    assert text.endswith("healthy")
    broken = render_status(replace(HEALTHY, nodes=(_node(1),)))
    assert broken.endswith("NOT healthy:\n  - node 2 (mgmtd-2) is not registered")
