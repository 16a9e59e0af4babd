"""Write sessions remember a truncate of their file while they were open: their reported lengths then count only as
far as storage confirms (a Close or renewal no longer takes back bytes another client cut).

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("meta_sessions", sa.Column("truncated_at_ns", sa.BigInteger, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("meta_sessions") as batch:
        batch.drop_column("truncated_at_ns")
