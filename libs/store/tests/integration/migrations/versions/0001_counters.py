"""counters: named integers that the tests increment concurrently

Revision ID: 0001
Revises:
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "counters",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("value", sa.Integer, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("counters")
