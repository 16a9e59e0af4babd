"""Domain types of the collector: samples, metric metadata, matchers and queries (no grpc, no SQL)."""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs: a series' identity with its name


class MetricType(enum.IntEnum):
    """Mirror of fireflyer.telemetry.v1.MetricType."""

    GAUGE = 1
    COUNTER = 2
    HISTOGRAM = 3
    SUMMARY = 4


class Kind(enum.IntEnum):
    """How a stored series is downsampled and rated: by its increase, or by min/max/avg/last."""

    GAUGE = 1
    COUNTER = 2


class MatchOp(enum.IntEnum):
    """How a label matcher compares (mirror of the proto's MatchOp)."""

    EQUAL = 1
    NOT_EQUAL = 2
    REGEX = 3
    NOT_REGEX = 4


class Aggregation(enum.IntEnum):
    """How a query folds the series of a group into one (NONE: every series on its own)."""

    NONE = 1
    SUM = 2
    AVG = 3
    MIN = 4
    MAX = 5
    COUNT = 6


RAW = 0.0
MINUTE = 60.0
HOUR = 3600.0
RESOLUTIONS = (RAW, MINUTE, HOUR)


def labels_of(mapping: Mapping[str, str]) -> Labels:
    """A label mapping in its canonical form: sorted (name, value) pairs."""
    return tuple(sorted(mapping.items()))


@dataclass(frozen=True)
class MetricMeta:
    """What a pushed metric family says about itself: type, help text and unit."""

    name: str
    type: MetricType
    help: str = ""
    unit: str = ""


class Sample(NamedTuple):
    """One value of one series at one time (unix seconds). A tuple: batches make many of them."""

    name: str
    labels: Labels
    value: float
    at: float


@dataclass(frozen=True)
class Matcher:
    """A label matcher; a missing label has the value ""."""

    name: str
    op: MatchOp
    value: str
    pattern: re.Pattern[str] | None = field(default=None, compare=False)

    @classmethod
    def make(cls, name: str, op: MatchOp, value: str) -> Matcher:
        """Raises re.error for a bad regular expression."""
        pattern = re.compile(value) if op in (MatchOp.REGEX, MatchOp.NOT_REGEX) else None
        return cls(name, op, value, pattern)

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether a series with ``labels`` passes this matcher."""
        got = labels.get(self.name, "")
        if self.op is MatchOp.EQUAL:
            return got == self.value
        if self.op is MatchOp.NOT_EQUAL:
            return got != self.value
        assert self.pattern is not None  # make() compiles it for the regex ops
        found = self.pattern.fullmatch(got) is not None
        return found if self.op is MatchOp.REGEX else not found


def matches_all(matchers: tuple[Matcher, ...], labels: Mapping[str, str]) -> bool:
    """Whether a series with ``labels`` passes every matcher."""
    return all(m.matches(labels) for m in matchers)


@dataclass(frozen=True, kw_only=True)
class RangeQuery:
    """QueryRange in domain terms (validated: see core.validation.check_query)."""

    name: str
    matchers: tuple[Matcher, ...] = ()
    start_at: float
    end_at: float
    step_s: float
    lookback_s: float = 0.0
    rate: bool = False
    aggregation: Aggregation = Aggregation.NONE
    group_by: tuple[str, ...] = ()
    quantile: float = 0.0
    resolution_s: float = RAW

    @property
    def effective_lookback_s(self) -> float:
        """How far back from a step a value counts: ``lookback_s``, else the step but at least 5 minutes."""
        return self.lookback_s or max(self.step_s, 300.0)

    def steps(self) -> list[float]:
        """The times the query is evaluated at, from ``start_at`` to ``end_at`` (one when ``step_s`` is 0)."""
        count = int((self.end_at - self.start_at) // self.step_s) + 1 if self.step_s > 0 else 1
        return [self.start_at + i * self.step_s for i in range(count)]


@dataclass(frozen=True)
class Point:
    """One value of a query's answer at one time (unix seconds)."""

    at: float
    value: float


@dataclass(frozen=True)
class SeriesResult:
    """One series (or group) of a query's answer and its points."""

    name: str
    labels: Labels
    points: tuple[Point, ...]


@dataclass(frozen=True)
class QueryResult:
    """A query's answer, with the resolution (seconds) of the tier it was read from."""

    series: tuple[SeriesResult, ...]
    resolution_s: float


@dataclass(frozen=True)
class SeriesInfo:
    """A stored series: identity, kind and type, and the times of its first and last samples (unix seconds)."""

    series_id: int
    name: str
    labels: Labels
    kind: Kind
    type: MetricType
    first_at: float
    last_at: float
