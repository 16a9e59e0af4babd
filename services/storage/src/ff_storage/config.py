"""The storage service's settings (env prefix FF_STORAGE_)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from ff_config import MgmtdClientSettings

ENV_PREFIX = "FF_STORAGE_"


class StorageSettings(MgmtdClientSettings):
    """The storage service's settings, loaded once in ``__main__``."""

    state_dir: Path = Field(Path("./storage-state"), description="the node's target list and default disk")
    disks: str = Field("", description="comma-separated disk folders; targets live in them (default: state_dir)")
    data_listen_address: str = Field("127.0.0.1:0", description="bulk data path host:port")
    max_io_bytes: int = Field(16 * 1024 * 1024, gt=0, description="largest single IO")
    max_batch_bytes: int = Field(256 * 1024 * 1024, gt=0, description="most bytes one BatchWrite may carry")
    max_read_batch_bytes: int = Field(256 * 1024 * 1024, gt=0, description="most bytes one BatchRead may ask for")
    max_inline_read_bytes: int = Field(
        32 * 1024 * 1024,
        gt=0,
        le=48 * 1024 * 1024,
        description="most bytes one BatchRead may ask for inline (copied into the answer, which must stay under "
        "gRPC's 64 MiB message cap with its results: at most 48 MiB)",
    )
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
    sync_scan_interval_s: float = Field(0.2, gt=0, description="how often to look for targets to recover")
    grace_s: float = Field(3.0, ge=0, description="drain time for in-flight calls on SIGTERM")
    telemetry_interval_s: float = Field(
        10.0, ge=0, description="push per-target bytes, latencies and space to telemetry this often; 0: never"
    )

    def disk_list(self) -> list[Path]:
        """The disk folders targets live in: ``disks``, else ``state_dir/disk0``."""
        disks = [Path(d.strip()) for d in self.disks.split(",") if d.strip()]
        return disks or [self.state_dir / "disk0"]
