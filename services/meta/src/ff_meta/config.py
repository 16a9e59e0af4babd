"""The meta service's settings (env prefix FF_META_)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, model_validator

from ff_config import MgmtdClientSettings

ENV_PREFIX = "FF_META_"


class MetaSettings(MgmtdClientSettings):
    """The meta service's settings (``FF_META_*`` or flags)."""

    database_url: SecretStr = Field(
        SecretStr("sqlite:///./meta-state/meta.db"),
        description="sqlite:///file.db or postgresql+psycopg:// (may hold a password)",
    )
    sqlite_synchronous: Literal["FULL", "NORMAL"] = Field(
        "NORMAL",
        description="SQLite only: NORMAL (WAL) survives a process crash but may lose the last commits on power loss;"
        " FULL fsyncs every commit",
    )
    default_chain_table_id: int = Field(1, ge=1, description="chain table of files whose directories set none")
    default_chunk_size: int = Field(4 * 1024 * 1024, description="chunk size of new files (power of two, 64K-64M)")
    default_stripe_size: int = Field(16, ge=1, description="chains per file (capped by the chain table)")
    session_lease_s: float = Field(30.0, gt=0, description="write sessions not renewed for this long are collected")
    capability_ttl_s: float = Field(86400.0, gt=0, description="how long a read-only IoCapability lets a client read")
    writable_capability_ttl_s: float = Field(
        300.0,
        ge=1,
        description="how long a writable IoCapability lets a client write (clients renew it through their write"
        " session); a removed file's chunks are removed twice this long after its last write session ended",
    )
    trash_retention_s: float = Field(3 * 86400.0, gt=0, description="default time a removed tree stays in the trash")
    capacity_bytes: int = Field(1 << 40, gt=0, description="statfs capacity while no storage target reports its disk")
    background_interval_s: float = Field(1.0, gt=0, description="session collection, GC and trash expiry period")
    grace_s: float = Field(3.0, ge=0, description="drain time for in-flight calls on SIGTERM")
    telemetry_interval_s: float = Field(
        10.0, ge=0, description="push the operation counts to telemetry this often; 0: never"
    )

    @model_validator(mode="after")
    def _check(self) -> MetaSettings:
        c = self.default_chunk_size
        if c < 65536 or c > 64 << 20 or c & (c - 1):
            raise ValueError("default_chunk_size must be a power of two from 64 KiB to 64 MiB")
        return self
