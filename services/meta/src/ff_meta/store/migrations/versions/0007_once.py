"""Mutating calls done once (``meta_once``): a call sent again with the same key answers its first result.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "meta_once",
        sa.Column("once_key", sa.String(200), primary_key=True),
        sa.Column("result", sa.Text, nullable=False),
        sa.Column("recorded_at_ns", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_meta_once_recorded_at_ns", "meta_once", ["recorded_at_ns"])


def downgrade() -> None:
    op.drop_index("ix_meta_once_recorded_at_ns", "meta_once")
    op.drop_table("meta_once")
