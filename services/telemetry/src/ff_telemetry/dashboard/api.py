"""The dashboard's JSON API (``/api/...``): what the pages poll.

Scheduler and mgmtd reads carry the caller's token; series reads are filtered by the caller (a user sees the
cluster's series and their own).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from ff_rpc import Principal, RpcError
from ff_telemetry.core.model import Aggregation, RangeQuery
from ff_telemetry.core.validation import check_name
from ff_telemetry.dashboard import params, series, views
from ff_telemetry.dashboard.cluster import ClusterReader, NoScheduler
from ff_telemetry.dashboard.guard import Guard, json_response
from ff_telemetry.dashboard.session import Caller
from ff_telemetry.store.api import TelemetryStore
from ff_telemetry.store.query import Viewer
from fireflyer.telemetry.v1 import telemetry_pb2 as tpb

AlertsHandler = Callable[[tpb.ListAlertsRequest, Principal], Awaitable[tpb.ListAlertsResponse]]

MAX_WINDOW_S = 14 * 86_400.0
ALERT_STATES = {"firing": tpb.ALERT_STATE_FIRING, "resolved": tpb.ALERT_STATE_RESOLVED, "all": 0}
MAX_ALERTS = 500


def viewer_of(caller: Caller) -> Viewer:
    """What series ``caller`` may read: everything for an admin, else the cluster's and their own."""
    return Viewer(None if caller.principal.is_admin else caller.principal.name)


class DashboardApi:
    """The ``/api/...`` handlers; each answers JSON, errors as ``{"error": ...}`` with an HTTP status (``guard``)."""

    def __init__(self, store: TelemetryStore, reader: ClusterReader, alerts: AlertsHandler | None) -> None:
        self._store = store
        self._reader = reader
        self._alerts = alerts

    def install(self, app: web.Application, guard: Guard) -> None:
        """Add the API's routes to ``app``, each behind ``guard`` (401 without a session or bearer token)."""
        r = app.router
        r.add_get("/api/whoami", guard.api(self.whoami))
        r.add_get("/api/overview", guard.api(self.overview))
        r.add_get("/api/tasks", guard.api(self.tasks))
        r.add_get("/api/tasks/{task_id}", guard.api(self.task))
        r.add_get("/api/tasks/{task_id}/series", guard.api(self.task_series))
        r.add_get("/api/tasks/{task_id}/log", guard.api(self.task_log))
        r.add_get("/api/storage", guard.api(self.storage))
        r.add_get("/api/alerts", guard.api(self.alerts))
        r.add_get("/api/series", guard.api(self.series))

    async def whoami(self, request: web.Request, caller: Caller) -> web.Response:
        """``/api/whoami``: the caller's name, whether they are an admin, and their groups."""
        p = caller.principal
        return json_response({"name": p.name, "admin": p.is_admin, "groups": list(p.group_names)})

    async def overview(self, request: web.Request, caller: Caller) -> web.Response:
        """``/api/overview``: services, compute nodes, chains, targets and storage capacity at a glance."""
        user = self._reader.as_user(caller.token)
        latest, _ = await self._store.alatest(series.LATEST_MAX_AGE_S)
        targets = series.targets_table(latest)
        routing = await user.routing()
        try:
            nodes = await user.nodes()
        except (RpcError, NoScheduler):
            nodes = None  # the rest of the overview is still worth showing
        return json_response(views.overview(routing, nodes, series.capacity(targets)))

    async def tasks(self, request: web.Request, caller: Caller) -> web.Response:
        """``/api/tasks?users=all|mine``: the tasks the caller may see, grouped by state (``all`` for admins)."""
        users = params.choice(request, "users", "all", ("all", "mine"))
        everyone = caller.principal.is_admin and users == "all"
        found = await self._reader.as_user(caller.token).tasks(all_users=everyone)
        return json_response(views.task_groups(found))

    async def task(self, request: web.Request, caller: Caller) -> web.Response:
        """``/api/tasks/{task_id}``: one task with its runs, suspends and checkpoints; 404 for another's."""
        task = await self._reader.as_user(caller.token).task(params.task_id(request))
        return json_response(views.task_detail(task))

    async def task_series(self, request: web.Request, caller: Caller) -> web.Response:
        """``/api/tasks/{task_id}/series?metric=&since=&until=``: the task's ``hfai_<metric>`` curves."""
        task_id = params.task_id(request)
        metric = params.metric(request)
        now = time.time()
        since = params.number(request, "since", 0.0, lo=0.0, hi=now + 3600)
        until = params.number(request, "until", now + 60, lo=since, hi=now + 3600)
        # The scheduler says whether the caller may see the task (NOT_FOUND for another user's), and the
        # series are read through the caller's filter as well.
        task = await self._reader.as_user(caller.token).task(task_id)
        since = max(since, task.created_at - 60)
        return json_response(await series.task_curves(self._store, viewer_of(caller), task_id, metric, since, until))

    async def task_log(self, request: web.Request, caller: Caller) -> web.Response:
        """``/api/tasks/{task_id}/log?node_rank=&local_rank=&tail_bytes=``: the end of a rank's log."""
        task_id = params.task_id(request)
        node_rank = params.integer(request, "node_rank", 0, lo=0, hi=100_000)
        local_rank = params.integer(request, "local_rank", 0, lo=0, hi=10_000)
        tail_bytes = params.integer(request, "tail_bytes", 16_384, lo=1, hi=256 * 1024)
        user = self._reader.as_user(caller.token)
        await user.task(task_id)  # NOT_FOUND for a task the caller may not see, whatever the log says
        try:
            data = await user.log_tail(task_id, node_rank, local_rank, tail_bytes)
        except RpcError as err:  # no run yet, or its node is gone: say so on the page
            return json_response({"text": "", "note": err.details or err.code.name})
        return json_response({"text": data.decode(errors="replace"), "note": ""})

    async def storage(self, request: web.Request, caller: Caller) -> web.Response:
        """``/api/storage?window_s=``: storage throughput, latency and capacity over the window."""
        window_s = params.number(request, "window_s", 900.0, lo=60.0, hi=MAX_WINDOW_S)
        return json_response(await series.storage(self._store, viewer_of(caller), time.time(), window_s))

    async def alerts(self, request: web.Request, caller: Caller) -> web.Response:
        """``/api/alerts?state=``: the alerts the caller may see (``enabled`` false without an alert engine)."""
        state = params.choice(request, "state", "all", tuple(ALERT_STATES))
        if self._alerts is None:
            return json_response({"enabled": False, "alerts": []})
        req = tpb.ListAlertsRequest(state=ALERT_STATES[state], page_size=MAX_ALERTS)  # type: ignore[arg-type]
        resp = await self._alerts(req, caller.principal)
        return json_response({"enabled": True, "alerts": [views.alert_view(a) for a in resp.alerts]})

    async def series(self, request: web.Request, caller: Caller) -> web.Response:
        """A range query, as QueryRange, from the query string.

        Parameters: ``name``, ``match`` (repeated), ``since``, ``until``, ``step_s``, ``rate``, ``sum``.
        """
        name = request.query.get("name", "")
        check_name(name, self._store.limits)
        now = time.time()
        since = params.number(request, "since", now - 900, lo=0.0, hi=now + 3600)
        until = params.number(request, "until", now, lo=since, hi=now + 3600)
        step_s = params.number(request, "step_s", max((until - since) / 120, 1.0), lo=0.001, hi=MAX_WINDOW_S)
        query = RangeQuery(
            name=name,
            matchers=params.matchers(request),
            start_at=since,
            end_at=until,
            step_s=step_s,
            rate=params.choice(request, "rate", "0", ("0", "1")) == "1",
            aggregation=Aggregation.SUM if params.choice(request, "sum", "0", ("0", "1")) == "1" else Aggregation.NONE,
        )
        result = await self._store.aquery_range(query, viewer_of(caller))
        return json_response({"name": name, "series": series.result_series(result.series)})
