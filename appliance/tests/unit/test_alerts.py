"""How ``fireflyer alerts`` prints the alert log."""

from __future__ import annotations

from ff_appliance.alerts import render_alerts
from fireflyer.telemetry.v1 import telemetry_pb2 as pb


def test_alerts_print_as_a_table_newest_first_with_their_state() -> None:
    resp = pb.ListAlertsResponse(
        config_version=3,
        alerts=[
            pb.Alert(
                alert_id=2,
                rule="node-lost",
                severity="critical",
                summary="agent node 7 (a1) is lost",
                fired_at=1_700_000_100.0,
            ),
            pb.Alert(
                alert_id=1,
                rule="loss-nan",
                severity="critical",
                summary="loss is nan",
                fired_at=1_700_000_000.0,
                resolved_at=1_700_000_050.0,
            ),
        ],
    )
    lines = render_alerts(resp).splitlines()
    assert lines[0].split() == ["id", "state", "severity", "rule", "fired", "resolved", "summary"]
    assert lines[1].split()[:4] == ["2", "firing", "critical", "node-lost"] and "-" in lines[1].split()
    assert lines[2].split()[:4] == ["1", "resolved", "critical", "loss-nan"] and lines[2].endswith("loss is nan")
    assert render_alerts(pb.ListAlertsResponse(config_version=3)) == "no alerts (rules version 3)"
    more = render_alerts(pb.ListAlertsResponse(alerts=resp.alerts[:1], next_page_token="1"))
    assert more.endswith("(more: raise --limit)")
