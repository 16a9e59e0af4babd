"""mgmtd's initial schema: cluster, election, instances, nodes, chains, chain tables, configs, identity.

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


def upgrade() -> None:
    op.create_table(
        "mgmtd_cluster",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("cluster_id", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("routing_version", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "mgmtd_election",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("holder_id", sa.String(128), nullable=False),
        sa.Column("holder_address", sa.String(255), nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("epoch", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "mgmtd_instances",
        sa.Column("instance_id", sa.String(128), primary_key=True),
        sa.Column("address", sa.String(255), nullable=False),
        sa.Column("last_seen_at", sa.Float, nullable=False),
    )
    op.create_table(
        "mgmtd_nodes",
        sa.Column("node_id", sa.BigInteger, primary_key=True),
        sa.Column("node_type", sa.Integer, nullable=False),
        sa.Column("hostname", sa.String(255), nullable=False),
        sa.Column("endpoints", sa.JSON, nullable=False),
        sa.Column("tags", sa.JSON, nullable=False),
        sa.Column("status", sa.Integer, nullable=False),
        sa.Column("enabled", sa.Boolean, nullable=False),
        sa.Column("registered_at", sa.Float, nullable=False),
    )
    op.create_table(
        "mgmtd_chains",
        sa.Column("chain_id", sa.BigInteger, primary_key=True),
        sa.Column("version", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "mgmtd_chain_targets",
        sa.Column("target_id", sa.BigInteger, primary_key=True),
        sa.Column(
            "chain_id", sa.BigInteger, sa.ForeignKey("mgmtd_chains.chain_id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("node_id", sa.BigInteger, sa.ForeignKey("mgmtd_nodes.node_id"), nullable=False),
        sa.Column("public_state", sa.Integer, nullable=False),
        sa.Column("local_state", sa.Integer, nullable=False),
    )
    op.create_table(
        "mgmtd_chain_tables",
        sa.Column("table_id", sa.BigInteger, primary_key=True),
        sa.Column("version", sa.BigInteger, nullable=False),
        sa.Column("chain_ids", sa.JSON, nullable=False),
    )
    op.create_table(
        "mgmtd_configs",
        sa.Column("node_type", sa.Integer, primary_key=True),
        sa.Column("version", sa.BigInteger, nullable=False),
        sa.Column("content", sa.Text, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_table(
        "mgmtd_users",
        sa.Column("uid", sa.BigInteger, primary_key=True),
        sa.Column("name", sa.String(64), nullable=False, unique=True),
        sa.Column("role", sa.Integer, nullable=False),
        sa.Column("disabled", sa.Boolean, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_table(
        "mgmtd_groups",
        sa.Column("gid", sa.BigInteger, primary_key=True),
        sa.Column("name", sa.String(64), nullable=False, unique=True),
    )
    op.create_table(
        "mgmtd_group_members",
        sa.Column("gid", sa.BigInteger, sa.ForeignKey("mgmtd_groups.gid", ondelete="CASCADE"), primary_key=True),
        sa.Column("uid", sa.BigInteger, sa.ForeignKey("mgmtd_users.uid", ondelete="CASCADE"), primary_key=True),
    )
    op.create_table(
        "mgmtd_tokens",
        sa.Column("token_id", sa.String(32), primary_key=True),
        sa.Column("uid", sa.BigInteger, sa.ForeignKey("mgmtd_users.uid", ondelete="CASCADE"), nullable=False),
        sa.Column("secret_hash", sa.String(64), nullable=False),
        sa.Column("description", sa.String(256), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("revoked_at", sa.Float, nullable=False),
    )
    op.create_index("ix_mgmtd_tokens_uid", "mgmtd_tokens", ["uid"])


def downgrade() -> None:
    for table in (
        "mgmtd_tokens", "mgmtd_group_members", "mgmtd_groups", "mgmtd_users", "mgmtd_configs", "mgmtd_chain_tables",
        "mgmtd_chain_targets", "mgmtd_chains", "mgmtd_nodes", "mgmtd_instances", "mgmtd_election", "mgmtd_cluster",
    ):  # fmt: skip
        op.drop_table(table)
