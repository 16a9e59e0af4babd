"""Thin gRPC adapter of TelemetryService: protobuf in, TelemetryStore calls, protobuf out.

Who may push: the cluster token (services, the agent) and user tokens (a run's token is its owner's);
a user's samples get `user` = their name. Who sees what: admins and the cluster everything, a user the
series without a `user` label and their own (ff_telemetry.store.query.Viewer).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from ff_rpc import Principal, current_principal
from ff_telemetry import wire
from ff_telemetry.core.errors import AlertsOff, InvalidRequest
from ff_telemetry.core.model import RangeQuery
from ff_telemetry.core.packed import decode
from ff_telemetry.core.validation import PushBatch, RawSample, check_metadata, check_name
from ff_telemetry.store.api import TelemetryStore
from ff_telemetry.store.query import Viewer
from fireflyer.telemetry.v1 import telemetry_pb2 as pb
from fireflyer.telemetry.v1 import telemetry_pb2_grpc

# What grpc.aio hands each RPC; the request and response types are the RPC's own, hence Any here.
Context = grpc.aio.ServicerContext[Any, Any]
DEFAULT_PAGE = 1000
MAX_PAGE = 10_000


def viewer_of(caller: Principal) -> Viewer:
    """What series ``caller`` may read: everything for an admin (and the cluster), else the cluster's and their own."""
    return Viewer(None if caller.is_admin else caller.name)


def owner_of(caller: Principal) -> str | None:
    """Whose a pushed sample is: the cluster's own (None), or the pushing user's (admins included)."""
    return None if caller.is_cluster else caller.name


# ListAlerts is answered by the alert engine (ff_telemetry.alerts) when the server runs one.
AlertsHandler = Callable[[pb.ListAlertsRequest, Principal], Awaitable[pb.ListAlertsResponse]]


class TelemetryServicer(telemetry_pb2_grpc.TelemetryServiceServicer):
    """TelemetryService over the store (and the alert engine's ListAlerts, when there is one)."""

    def __init__(self, store: TelemetryStore, alerts: AlertsHandler | None = None) -> None:
        self._store = store
        self._alerts = alerts

    async def PushSamples(self, request: pb.PushSamplesRequest, context: Context) -> pb.PushSamplesResponse:
        batch = push_batch(self._store, request, current_principal())
        result = await self._store.apush(batch)
        return pb.PushSamplesResponse(num_stored=result.num_stored, num_new_series=result.num_new_series)

    async def RegisterSeries(self, request: pb.RegisterSeriesRequest, context: Context) -> pb.RegisterSeriesResponse:
        metadata = wire.metadata(request)
        check_metadata(metadata, self._store.limits)
        keys = [RawSample(k.name, k.labels, 0.0, 0.0) for k in request.series]
        checked = self._store.checker.build(
            keys, dict(request.common_labels), owner=owner_of(current_principal()), now=self._store.clock()
        )
        registered = await self._store.aregister([(s.name, s.labels) for s in checked], metadata)
        return pb.RegisterSeriesResponse(
            series_ids=registered.series_ids,
            registry_epoch=registered.epoch,
            num_new_series=registered.num_new_series,
        )

    async def PushPacked(self, request: pb.PushPackedRequest, context: Context) -> pb.PushPackedResponse:
        store = self._store
        samples = decode(request.series_ids, request.values, request.sampled_at, now=store.clock(), limits=store.limits)
        result = await store.apush_packed(request.registry_epoch, samples, owner_of(current_principal()))
        return pb.PushPackedResponse(num_stored=result.num_stored)

    async def QueryRange(self, request: pb.QueryRangeRequest, context: Context) -> pb.QueryRangeResponse:
        query = wire.range_query(request)
        result = await self._store.aquery_range(query, viewer_of(current_principal()))
        return wire.query_response(result)

    async def ListSeries(self, request: pb.ListSeriesRequest, context: Context) -> pb.ListSeriesResponse:
        if request.name:
            check_name(request.name, self._store.limits)
        after_id = _page_token(request.page_token)
        limit = min(request.page_size or DEFAULT_PAGE, MAX_PAGE)
        query = RangeQuery(
            name=request.name,
            matchers=wire.matchers(list(request.matchers)),
            start_at=request.start_at,
            end_at=request.end_at,
            step_s=1.0,
        )
        found = await self._store.alist_series(query, viewer_of(current_principal()), after_id=after_id, limit=limit)
        token = str(found[-1].series_id) if len(found) == limit else ""
        return pb.ListSeriesResponse(series=[wire.series_info(s) for s in found], next_page_token=token)

    async def ListAlerts(self, request: pb.ListAlertsRequest, context: Context) -> pb.ListAlertsResponse:
        if self._alerts is None:
            raise AlertsOff("this telemetry instance evaluates no alerts")
        return await self._alerts(request, current_principal())


def push_batch(store: TelemetryStore, request: pb.PushSamplesRequest, caller: Principal) -> PushBatch:
    """The checked batch of a push (InvalidRequest for anything malformed)."""
    metadata = wire.metadata(request)
    check_metadata(metadata, store.limits)
    samples = store.checker.build(
        request.samples, dict(request.common_labels), owner=owner_of(caller), now=store.clock()
    )
    return PushBatch(samples, metadata)


def _page_token(token: str) -> int:
    if not token:
        return 0
    if not token.isdigit() or len(token) > 18:
        raise InvalidRequest(f"bad page_token {token[:40]!r}")
    return int(token)
