"""The collector's exceptions (one status code each: ff_telemetry.errors.STATUS_TABLE)."""

from __future__ import annotations


class TelemetryError(Exception):
    """Base of the collector's errors."""


class InvalidRequest(TelemetryError):
    """Malformed input: nothing of the request was stored."""


class LimitExceeded(TelemetryError):
    """A metric would get more distinct series than allowed: nothing of the request was stored."""


class AlertsOff(TelemetryError):
    """The alert log was asked for on an instance that runs no alert engine."""


class UnknownSeries(TelemetryError):
    """A packed push named a series id this collector instance did not register: register again."""


class StaleRegistration(TelemetryError):
    """A packed push's ids were registered by another collector instance (or before a restart)."""


class NotYourSeries(TelemetryError):
    """A user's packed push named a series of another user or of the cluster."""
