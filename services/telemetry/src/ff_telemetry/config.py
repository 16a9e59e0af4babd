"""The collector's settings (env prefix FF_TELEMETRY_)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator

from ff_config import MgmtdClientSettings
from ff_telemetry.core.validation import Limits
from ff_telemetry.store.retention import Retention

ENV_PREFIX = "FF_TELEMETRY_"


class TelemetrySettings(MgmtdClientSettings):
    """The collector's settings, loaded once in ``__main__``."""

    state_dir: Path = Field(Path("./telemetry-state"), description="where the default SQLite file lives")
    database_url: SecretStr = Field(
        SecretStr(""), description="SQLAlchemy URL (may hold a password); default sqlite:///<state_dir>/telemetry.db"
    )
    http_address: str = Field("127.0.0.1:0", description="HTTP host:port of /federate (and the dashboard)")
    sqlite_synchronous: Literal["FULL", "NORMAL"] = Field(
        "NORMAL",
        description="SQLite PRAGMA synchronous: NORMAL loses no commit when the collector crashes, only on an OS "
        "crash or power loss (no fsync per commit); FULL fsyncs every commit",
    )
    raw_retention_s: float = Field(86_400.0, gt=0, description="how long raw samples are kept")
    minute_retention_s: float = Field(14 * 86_400.0, gt=0, description="how long 1-minute buckets are kept")
    hour_retention_s: float = Field(400 * 86_400.0, gt=0, description="how long 1-hour buckets are kept")
    raw_query_span_s: float = Field(3600.0, gt=0, description="queries spanning longer read the 1-minute tier")
    downsample_interval_s: float = Field(30.0, gt=0, description="how often downsampling and retention run")
    downsample_lag_s: float = Field(120.0, ge=0, description="a bucket is made this long after it ends")
    max_series_per_metric: int = Field(
        50_000, ge=1, description="distinct label sets one metric may have (all sources)"
    )
    max_samples_per_push: int = Field(10_000, ge=1, description="samples in one PushSamples call")
    scrape_interval_s: float = Field(15.0, ge=0, description="how often services' /metrics are scraped; 0: never")
    scrape_timeout_s: float = Field(5.0, gt=0, description="deadline of one scrape")
    exposition_max_age_s: float = Field(300.0, gt=0, description="/federate leaves out series older than this")
    alerts: bool = Field(True, description="evaluate the alert rules and keep the alert log (ListAlerts)")
    alerts_config: Path | None = Field(
        None, description="alert rules (TOML); default: ff_telemetry/alerts/default_rules.toml"
    )

    @model_validator(mode="after")
    def _check(self) -> TelemetrySettings:
        if not self.raw_retention_s <= self.minute_retention_s <= self.hour_retention_s:
            raise ValueError("need raw_retention_s <= minute_retention_s <= hour_retention_s")
        if self.downsample_lag_s >= self.raw_retention_s:
            raise ValueError("downsample_lag_s must be shorter than raw_retention_s")
        return self

    def resolved_database_url(self) -> str:
        """The database to open: ``database_url``, else a SQLite file in ``state_dir`` (holds secrets: not logged)."""
        return self.database_url.get_secret_value() or f"sqlite:///{self.state_dir / 'telemetry.db'}"

    def limits(self) -> Limits:
        """What one push may carry, from these settings (samples older than the raw tier keeps are refused)."""
        return Limits(
            max_samples=self.max_samples_per_push,
            max_series_per_metric=self.max_series_per_metric,
            max_sample_age_s=self.raw_retention_s,
        )

    def retention(self) -> Retention:
        """How long each tier keeps its data, from these settings."""
        return Retention(
            raw_s=self.raw_retention_s,
            minute_s=self.minute_retention_s,
            hour_s=self.hour_retention_s,
            lag_s=self.downsample_lag_s,
        )
