"""Tables of the collector. Changed only through migrations (ff_telemetry/store/migrations).

Works on SQLite and PostgreSQL: plain types, NaN stored as NULL (SQLite has no NaN), a series found by
its name and a hash of its labels (label sets can be longer than an index entry may be).
"""

from __future__ import annotations

from sqlalchemy import Column, Float, Index, Integer, LargeBinary, MetaData, String, Table, Text, UniqueConstraint

metadata = MetaData()

VERSION_TABLE = "telemetry_alembic_version"

# One row per series: its identity, how it is downsampled (kind), and its latest sample (for exposition).
series = Table(
    "tel_series",
    metadata,
    Column("series_id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(200), nullable=False),
    Column("labels_hash", String(64), nullable=False),
    Column("labels", Text, nullable=False),  # canonical JSON of the sorted (name, value) pairs
    Column("owner", String(1024), nullable=False),  # the `user` label, "" for the cluster's series
    Column("kind", Integer, nullable=False),
    Column("type", Integer, nullable=False),
    Column("first_at", Float, nullable=False),
    Column("last_at", Float, nullable=False),
    Column("last_value", Float, nullable=True),
    UniqueConstraint("name", "labels_hash", name="uq_tel_series_name_labels"),
)
Index("ix_tel_series_last_at", series.c.last_at)

# Raw samples, one row per pushed batch (ff_telemetry.store.blocks has the blob's layout).
sample_blocks = Table(
    "tel_sample_blocks",
    metadata,
    Column("block_id", Integer, primary_key=True, autoincrement=True),
    Column("min_at", Float, nullable=False),
    Column("max_at", Float, nullable=False),
    Column("count", Integer, nullable=False),
    Column("data", LargeBinary, nullable=False),
)
Index("ix_tel_sample_blocks_max_at", sample_blocks.c.max_at)
Index("ix_tel_sample_blocks_min_at", sample_blocks.c.min_at)


def _bucket_table(name: str) -> Table:
    return Table(
        name,
        metadata,
        Column("series_id", Integer, primary_key=True, autoincrement=False),
        Column("start", Float, primary_key=True),
        Column("count", Integer, nullable=False),
        Column("sum", Float, nullable=True),
        Column("min", Float, nullable=True),
        Column("max", Float, nullable=True),
        Column("last", Float, nullable=True),
        Column("increase", Float, nullable=True),
    )


samples_1m = _bucket_table("tel_samples_1m")
Index("ix_tel_samples_1m_start", samples_1m.c.start)
samples_1h = _bucket_table("tel_samples_1h")
Index("ix_tel_samples_1h_start", samples_1h.c.start)

metric_metadata = Table(
    "tel_metadata",
    metadata,
    Column("name", String(200), primary_key=True),
    Column("type", Integer, nullable=False),
    Column("help", Text, nullable=False),
    Column("unit", String(200), nullable=False),
)

# Per downsampled tier: everything before done_until is in it; dirty_since marks older samples that
# arrived after (their buckets are computed again).
watermarks = Table(
    "tel_watermarks",
    metadata,
    Column("tier", String(16), primary_key=True),
    Column("done_until", Float, nullable=False),
    Column("dirty_since", Float, nullable=True),
)
