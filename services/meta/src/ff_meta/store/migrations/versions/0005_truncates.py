"""Truncates under way (``meta_truncates``): a crash between storage's cut and the length's commit is finished.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "meta_truncates",
        sa.Column("inode_id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("length", sa.BigInteger, nullable=False),
        sa.Column("started_at_ns", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("meta_truncates")
