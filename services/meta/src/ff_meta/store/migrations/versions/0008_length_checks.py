"""Files whose length storage is asked again once a closed session's writable capability expired
(``meta_length_checks``).

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "meta_length_checks",
        sa.Column("inode_id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("ended_at", sa.Float, nullable=False),
        sa.Column("quota_ids", sa.Text, nullable=False),
    )
    op.create_index("ix_meta_length_checks_ended_at", "meta_length_checks", ["ended_at"])


def downgrade() -> None:
    op.drop_index("ix_meta_length_checks_ended_at", "meta_length_checks")
    op.drop_table("meta_length_checks")
