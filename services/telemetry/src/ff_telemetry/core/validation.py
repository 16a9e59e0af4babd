"""Checks of pushed samples and queries: names, labels, values, sizes, times (pure)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ff_telemetry.core.errors import InvalidRequest
from ff_telemetry.core.model import (
    RESOLUTIONS,
    Aggregation,
    Kind,
    Labels,
    MetricMeta,
    MetricType,
    RangeQuery,
    Sample,
    labels_of,
)

METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
USER_LABEL = "user"
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
SUMMARY_SUFFIXES = ("_sum", "_count")
MAX_REQUEST_BYTES = 8 * 1024 * 1024
MAX_STEPS = 11_000
FUTURE_SLACK_S = 300.0


@dataclass(frozen=True, kw_only=True)
class Limits:
    max_samples: int = 10_000
    max_labels: int = 32
    max_name_chars: int = 200
    max_value_chars: int = 1024
    max_series_per_metric: int = 10_000
    # Samples older than this are refused: the raw tier would not keep them.
    max_sample_age_s: float = 86_400.0


@dataclass(frozen=True)
class RawSample:
    """A sample as pushed, before checks."""

    name: str
    labels: Mapping[str, str]
    value: float
    sampled_at: float


@dataclass(frozen=True)
class PushBatch:
    samples: tuple[Sample, ...]
    metadata: tuple[MetricMeta, ...]


def check_name(name: str, limits: Limits, what: str = "metric name") -> None:
    if not METRIC_NAME.fullmatch(name) or name.startswith("__"):
        raise InvalidRequest(f"bad {what} {name[:80]!r}: must match [a-zA-Z_:][a-zA-Z0-9_:]*, not start with __")
    if len(name) > limits.max_name_chars:
        raise InvalidRequest(f"{what} {name[:80]!r}... is longer than {limits.max_name_chars} characters")


def check_labels(labels: Mapping[str, str], limits: Limits) -> None:
    if len(labels) > limits.max_labels:
        raise InvalidRequest(f"{len(labels)} labels, at most {limits.max_labels}")
    for key, value in labels.items():
        if not LABEL_NAME.fullmatch(key) or key.startswith("__"):
            raise InvalidRequest(f"bad label name {key[:80]!r}: must match [a-zA-Z_][a-zA-Z0-9_]*, not start with __")
        if len(key) > limits.max_name_chars:
            raise InvalidRequest(f"label name {key[:80]!r}... is longer than {limits.max_name_chars} characters")
        if len(value) > limits.max_value_chars:
            raise InvalidRequest(f"value of label {key!r} is longer than {limits.max_value_chars} characters")


def check_metadata(metadata: Sequence[MetricMeta], limits: Limits) -> None:
    for meta in metadata:
        check_name(meta.name, limits)
        if len(meta.help) > 4 * limits.max_value_chars or len(meta.unit) > limits.max_name_chars:
            raise InvalidRequest(f"help or unit of {meta.name!r} too long")


def metric_type(value: int, name: str) -> MetricType:
    """The MetricType of a wire value; unknown types are refused."""
    try:
        return MetricType(value)
    except ValueError:
        raise InvalidRequest(f"metric {name!r}: unknown metric type {value}") from None


def classify(name: str, labels: Labels, types: Mapping[str, MetricType]) -> tuple[Kind, MetricType]:
    """How a series of ``name`` is stored, given the known metric types (by base name).

    Histograms come as <base>_bucket (with a numeric ``le``), <base>_sum, <base>_count; summaries as <base>
    (with ``quantile``, a gauge), <base>_sum, <base>_count. A name with no known type is a gauge.
    """
    declared = types.get(name)
    if declared is MetricType.COUNTER:
        return Kind.COUNTER, declared
    if declared is MetricType.HISTOGRAM:
        raise InvalidRequest(f"histogram {name!r} is pushed as {name}_bucket, {name}_sum and {name}_count")
    if declared is not None:
        return Kind.GAUGE, declared
    for suffix in HISTOGRAM_SUFFIXES:
        base = name.removesuffix(suffix)
        family = types.get(base) if base != name else None
        if family is MetricType.HISTOGRAM or (family is MetricType.SUMMARY and suffix in SUMMARY_SUFFIXES):
            if suffix == "_bucket":
                _check_le(name, dict(labels))
            return Kind.COUNTER, family
    return Kind.GAUGE, MetricType.GAUGE


def _check_le(name: str, labels: Mapping[str, str]) -> None:
    try:
        float(labels["le"])
    except (KeyError, ValueError):
        raise InvalidRequest(f"{name!r} needs a numeric 'le' label") from None


def check_value(sample: Sample, kind: Kind) -> None:
    """Gauges may be NaN or infinite (a NaN loss is worth seeing); counters are finite and >= 0."""
    if kind is Kind.COUNTER and (not math.isfinite(sample.value) or sample.value < 0):
        raise InvalidRequest(f"counter {sample.name!r} has value {sample.value}: must be finite and >= 0")


def build_samples(
    raw: Sequence[RawSample],
    common_labels: Mapping[str, str],
    *,
    owner: str | None,
    now: float,
    limits: Limits,
) -> tuple[Sample, ...]:
    """Checked samples with common labels merged (a sample's own win) and ``user`` forced to ``owner``.

    Args:
        owner: the pushing user's name for a user token (its samples are theirs); None for the cluster.
    """
    if len(raw) > limits.max_samples:
        raise InvalidRequest(f"{len(raw)} samples in one call, at most {limits.max_samples}")
    check_labels(common_labels, limits)
    return tuple(_build_sample(r, common_labels, owner, now, limits) for r in raw)


def _build_sample(
    raw: RawSample, common_labels: Mapping[str, str], owner: str | None, now: float, limits: Limits
) -> Sample:
    check_name(raw.name, limits)
    labels = {**common_labels, **raw.labels}
    if owner is not None:
        labels[USER_LABEL] = owner
    check_labels(labels, limits)
    at = raw.sampled_at or now
    if not math.isfinite(at) or at < now - limits.max_sample_age_s or at > now + FUTURE_SLACK_S:
        raise InvalidRequest(
            f"sample of {raw.name!r} at {at}: outside [now - {limits.max_sample_age_s:g} s, now + {FUTURE_SLACK_S:g} s]"
        )
    return Sample(raw.name, labels_of({k: v for k, v in labels.items() if v != ""}), raw.value, at)


def check_query(query: RangeQuery, limits: Limits) -> None:
    check_name(query.name, limits)
    for matcher in query.matchers:
        if not LABEL_NAME.fullmatch(matcher.name):
            raise InvalidRequest(f"bad label name {matcher.name[:80]!r} in a matcher")
    for label in query.group_by:
        if not LABEL_NAME.fullmatch(label):
            raise InvalidRequest(f"bad label name {label[:80]!r} in group_by")
    if not all(math.isfinite(x) for x in (query.start_at, query.end_at, query.step_s, query.lookback_s)):
        raise InvalidRequest("start_at, end_at, step_s and lookback_s must be finite")
    if query.end_at < query.start_at or query.step_s <= 0 or query.lookback_s < 0:
        raise InvalidRequest("need end_at >= start_at, step_s > 0, lookback_s >= 0")
    if (query.end_at - query.start_at) / query.step_s >= MAX_STEPS:
        raise InvalidRequest(f"more than {MAX_STEPS} steps: use a larger step_s")
    if not 0.0 <= query.quantile <= 1.0:
        raise InvalidRequest(f"quantile {query.quantile} is not in (0, 1]")
    if query.quantile and (query.rate or query.aggregation is not Aggregation.NONE):
        raise InvalidRequest("a quantile query takes neither rate nor aggregation")
    if query.resolution_s not in RESOLUTIONS:
        raise InvalidRequest(f"resolution_s must be one of {RESOLUTIONS}, got {query.resolution_s}")
