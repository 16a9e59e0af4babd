"""The settings every service shares (its address, identity, cluster token, stop and log settings)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, model_validator

from ff_config.loader import SettingsModel


class ServiceSettings(SettingsModel):
    """Base of each service's settings: what the service chassis (``ff_cluster.serve_service``) reads.

    A service's settings class subclasses this one (or :class:`MgmtdClientSettings`) and adds its own
    fields; it may redeclare a field here to change its default (``grace_s``).
    """

    listen_address: str = Field("127.0.0.1:0", description="gRPC host:port (port 0 picks a free one)")
    advertise_address: str = Field("", description="host:port others reach this instance at; default: bound")
    metrics_address: str = Field("127.0.0.1:0", description="Prometheus /metrics host:port; empty disables it")
    instance_id: str = Field("", description="stable name of this instance; default: the advertised address")
    node_id: int = Field(0, ge=0, description="node id to register with mgmtd under (0: assigned)")
    cluster_token: SecretStr = Field(SecretStr(""), description="shared secret for service-to-service calls")
    cluster_token_file: Path | None = Field(None, description="file holding the cluster token")
    token_cache_ttl_s: float = Field(5.0, ge=0, description="how long a token check is cached")
    grace_s: float = Field(5.0, ge=0, description="drain time for in-flight calls on SIGTERM")
    ready_file: Path | None = Field(
        None, description="write the bound addresses here once serving and registered with mgmtd"
    )
    log_level: str = Field("INFO", description="DEBUG, INFO, WARNING, ERROR")

    @model_validator(mode="after")
    def _check_cluster_token(self) -> ServiceSettings:
        if not self.cluster_token.get_secret_value() and self.cluster_token_file is None:
            raise ValueError("cluster_token or cluster_token_file is required")
        return self

    def resolved_cluster_token(self) -> str:
        """The token: read from ``cluster_token_file`` when one is given (at each call), else ``cluster_token``."""
        if self.cluster_token_file is not None:
            return self.cluster_token_file.read_text().strip()
        return self.cluster_token.get_secret_value()


class MgmtdClientSettings(ServiceSettings):
    """Settings of a service that finds the cluster through mgmtd (every service but mgmtd itself)."""

    mgmtd_addresses: str = Field("", description="comma-separated gRPC addresses of the mgmtd instances")

    @model_validator(mode="after")
    def _check_mgmtd_addresses(self) -> MgmtdClientSettings:
        if not self.mgmtd_address_list():
            raise ValueError("mgmtd_addresses: at least one address is required")
        return self

    def mgmtd_address_list(self) -> list[str]:
        """``mgmtd_addresses`` split on commas, blanks dropped."""
        return [a.strip() for a in self.mgmtd_addresses.split(",") if a.strip()]
