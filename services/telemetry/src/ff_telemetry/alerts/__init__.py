"""Alerts: rules from a versioned config evaluated on an interval over mgmtd, the scheduler and the
collected series; an alert log (firing/resolved, queryable by ListAlerts); a webhook sink."""

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
