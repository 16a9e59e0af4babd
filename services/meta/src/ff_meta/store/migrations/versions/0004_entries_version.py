"""Directories count the changes of their entries (``entries_version``: the key of meta's listing cache).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("meta_inodes", sa.Column("entries_version", sa.BigInteger, nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("meta_inodes") as batch:
        batch.drop_column("entries_version")
