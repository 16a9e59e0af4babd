"""Protobuf <-> the collector's domain types (no decisions here)."""

from __future__ import annotations

import re

from ff_telemetry.core.errors import InvalidRequest
from ff_telemetry.core.model import (
    RAW,
    Aggregation,
    Matcher,
    MatchOp,
    MetricMeta,
    MetricType,
    QueryResult,
    RangeQuery,
    SeriesInfo,
)
from ff_telemetry.core.validation import metric_type
from fireflyer.telemetry.v1 import telemetry_pb2 as pb


def metadata(request: pb.PushSamplesRequest | pb.RegisterSeriesRequest) -> tuple[MetricMeta, ...]:
    """The metric metadata a push or registration carries; InvalidRequest for an unknown type."""
    return tuple(MetricMeta(m.name, metric_type(m.type, m.name), m.help, m.unit) for m in request.metadata)


def matchers(msgs: list[pb.LabelMatcher]) -> tuple[Matcher, ...]:
    """Label matchers from the wire; InvalidRequest for an unknown op or a bad regular expression."""
    out = []
    for m in msgs:
        try:
            op = MatchOp(m.op)
        except ValueError:
            raise InvalidRequest(f"matcher on {m.name!r}: unknown op {m.op}") from None
        try:
            out.append(Matcher.make(m.name, op, m.value))
        except re.error as exc:
            raise InvalidRequest(f"matcher on {m.name!r}: bad regular expression: {exc}") from None
    return tuple(out)


def range_query(request: pb.QueryRangeRequest) -> RangeQuery:
    """A QueryRange request as a domain query (not yet checked: ``check_query``); InvalidRequest for unknown enums."""
    try:
        aggregation = Aggregation(request.aggregation or pb.AGGREGATION_NONE)
    except ValueError:
        raise InvalidRequest(f"unknown aggregation {request.aggregation}") from None
    return RangeQuery(
        name=request.name,
        matchers=matchers(list(request.matchers)),
        start_at=request.start_at,
        end_at=request.end_at,
        step_s=request.step_s,
        lookback_s=request.lookback_s,
        rate=request.rate,
        aggregation=aggregation,
        group_by=tuple(request.group_by),
        quantile=request.quantile,
        resolution_s=request.resolution_s or RAW,
    )


def query_response(result: QueryResult) -> pb.QueryRangeResponse:
    """A query's answer for the wire."""
    return pb.QueryRangeResponse(
        series=[
            pb.Series(name=s.name, labels=dict(s.labels), points=[pb.Point(at=p.at, value=p.value) for p in s.points])
            for s in result.series
        ],
        resolution_s=result.resolution_s,
    )


def series_info(info: SeriesInfo) -> pb.SeriesInfo:
    """A stored series for ListSeries."""
    return pb.SeriesInfo(
        name=info.name,
        labels=dict(info.labels),
        type=_type(info.type),
        first_sampled_at=info.first_at,
        last_sampled_at=info.last_at,
    )


def _type(value: MetricType) -> pb.MetricType.ValueType:
    return pb.MetricType.ValueType(int(value))
