"""Push samples to the telemetry service without ever blocking or failing the caller."""

from ff_telemetry_client.background import BackgroundPusher
from ff_telemetry_client.buffer import Kind, Point, SampleBuffer
from ff_telemetry_client.periodic import Collect, PeriodicReporter, service_reporter
from ff_telemetry_client.pusher import DROPPED_METRIC, PushOptions, TelemetryPusher

__all__ = [
    "DROPPED_METRIC",
    "BackgroundPusher",
    "Collect",
    "Kind",
    "PeriodicReporter",
    "Point",
    "PushOptions",
    "SampleBuffer",
    "TelemetryPusher",
    "service_reporter",
]
