"""deploy/grafana/fireflyer.json: every metric a panel queries is one the code defines (a name a service
pushes, or a prometheus-client metric with its exposition suffixes), so the dashboard cannot silently rot."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[4]
DASHBOARD = ROOT / "deploy" / "grafana" / "fireflyer.json"
OUR_METRIC = re.compile(r"\b(?:ff|hfai)_[a-z0-9_]+\b")
LITERAL = re.compile(r"""["']((?:ff|hfai)_[a-z0-9_]+)["']""")
CLIENT_METRIC = re.compile(r"""\b(Counter|Histogram|Summary)\(\s*["']([a-zA-Z_:][a-zA-Z0-9_:]*)["']""")
SUFFIXES = {"Counter": ("_total",), "Histogram": ("_bucket", "_sum", "_count"), "Summary": ("_sum", "_count")}


def names_in_code() -> set[str]:
    """String literals that are whole metric names in the services' and libraries' sources, and the series
    names prometheus-client exposes for the Counter/Histogram/Summary objects made there."""
    names: set[str] = set()
    for folder in ("services", "libs"):
        for path in (ROOT / folder).glob("*/src/**/*.py"):
            if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):  # generated: no metric is defined there
                continue
            text = path.read_text()
            names.update(m[1] for m in LITERAL.finditer(text))
            for kind, name in CLIENT_METRIC.findall(text):
                names.update(name + suffix for suffix in SUFFIXES[kind])
    return names


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))
    return [p for p in found if p["type"] != "row"]


def test_every_panel_queries_metrics_the_code_defines() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    known = names_in_code()
    assert {"ff_rpc_requests_total", "ff_rpc_request_duration_seconds_bucket", "hfai_loss"} <= known
    checked = 0
    for panel in panels(dashboard):
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            used = set(OUR_METRIC.findall(target["expr"]))
            assert used, f"{panel['title']}: {target['expr']!r} names none of our metrics"
            assert used <= known, f"{panel['title']}: {sorted(used - known)} are not defined anywhere in the code"
            checked += 1
    assert checked >= 20


def test_panels_have_unique_ids_and_use_the_datasource_variable() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert any(v["name"] == "datasource" for v in dashboard["templating"]["list"])
    for panel in panels(dashboard):
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
