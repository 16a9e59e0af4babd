"""Tombstones of nodes removed from the cluster (RemoveNode), so their ids are never reused.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "mgmtd_removed_nodes",
        sa.Column("node_id", sa.BigInteger, primary_key=True),
        sa.Column("node_type", sa.Integer, nullable=False),
        sa.Column("hostname", sa.String(255), nullable=False),
        sa.Column("removed_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("mgmtd_removed_nodes")
