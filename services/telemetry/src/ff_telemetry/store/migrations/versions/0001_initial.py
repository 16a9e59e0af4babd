"""The collector's initial schema: series, raw sample blocks, 1-minute and 1-hour buckets, metadata, watermarks.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _bucket_table(name: str) -> None:
    op.create_table(
        name,
        sa.Column("series_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("start", sa.Float, primary_key=True),
        sa.Column("count", sa.Integer, nullable=False),
        sa.Column("sum", sa.Float, nullable=True),
        sa.Column("min", sa.Float, nullable=True),
        sa.Column("max", sa.Float, nullable=True),
        sa.Column("last", sa.Float, nullable=True),
        sa.Column("increase", sa.Float, nullable=True),
    )
    op.create_index(f"ix_{name}_start", name, ["start"])


def upgrade() -> None:
    op.create_table(
        "tel_series",
        sa.Column("series_id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("labels_hash", sa.String(64), nullable=False),
        sa.Column("labels", sa.Text, nullable=False),
        sa.Column("owner", sa.String(1024), nullable=False),
        sa.Column("kind", sa.Integer, nullable=False),
        sa.Column("type", sa.Integer, nullable=False),
        sa.Column("first_at", sa.Float, nullable=False),
        sa.Column("last_at", sa.Float, nullable=False),
        sa.Column("last_value", sa.Float, nullable=True),
        sa.UniqueConstraint("name", "labels_hash", name="uq_tel_series_name_labels"),
    )
    op.create_index("ix_tel_series_last_at", "tel_series", ["last_at"])
    op.create_table(
        "tel_sample_blocks",
        sa.Column("block_id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("min_at", sa.Float, nullable=False),
        sa.Column("max_at", sa.Float, nullable=False),
        sa.Column("count", sa.Integer, nullable=False),
        sa.Column("data", sa.LargeBinary, nullable=False),
    )
    op.create_index("ix_tel_sample_blocks_max_at", "tel_sample_blocks", ["max_at"])
    op.create_index("ix_tel_sample_blocks_min_at", "tel_sample_blocks", ["min_at"])
    _bucket_table("tel_samples_1m")
    _bucket_table("tel_samples_1h")
    op.create_table(
        "tel_metadata",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("type", sa.Integer, nullable=False),
        sa.Column("help", sa.Text, nullable=False),
        sa.Column("unit", sa.String(200), nullable=False),
    )
    op.create_table(
        "tel_watermarks",
        sa.Column("tier", sa.String(16), primary_key=True),
        sa.Column("done_until", sa.Float, nullable=False),
        sa.Column("dirty_since", sa.Float, nullable=True),
    )


def downgrade() -> None:
    for name in ("tel_watermarks", "tel_metadata", "tel_samples_1h", "tel_samples_1m", "tel_sample_blocks", "tel_series"):
        op.drop_table(name)
