"""Write sessions remember when an explicit mtime was set on their file (utime while open), so that the
session's later Close or Sync does not put back an earlier write time.

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
    op.add_column("meta_sessions", sa.Column("times_set_at_ns", sa.BigInteger, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("meta_sessions") as batch:
        batch.drop_column("times_set_at_ns")
