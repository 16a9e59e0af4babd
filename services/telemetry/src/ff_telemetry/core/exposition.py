"""Prometheus text exposition (format 0.0.4) of series' latest samples, grouped by metric family."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ff_telemetry.core.model import Labels, MetricMeta, MetricType
from ff_telemetry.core.validation import HISTOGRAM_SUFFIXES

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_TYPE_NAMES = {
    MetricType.GAUGE: "gauge",
    MetricType.COUNTER: "counter",
    MetricType.HISTOGRAM: "histogram",
    MetricType.SUMMARY: "summary",
}


@dataclass(frozen=True)
class ExposedSample:
    """One sample as a Prometheus scrape shows it (``at`` in unix seconds)."""

    name: str
    labels: Labels
    value: float
    at: float


def family_of(name: str, metadata: Mapping[str, MetricMeta]) -> MetricMeta | None:
    """The metric family a sample name belongs to (a histogram's _bucket belongs to the histogram)."""
    if name in metadata:
        return metadata[name]
    for suffix in HISTOGRAM_SUFFIXES:
        base = name.removesuffix(suffix)
        meta = metadata.get(base) if base != name else None
        if meta is not None and meta.type in (MetricType.HISTOGRAM, MetricType.SUMMARY):
            return meta
    return None


def _format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def render(samples: Iterable[ExposedSample], metadata: Mapping[str, MetricMeta]) -> str:
    """The exposition text: each family's # HELP and # TYPE once, then its samples (timestamps in ms)."""
    families: dict[str, list[ExposedSample]] = {}
    for s in samples:
        meta = family_of(s.name, metadata)
        families.setdefault(meta.name if meta else s.name, []).append(s)
    lines = []
    for family, members in sorted(families.items()):
        meta = family_of(members[0].name, metadata)
        if meta is not None and meta.help:
            lines.append(f"# HELP {family} {_escape_help(meta.help)}")
        lines.append(f"# TYPE {family} {_TYPE_NAMES[meta.type] if meta else 'gauge'}")
        for s in members:
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in s.labels)
            series = f"{s.name}{{{labels}}}" if labels else s.name
            lines.append(f"{series} {_format_value(s.value)} {int(s.at * 1000)}")
    return "\n".join(lines) + "\n" if lines else ""
