"""The web dashboard, served by the collector's HTTP side: overview, tasks, storage, alerts.

Pages: cluster overview, tasks, a task's live curves and log, storage throughput and latency, alerts. Login
with a token; a user sees only their own tasks.
"""

from __future__ import annotations

from aiohttp import web

from ff_telemetry.dashboard.api import AlertsHandler, DashboardApi
from ff_telemetry.dashboard.cluster import ClusterReader
from ff_telemetry.dashboard.guard import Guard, add_security_headers
from ff_telemetry.dashboard.pages import DashboardPages
from ff_telemetry.dashboard.session import Authenticate, Sessions
from ff_telemetry.store.api import TelemetryStore


def install(
    app: web.Application,
    store: TelemetryStore,
    authenticate: Authenticate,
    reader: ClusterReader,
    alerts: AlertsHandler | None,
) -> None:
    """Add the dashboard's pages, API and static files to ``app``."""
    sessions = Sessions(authenticate)
    guard = Guard(sessions)
    DashboardPages(sessions, reader).install(app, guard)
    DashboardApi(store, reader, alerts).install(app, guard)
    app.on_response_prepare.append(add_security_headers)


__all__ = ["ClusterReader", "install"]
