"""The ledger of tokens issued for runs' ranks (revoked when the run ends, across scheduler restarts).

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
        "sched_run_tokens",
        sa.Column("token_id", sa.String(64), primary_key=True),
        sa.Column("run_id", sa.Integer, nullable=False),
        sa.Column("issued_at", sa.Float, nullable=False),
    )
    op.create_index("ix_sched_run_tokens_run", "sched_run_tokens", ["run_id"])


def downgrade() -> None:
    op.drop_table("sched_run_tokens")
