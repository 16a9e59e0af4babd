"""Conversions between domain values and rows: label sets as canonical JSON and a hash, NaN as NULL."""

from __future__ import annotations

import hashlib
import json
import math

from ff_telemetry.core.model import Labels


def labels_json(labels: Labels) -> str:
    """Labels as stored: compact JSON of [name, value] pairs, in the canonical order."""
    return json.dumps([list(pair) for pair in labels], separators=(",", ":"), ensure_ascii=False)


def labels_from_json(text: str) -> Labels:
    """Stored labels back to their canonical form."""
    return tuple((str(k), str(v)) for k, v in json.loads(text))


def labels_hash(labels: Labels) -> str:
    """The hex SHA-256 of the stored labels: the unique key of a series with its name."""
    return hashlib.sha256(labels_json(labels).encode()).hexdigest()


def to_db(value: float) -> float | None:
    """SQLite stores NaN as NULL anyway; doing it everywhere keeps both databases alike."""
    return None if math.isnan(value) else value


def from_db(value: float | None) -> float:
    """A stored value back: NULL is NaN (see ``to_db``)."""
    return math.nan if value is None else float(value)


def chunks(items: list[int], size: int = 900) -> list[list[int]]:
    """Id lists cut to stay under SQLite's limit of bound parameters."""
    return [items[i : i + size] for i in range(0, len(items), size)]
