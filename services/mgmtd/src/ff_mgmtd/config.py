"""mgmtd's settings (env prefix FF_MGMTD_)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, model_validator

from ff_config import SettingsModel

ENV_PREFIX = "FF_MGMTD_"


class MgmtdSettings(SettingsModel):
    state_dir: Path = Field(Path("./mgmtd-state"), description="where the default SQLite file lives")
    database_url: SecretStr = Field(
        SecretStr(""), description="SQLAlchemy URL (may hold a password); default sqlite:///<state_dir>/mgmtd.db"
    )
    listen_address: str = Field("127.0.0.1:0", description="gRPC host:port (port 0 picks a free one)")
    advertise_address: str = Field("", description="host:port others reach this instance at; default: bound")
    metrics_address: str = Field("127.0.0.1:0", description="Prometheus /metrics host:port; empty disables it")
    instance_id: str = Field("", description="stable name of this instance; default: the advertised address")
    node_id: int = Field(0, ge=0, description="node id this instance registers itself under (0: assigned)")
    cluster_token: SecretStr = Field(SecretStr(""), description="shared secret for service-to-service calls")
    cluster_token_file: Path | None = Field(None, description="file holding the cluster token")
    lease_duration_s: float = Field(10.0, gt=0, description="T: a node is declared dead after T without heartbeat")
    heartbeat_interval_s: float = Field(1.0, gt=0, description="how often nodes should heartbeat")
    election_lease_s: float = Field(2.5, gt=0, description="how long the primary's lease lasts without renewal")
    chain_scan_interval_s: float = Field(0.5, gt=0, description="how often the primary applies target states")
    token_cache_ttl_s: float = Field(5.0, ge=0, description="how long other services may cache a token check")
    grace_s: float = Field(5.0, ge=0, description="drain time for in-flight calls on SIGTERM")
    ready_file: Path | None = Field(None, description="write the bound addresses here once serving")
    log_level: str = Field("INFO", description="DEBUG, INFO, WARNING, ERROR")

    @model_validator(mode="after")
    def _check(self) -> MgmtdSettings:
        if self.heartbeat_interval_s * 2 > self.lease_duration_s:
            raise ValueError("heartbeat_interval_s must be at most half of lease_duration_s")
        if not self.cluster_token.get_secret_value() and self.cluster_token_file is None:
            raise ValueError("cluster_token or cluster_token_file is required")
        return self

    def failover_warning(self) -> str:
        """Why a failover could make nodes stop serving, or "" when the timing leaves room for it.

        A standby takes over within ``election_lease_s`` of the primary's death, and a node needs about
        two heartbeat intervals to reach it; nodes stop serving after T/2 without contact.
        """
        needed_s = self.election_lease_s + 2 * self.heartbeat_interval_s
        if needed_s < self.lease_duration_s / 2:
            return ""
        return (
            f"election_lease_s + 2 * heartbeat_interval_s = {needed_s:.2f}s is not below lease_duration_s / 2 = "
            f"{self.lease_duration_s / 2:.2f}s: nodes may stop serving while a standby takes over"
        )

    def resolved_database_url(self) -> str:
        return self.database_url.get_secret_value() or f"sqlite:///{self.state_dir / 'mgmtd.db'}"

    def resolved_cluster_token(self) -> str:
        if self.cluster_token_file is not None:
            return self.cluster_token_file.read_text().strip()
        return self.cluster_token.get_secret_value()
