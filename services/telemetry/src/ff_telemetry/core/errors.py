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
