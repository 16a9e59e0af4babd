"""Alerts: rules evaluated on an interval, an alert log, and a webhook sink.

The rules come from a versioned config and look at mgmtd, the scheduler and the collected series; the log
(firing/resolved) answers ListAlerts.
"""

from ff_telemetry.alerts.config import AlertConfig, AlertConfigError, Rule, RuleKind, load_config
from ff_telemetry.alerts.engine import AlertEngine
from ff_telemetry.alerts.log import AlertFilter, AlertLog, AlertRecord, AlertState
from ff_telemetry.alerts.sources import ClusterSources, MetricReader
from ff_telemetry.alerts.webhook import WebhookSink

__all__ = [
    "AlertConfig",
    "AlertConfigError",
    "AlertEngine",
    "AlertFilter",
    "AlertLog",
    "AlertRecord",
    "AlertState",
    "ClusterSources",
    "MetricReader",
    "Rule",
    "RuleKind",
    "WebhookSink",
    "load_config",
]
