"""``fireflyer alerts``: the telemetry service's alert log (ListAlerts), found through mgmtd."""

from __future__ import annotations

import time

from ff_appliance.lifecycle import ApplianceError
from ff_appliance.status import format_table
from ff_appliance.telemetry_setup import telemetry_endpoints
from ff_cluster import MgmtdClient
from ff_rpc.client import one_call
from fireflyer.telemetry.v1 import telemetry_pb2 as pb
from fireflyer.telemetry.v1.telemetry_client import TelemetryServiceClient

STATES = {"any": pb.ALERT_STATE_UNSPECIFIED, "firing": pb.ALERT_STATE_FIRING, "resolved": pb.ALERT_STATE_RESOLVED}


async def list_alerts(
    mgmtd: MgmtdClient, token: str, *, state: str = "any", rule: str = "", since_s: float = 0.0, limit: int = 100
) -> pb.ListAlertsResponse:
    """Alerts newest first (``since_s``: only those firing or resolved in the last that many seconds)."""
    address = (await telemetry_endpoints(mgmtd)).get("grpc", "")
    if not address:
        raise ApplianceError("no telemetry instance is registered with mgmtd (is the cluster up?)")
    request = pb.ListAlertsRequest(
        state=STATES[state], rule=rule, since_at=time.time() - since_s if since_s else 0.0, page_size=limit
    )
    response: pb.ListAlertsResponse = await one_call(
        address, TelemetryServiceClient, lambda c: c.list_alerts(request), token=token
    )
    return response


def render_alerts(resp: pb.ListAlertsResponse) -> str:
    """The alerts as a table (times in local time), with a hint when ``limit`` cut the list short."""
    if not resp.alerts:
        return f"no alerts (rules version {resp.config_version})"
    rows = [
        [
            a.alert_id,
            "firing" if not a.resolved_at else "resolved",
            a.severity,
            a.rule,
            _when(a.fired_at),
            _when(a.resolved_at) if a.resolved_at else "-",
            a.summary,
        ]
        for a in resp.alerts
    ]
    return format_table(["id", "state", "severity", "rule", "fired", "resolved", "summary"], rows) + _more(resp)


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def _more(resp: pb.ListAlertsResponse) -> str:
    return "\n(more: raise --limit)" if resp.next_page_token else ""
