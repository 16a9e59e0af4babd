"""A bounded, thread-safe buffer of samples waiting to be pushed; what does not fit is dropped and counted."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import NamedTuple


class Kind(Enum):
    """A metric's type, as the telemetry contract has them."""

    GAUGE = "gauge"
    COUNTER = "counter"


class Point(NamedTuple):
    """One sample: a series (name and labels), a value and when it was taken (Unix seconds).

    A tuple: a training step makes a few every step, and a frozen dataclass costs several times more to build.
    """

    name: str
    value: float
    sampled_at: float
    labels: Mapping[str, str] = {}
    kind: Kind = Kind.GAUGE


class SampleBuffer:
    """Samples in arrival order, at most ``capacity``; a full buffer drops the oldest and counts it.

    The oldest goes because a new value of a gauge is worth more than an old one. Thread-safe: ``add`` never
    blocks beyond a short lock.
    """

    def __init__(self, capacity: int = 10_000) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, not {capacity}")
        self.capacity = capacity
        self._points: collections.deque[Point] = collections.deque()
        self._lock = threading.Lock()
        self._dropped = 0

    def __len__(self) -> int:
        return len(self._points)

    @property
    def dropped(self) -> int:
        """Samples dropped since the buffer was made (never reset: pushed as a counter)."""
        return self._dropped

    def add(
        self,
        name: str,
        value: float,
        labels: Mapping[str, str] | None = None,
        *,
        kind: Kind = Kind.GAUGE,
        sampled_at: float | None = None,
    ) -> None:
        """Buffers one sample, taken now unless ``sampled_at`` (Unix seconds) says when; drops the oldest if full."""
        point = Point(name, float(value), time.time() if sampled_at is None else sampled_at, labels or {}, kind)
        with self._lock:
            if len(self._points) >= self.capacity:
                self._points.popleft()
                self._dropped += 1
            self._points.append(point)

    def add_many(
        self,
        values: Sequence[tuple[str, float]],
        labels: Mapping[str, str],
        *,
        kind: Kind = Kind.GAUGE,
        sampled_at: float | None = None,
    ) -> None:
        """Several samples with the same labels and time, under one lock (a training step's metrics)."""
        at = time.time() if sampled_at is None else sampled_at
        points = [Point(name, value, at, labels, kind) for name, value in values]
        with self._lock:
            overflow = len(self._points) + len(points) - self.capacity
            for _ in range(max(0, overflow)):
                if self._points:
                    self._points.popleft()
                self._dropped += 1
            self._points.extend(points[max(0, len(points) - self.capacity) :])

    def take(self, max_points: int) -> list[Point]:
        """Up to ``max_points`` of the oldest samples, removed from the buffer."""
        with self._lock:
            count = min(max_points, len(self._points))
            return [self._points.popleft() for _ in range(count)]

    def put_back(self, points: Sequence[Point]) -> None:
        """Return samples that could not be sent to the front, keeping the newest when they do not fit."""
        with self._lock:
            room = self.capacity - len(self._points)
            keep = list(points)[max(0, len(points) - room) :] if room > 0 else []
            self._dropped += len(points) - len(keep)
            self._points.extendleft(reversed(keep))

    def drop(self, count: int) -> None:
        """Count samples lost elsewhere (a batch the service refused)."""
        with self._lock:
            self._dropped += count
