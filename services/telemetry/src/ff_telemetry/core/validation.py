"""Checks of pushed samples and queries: names, labels, values, sizes, times (pure)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

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
    """What one push or query may carry; sizes in characters, ages in seconds."""

    max_samples: int = 10_000
    max_labels: int = 32
    max_name_chars: int = 200
    max_value_chars: int = 1024
    max_series_per_metric: int = 50_000
    # Samples older than this are refused: the raw tier would not keep them.
    max_sample_age_s: float = 86_400.0


class RawSample(NamedTuple):
    """A sample as pushed, before checks."""

    name: str
    labels: Mapping[str, str]
    value: float
    sampled_at: float


@dataclass(frozen=True)
class PushBatch:
    """A checked Push: its samples and metric metadata."""

    samples: tuple[Sample, ...]
    metadata: tuple[MetricMeta, ...]


def check_name(name: str, limits: Limits, what: str = "metric name") -> None:
    """A metric (or ``what``) name: Prometheus syntax, not reserved, not too long; InvalidRequest otherwise."""
    if not METRIC_NAME.fullmatch(name) or name.startswith("__"):
        raise InvalidRequest(f"bad {what} {name[:80]!r}: must match [a-zA-Z_:][a-zA-Z0-9_:]*, not start with __")
    if len(name) > limits.max_name_chars:
        raise InvalidRequest(f"{what} {name[:80]!r}... is longer than {limits.max_name_chars} characters")


def _check_labels(labels: Mapping[str, str], limits: Limits) -> None:
    """Label names and values: few enough, Prometheus syntax, not reserved, not too long."""
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
    """Pushed metric metadata: valid names, help and unit not too long; InvalidRequest otherwise."""
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
    raw: Sequence[PushedSample],
    common_labels: Mapping[str, str],
    *,
    owner: str | None,
    now: float,
    limits: Limits,
) -> tuple[Sample, ...]:
    """Checked samples with common labels merged (a sample's own win) and ``user`` forced to ``owner``.

    Args:
        raw: the pushed samples.
        common_labels: labels every sample of the push gets.
        owner: the pushing user's name for a user token (its samples are theirs); None for the cluster.
        now: the collector's time (unix seconds): samples too old or from the future are refused.
        limits: what one push may carry.

    Raises:
        InvalidRequest: a sample, name, label or value is not acceptable.
    """
    return SampleChecker(limits).build(raw, common_labels, owner=owner, now=now)


class PushedSample(Protocol):
    """What a pushed sample offers: a RawSample, or the wire message itself (no copy on the hot path)."""

    @property
    def name(self) -> str:
        """The metric name."""
        ...

    @property
    def labels(self) -> Mapping[str, str]:
        """The sample's own labels."""
        ...

    @property
    def value(self) -> float:
        """The value."""
        ...

    @property
    def sampled_at(self) -> float:
        """When it was sampled (unix seconds; 0: now)."""
        ...


class SampleChecker:
    """``build_samples`` for a stream of batches, remembering the label sets it checked.

    A collector sees the same few thousand label sets over and over: each (name, labels, common labels, owner)
    checked once is remembered with its merged, sorted label set, so a batch of known series costs a lookup per
    sample.
    """

    MAX_REMEMBERED = 100_000

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._known: dict[tuple[object, ...], Labels] = {}

    def build(
        self, raw: Sequence[PushedSample], common_labels: Mapping[str, str], *, owner: str | None, now: float
    ) -> tuple[Sample, ...]:
        """``build_samples`` with this checker's limits and memory of checked label sets."""
        limits = self.limits
        if len(raw) > limits.max_samples:
            raise InvalidRequest(f"{len(raw)} samples in one call, at most {limits.max_samples}")
        _check_labels(common_labels, limits)
        context = (tuple(sorted(common_labels.items())), owner)
        earliest, latest = now - limits.max_sample_age_s, now + FUTURE_SLACK_S
        known, out = self._known, []
        for r in raw:
            key = (r.name, tuple(r.labels.items()), context)
            labels = known.get(key)
            if labels is None:
                labels = self._check_new(r, common_labels, owner)
                if len(known) >= self.MAX_REMEMBERED:
                    known.clear()
                known[key] = labels
            at = r.sampled_at or now
            if not earliest <= at <= latest:  # False for NaN too
                raise InvalidRequest(
                    f"sample of {r.name!r} at {at}: outside [now - {limits.max_sample_age_s:g} s, "
                    f"now + {FUTURE_SLACK_S:g} s]"
                )
            out.append(Sample(r.name, labels, r.value, at))
        return tuple(out)

    def _check_new(self, r: PushedSample, common_labels: Mapping[str, str], owner: str | None) -> Labels:
        check_name(r.name, self.limits)
        _check_labels(r.labels, self.limits)
        labels = {**common_labels, **r.labels}
        if owner is not None:
            labels[USER_LABEL] = owner
        if len(labels) > self.limits.max_labels:
            raise InvalidRequest(f"{len(labels)} labels, at most {self.limits.max_labels}")
        return labels_of({k: v for k, v in labels.items() if v != ""})


def check_query(query: RangeQuery, limits: Limits) -> None:
    """A range query's fields; InvalidRequest naming the first that is wrong.

    Valid names, finite times in order, a positive step and at most ``MAX_STEPS`` steps, a quantile in (0, 1]
    without rate or aggregation, and a known resolution.
    """
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
