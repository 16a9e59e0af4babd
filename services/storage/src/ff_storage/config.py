"""The storage service's settings (env prefix FF_STORAGE_)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, model_validator

from ff_config import SettingsModel
from hf3fs.datapath import DATA_PATH_VERSION

ENV_PREFIX = "FF_STORAGE_"


class StorageSettings(SettingsModel):
    state_dir: Path = Field(Path("./storage-state"), description="the node's target list and default disk")
    disks: str = Field("", description="comma-separated disk folders; targets live in them (default: state_dir)")
    mgmtd_addresses: str = Field("127.0.0.1:9000", description="comma-separated mgmtd gRPC addresses")
    listen_address: str = Field("127.0.0.1:0", description="gRPC host:port (port 0 picks a free one)")
    data_listen_address: str = Field("127.0.0.1:0", description="bulk data path host:port")
    metrics_address: str = Field("127.0.0.1:0", description="Prometheus /metrics host:port; empty disables it")
    instance_id: str = Field("", description="name of this instance (logs)")
    node_id: int = Field(0, ge=0, description="node id to register under (0: assigned by mgmtd)")
    cluster_token: SecretStr = Field(SecretStr(""), description="shared secret for service-to-service calls")
    cluster_token_file: Path | None = Field(None, description="file holding the cluster token")
    max_io_bytes: int = Field(16 * 1024 * 1024, gt=0, description="largest single IO")
    max_batch_bytes: int = Field(256 * 1024 * 1024, gt=0, description="most bytes one BatchWrite may carry")
    max_read_batch_bytes: int = Field(256 * 1024 * 1024, gt=0, description="most bytes one BatchRead may ask for")
    max_inline_read_bytes: int = Field(
        32 * 1024 * 1024, gt=0, le=48 * 1024 * 1024,
        description="most bytes one BatchRead may ask for inline (copied into the answer, which must stay under "
        "gRPC's 64 MiB message cap with its results: at most 48 MiB)",
    )  # fmt: skip
    max_batch_ios: int = Field(4096, gt=0, description="most IOs (or updates, queries, chunk ids) in one call")
    update_ids: bool = Field(
        True, description="recognize retried updates by their ids (off only for the test showing why they exist)"
    )
    update_id_ttl_s: float = Field(
        120.0, gt=0, description="how long a chunk's update ids are remembered (above clients' retry_deadline_s)"
    )
    max_update_ids_per_chunk: int = Field(1024, gt=0, description="most update ids remembered per chunk")
    forward_timeout_s: float = Field(15.0, gt=0, description="how long a replica keeps re-forwarding an update")
    data_wait_s: float = Field(10.0, gt=0, description="how long a write waits for its bulk bytes")
    transfer_ttl_s: float = Field(30.0, gt=0, description="staged read bytes not pulled by then are freed")
    max_inbox_bytes: int = Field(1 << 30, gt=0, description="bulk bytes one caller may have waiting on this node")
    fsync: bool = Field(True, description="fsync chunk files and metadata (never off in production)")
    data_path_version: int = Field(
        DATA_PATH_VERSION,
        ge=1,
        le=DATA_PATH_VERSION,
        description="newest data path version served (lower: speak as an older node)",
    )
    sync_scan_interval_s: float = Field(0.2, gt=0, description="how often to look for targets to recover")
    grace_s: float = Field(3.0, ge=0, description="drain time for in-flight calls on SIGTERM")
    telemetry_interval_s: float = Field(
        10.0, ge=0, description="push per-target bytes, latencies and space to telemetry this often; 0: never"
    )
    ready_file: Path | None = Field(None, description="write the bound addresses here once serving")
    log_level: str = Field("INFO", description="DEBUG, INFO, WARNING, ERROR")

    @model_validator(mode="after")
    def _check(self) -> StorageSettings:
        if not self.cluster_token.get_secret_value() and self.cluster_token_file is None:
            raise ValueError("cluster_token or cluster_token_file is required")
        if not self.mgmtd_list():
            raise ValueError("mgmtd_addresses: at least one address")
        return self

    def mgmtd_list(self) -> list[str]:
        return [a.strip() for a in self.mgmtd_addresses.split(",") if a.strip()]

    def disk_list(self) -> list[Path]:
        disks = [Path(d.strip()) for d in self.disks.split(",") if d.strip()]
        return disks or [self.state_dir / "disk0"]

    def resolved_cluster_token(self) -> str:
        if self.cluster_token_file is not None:
            return self.cluster_token_file.read_text().strip()
        return self.cluster_token.get_secret_value()
