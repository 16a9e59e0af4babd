"""mgmtd's settings (env prefix FF_MGMTD_)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, model_validator

from ff_config import ServiceSettings

ENV_PREFIX = "FF_MGMTD_"


class MgmtdSettings(ServiceSettings):
    """mgmtd's settings, loaded once in ``__main__``; the heartbeat must be at most half the node lease."""

    state_dir: Path = Field(Path("./mgmtd-state"), description="where the default SQLite file lives")
    database_url: SecretStr = Field(
        SecretStr(""), description="SQLAlchemy URL (may hold a password); default sqlite:///<state_dir>/mgmtd.db"
    )
    lease_duration_s: float = Field(10.0, gt=0, description="T: a node is declared dead after T without heartbeat")
    heartbeat_interval_s: float = Field(1.0, gt=0, description="how often nodes should heartbeat")
    election_lease_s: float = Field(2.5, gt=0, description="how long the primary's lease lasts without renewal")
    chain_scan_interval_s: float = Field(0.5, gt=0, description="how often the primary applies target states")
    # Redeclared for its description: mgmtd also tells the other services this bound (ValidateToken).
    token_cache_ttl_s: float = Field(5.0, ge=0, description="how long other services may cache a token check")
    bootstrap_admin_token_file: Path | None = Field(
        None,
        description="a file holding an admin token (fft_...), imported at each start when it exists: its user is made "
        "an admin and the token one of that user's tokens if it is not stored yet (the Helm chart's admin Secret)",
    )
    bootstrap_admin_user: str = Field("admin", description="the user bootstrap_admin_token_file's token is for")

    @model_validator(mode="after")
    def _check(self) -> MgmtdSettings:
        if self.heartbeat_interval_s * 2 > self.lease_duration_s:
            raise ValueError("heartbeat_interval_s must be at most half of lease_duration_s")
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
        """The database to open: ``database_url``, else a SQLite file in ``state_dir`` (holds secrets: not logged)."""
        return self.database_url.get_secret_value() or f"sqlite:///{self.state_dir / 'mgmtd.db'}"
