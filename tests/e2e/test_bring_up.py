"""up -> every service healthy and registered -> down -> up -> the same cluster and nodes."""

from __future__ import annotations

import json
import re
import stat
import time
import urllib.request
from typing import Any

from ff_appliance.supervisor import pid_alive

from .conftest import Appliance


def _healthy_status(app: Appliance) -> dict[str, Any]:
    result = app.run("status", "--json")
    status = result.json()
    assert result.code == 0, status["problems"]
    assert status["healthy"] is True
    for service in status["services"]:
        assert service["pid"] is not None
        assert service["health"] == "SERVING"
    planned = {s["node_id"] for s in status["services"]}
    alive = {n["node_id"] for n in status["nodes"] if n["status"] == "ALIVE"}
    assert planned <= alive
    return status


def _telemetry_scraped_mgmtd(app: Appliance, up_out: str) -> None:
    """`up` printed telemetry's /federate URL, and it holds mgmtd's scraped RPC counters."""
    url = re.search(r"telemetry: .* Prometheus exposition at (http://\S+/federate)", up_out)
    assert url is not None, up_out
    token = (app.state_dir / "secrets" / "admin_token").read_text().strip()
    request = urllib.request.Request(url.group(1), headers={"Authorization": f"Bearer {token}"})
    deadline = time.monotonic() + 30
    while True:
        with urllib.request.urlopen(request, timeout=5) as resp:
            text = resp.read().decode()
        if 'job="mgmtd"' in text or time.monotonic() > deadline:
            break
        time.sleep(0.2)  # the next scrape of mgmtd, not a fixed wait once it is there
    assert "# TYPE ff_rpc_requests_total counter" in text and 'job="mgmtd"' in text


def test_up_status_down_up_keeps_the_cluster(appliance: Appliance) -> None:
    first_up = appliance.ok("up")
    assert "is up" in first_up.out
    assert str(appliance.state_dir / "secrets" / "admin_token") in first_up.out
    plan_text = (appliance.state_dir / "plan.json").read_text()
    before = _healthy_status(appliance)
    assert [n["node_type"] for n in before["nodes"]] == [
        "MGMTD", "STORAGE", "STORAGE", "STORAGE", "META", "SCHEDULER", "TELEMETRY", "AGENT", "AGENT",
    ]  # fmt: skip
    assert "storage: created 2 chains of 3 (6 targets), all serving" in first_up.out
    assert before["cluster_id"] and before["cluster_id"] in first_up.out
    for secret in ("cluster_token", "admin_token"):
        assert stat.S_IMODE((appliance.state_dir / "secrets" / secret).stat().st_mode) == 0o600
    assert (appliance.state_dir / "logs" / "mgmtd-1.log").stat().st_size > 0
    pids = appliance.pids()
    assert sorted(pids) == [
        "agent-1",
        "agent-2",
        "meta-1",
        "mgmtd-1",
        "scheduler-1",
        "storage-1",
        "storage-2",
        "storage-3",
        "telemetry-1",
    ]
    _telemetry_scraped_mgmtd(appliance, first_up.out)

    again = appliance.ok("up")  # already running: no second copy
    assert "mgmtd-1: already running" in again.out
    assert appliance.pids() == pids

    appliance.down_and_check()
    assert not any(pid_alive(p) for p in pids.values())
    stopped = appliance.run("status", "--json")
    assert stopped.code == 1
    assert stopped.json()["services"][0]["pid"] is None

    second_up = appliance.ok("up")  # the storage targets come back through recovery, then serve
    assert "storage: found 2 chains of 3 (6 targets), all serving" in second_up.out
    after = _healthy_status(appliance)
    assert after["cluster_id"] == before["cluster_id"]
    assert [n["node_id"] for n in after["nodes"]] == [n["node_id"] for n in before["nodes"]]
    assert (appliance.state_dir / "plan.json").read_text() == plan_text  # same ports, same node ids
    assert appliance.ok("whoami").out.startswith("admin ")  # the admin token survives the restart
    appliance.down_and_check()


def test_two_mgmtd_instances_elect_exactly_one_primary(appliance: Appliance) -> None:
    appliance.ok("up", "--mgmtd", "2")
    status = _healthy_status(appliance)
    primaries = [s["instance"] for s in status["services"] if s["primary"]]
    assert len(primaries) == 1
    plan = json.loads((appliance.state_dir / "plan.json").read_text())
    mgmtd_ids = [i["node_id"] for i in plan["instances"] if i["service"] == "mgmtd"]
    assert sorted(n["node_id"] for n in status["nodes"] if n["node_type"] == "MGMTD") == sorted(mgmtd_ids)
    assert [i["name"] for i in plan["instances"] if i["service"] == "mgmtd"] == ["mgmtd-1", "mgmtd-2"]
    shrink = appliance.run("up", "--mgmtd", "1")
    assert shrink.code == 1
    assert "cannot run 1 mgmtd instance(s): the plan has 2" in shrink.err
