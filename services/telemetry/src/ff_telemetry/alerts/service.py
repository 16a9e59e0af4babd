"""The alert engine inside the telemetry service, reading the store and keeping its log in the state folder.

The collected series are read from the store, the log is kept in the service's state folder, and ListAlerts
is answered from it.

The server makes one ``AlertService.create(...)``, runs ``run(stop)`` in its TaskGroup and gives
``list_alerts`` to the servicer (its ``AlertsHandler``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from sqlalchemy.orm import Session

from ff_cluster import MgmtdClient
from ff_rpc import Principal
from ff_telemetry.alerts.conditions import SeriesFact
from ff_telemetry.alerts.config import DEFAULT_CONFIG, AlertConfig, load_config
from ff_telemetry.alerts.engine import AlertEngine
from ff_telemetry.alerts.log import AlertFilter, AlertLog, AlertRecord, AlertState
from ff_telemetry.alerts.sources import ClusterSources
from ff_telemetry.core.errors import InvalidRequest
from ff_telemetry.core.model import RAW
from ff_telemetry.store import query as reads
from ff_telemetry.store.api import TelemetryStore
from ff_telemetry.store.query import Viewer
from fireflyer.telemetry.v1 import telemetry_pb2 as pb

LOG_FILE = "alerts.jsonl"
LAST_AT_SLACK_S = 300.0
_STATES = {pb.ALERT_STATE_FIRING: AlertState.FIRING, pb.ALERT_STATE_RESOLVED: AlertState.RESOLVED}
_STATES_PB = {v: k for k, v in _STATES.items()}


class StoreMetricReader:
    """The rules' series straight from the collector's store (raw samples, every owner's)."""

    def __init__(self, store: TelemetryStore) -> None:
        self.store = store

    async def series(self, name: str, since: float, until: float) -> Sequence[SeriesFact]:
        """Every series called ``name`` with its raw points in [since, until] (unix seconds), read in a thread."""

        def read(session: Session) -> list[SeriesFact]:
            # A series' last_at is written by the store's job: look that much further back.
            found = reads.find_series(session, name, (), Viewer.everything(), active_from=since - LAST_AT_SLACK_S)
            rows = reads.rows_for(session, found, RAW, since, until)
            return [SeriesFact(dict(r.labels), tuple((row.at, row.value) for row in r.rows)) for r in rows]

        return await asyncio.to_thread(self.store.store.run, read, read_only=True)


class AlertService:
    """The alert engine with its sources, as the server runs it (see the module doc)."""

    def __init__(self, engine: AlertEngine, sources: ClusterSources) -> None:
        self.engine = engine
        self.sources = sources

    @classmethod
    def create(
        cls,
        store: TelemetryStore,
        mgmtd: MgmtdClient,
        cluster_token: str,
        state_dir: Path,
        config_path: Path = DEFAULT_CONFIG,
    ) -> AlertService:
        """Raises AlertConfigError when the config cannot be used (the service should not start)."""
        config: AlertConfig = load_config(config_path)
        state_dir.mkdir(parents=True, exist_ok=True)
        sources = ClusterSources(mgmtd, cluster_token, StoreMetricReader(store))
        return cls(AlertEngine(config, sources, AlertLog(state_dir / LOG_FILE)), sources)

    async def run(self, stop: asyncio.Event) -> None:
        """Run the engine until ``stop``, then close the sources."""
        try:
            await self.engine.run(stop)
        finally:
            await self.sources.close()

    async def list_alerts(self, request: pb.ListAlertsRequest, caller: Principal) -> pb.ListAlertsResponse:
        """ListAlerts: a user sees the cluster's alerts and their own tasks'; admins and the cluster all."""
        if request.state not in (pb.ALERT_STATE_UNSPECIFIED, *_STATES):
            raise InvalidRequest(f"state: unknown alert state {request.state}")
        if request.page_token and not request.page_token.isdigit():
            raise InvalidRequest("page_token: not one this service gave")
        flt = AlertFilter(
            state=_STATES.get(request.state),
            since_at=request.since_at,
            rule=request.rule,
            visible=(lambda labels: True) if caller.is_admin else _owned_by(caller.name),
        )
        alerts, token = self.engine.log.list(flt, request.page_size, request.page_token)
        return pb.ListAlertsResponse(
            alerts=[_alert_pb(a) for a in alerts], next_page_token=token, config_version=self.engine.config.version
        )


def _owned_by(user: str) -> Callable[[Mapping[str, str]], bool]:
    def visible(labels: Mapping[str, str]) -> bool:
        return labels.get("user", user) == user

    return visible


def _alert_pb(rec: AlertRecord) -> pb.Alert:
    return pb.Alert(
        alert_id=rec.alert_id,
        rule=rec.rule,
        kind=rec.kind,
        severity=rec.severity,
        state=_STATES_PB[rec.state],
        labels=dict(rec.labels),
        summary=rec.summary,
        fired_at=rec.fired_at,
        resolved_at=rec.resolved_at,
        config_version=rec.config_version,
    )
