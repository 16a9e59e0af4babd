"""Meta's initial schema: inodes, directory entries, write sessions, quotas, trash, GC queue, counters.

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
FIRST_INODE_ID = 1 << 20


def upgrade() -> None:
    op.create_table(
        "meta_counters",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("value", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "meta_dirents",
        sa.Column("parent_id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("inode_id", sa.BigInteger, nullable=False),
        sa.Column("type", sa.SmallInteger, nullable=False),
    )
    op.create_index("ix_meta_dirents_inode_id", "meta_dirents", ["inode_id"])
    op.create_table(
        "meta_gc_queue",
        sa.Column("inode_id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("chain_table_id", sa.Integer, nullable=False),
        sa.Column("stripe_size", sa.Integer, nullable=False),
        sa.Column("chain_begin", sa.Integer, nullable=False),
        sa.Column("shuffle_seed", sa.BigInteger, nullable=False),
        sa.Column("enqueued_at", sa.Float, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
    )
    op.create_table(
        "meta_inodes",
        sa.Column("inode_id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("type", sa.SmallInteger, nullable=False),
        sa.Column("mode", sa.Integer, nullable=False),
        sa.Column("uid", sa.BigInteger, nullable=False),
        sa.Column("gid", sa.BigInteger, nullable=False),
        sa.Column("nlink", sa.Integer, nullable=False),
        sa.Column("atime_ns", sa.BigInteger, nullable=False),
        sa.Column("mtime_ns", sa.BigInteger, nullable=False),
        sa.Column("ctime_ns", sa.BigInteger, nullable=False),
        sa.Column("length", sa.BigInteger, nullable=False),
        sa.Column("parent_id", sa.BigInteger, nullable=False),
        sa.Column("symlink_target", sa.Text, nullable=False),
        sa.Column("chain_table_id", sa.Integer, nullable=False),
        sa.Column("chain_table_version", sa.BigInteger, nullable=False),
        sa.Column("chunk_size", sa.BigInteger, nullable=False),
        sa.Column("stripe_size", sa.Integer, nullable=False),
        sa.Column("chain_begin", sa.Integer, nullable=False),
        sa.Column("shuffle_seed", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "meta_quotas",
        sa.Column("inode_id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("max_bytes", sa.BigInteger, nullable=False),
        sa.Column("max_inodes", sa.BigInteger, nullable=False),
        sa.Column("used_bytes", sa.BigInteger, nullable=False),
        sa.Column("used_inodes", sa.BigInteger, nullable=False),
        sa.Column("reserved_bytes", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "meta_sessions",
        sa.Column("session_id", sa.String(64), primary_key=True),
        sa.Column("client_id", sa.String(64), nullable=False),
        sa.Column("inode_id", sa.BigInteger, nullable=False),
        sa.Column("uid", sa.BigInteger, nullable=False),
        sa.Column("write_limit", sa.BigInteger, nullable=True),
        sa.Column("reported_length", sa.BigInteger, nullable=False),
        sa.Column("lease_expires_at", sa.Float, nullable=False),
        sa.Column("quota_ids", sa.Text, nullable=False),
    )
    op.create_index("ix_meta_sessions_client_id", "meta_sessions", ["client_id"])
    op.create_index("ix_meta_sessions_inode_id", "meta_sessions", ["inode_id"])
    op.create_index("ix_meta_sessions_lease_expires_at", "meta_sessions", ["lease_expires_at"])
    op.create_table(
        "meta_trash",
        sa.Column("trash_id", sa.String(64), primary_key=True),
        sa.Column("inode_id", sa.BigInteger, nullable=False),
        sa.Column("type", sa.SmallInteger, nullable=False),
        sa.Column("uid", sa.BigInteger, nullable=False),
        sa.Column("original_path", sa.Text, nullable=False),
        sa.Column("removed_at_ns", sa.BigInteger, nullable=False),
        sa.Column("expires_at_ns", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_meta_trash_inode_id", "meta_trash", ["inode_id"])
    op.create_index("ix_meta_trash_expires_at_ns", "meta_trash", ["expires_at_ns"])
    _root_and_counters()


def downgrade() -> None:
    op.drop_table("meta_trash")
    op.drop_table("meta_sessions")
    op.drop_table("meta_quotas")
    op.drop_table("meta_inodes")
    op.drop_table("meta_gc_queue")
    op.drop_table("meta_dirents")
    op.drop_table("meta_counters")


def _root_and_counters() -> None:
    """The root directory (inode 1, world-writable and sticky like /tmp, owned by root) and the inode counter."""
    import time

    now = time.time_ns()
    inodes = sa.table("meta_inodes", *(sa.column(c) for c in (
        "inode_id", "type", "mode", "uid", "gid", "nlink", "atime_ns", "mtime_ns", "ctime_ns", "length", "parent_id",
        "symlink_target", "chain_table_id", "chain_table_version", "chunk_size", "stripe_size", "chain_begin",
        "shuffle_seed")))  # fmt: skip
    op.bulk_insert(inodes, [{
        "inode_id": 1, "type": 2, "mode": 0o1777, "uid": 0, "gid": 0, "nlink": 1, "atime_ns": now, "mtime_ns": now,
        "ctime_ns": now, "length": 0, "parent_id": 1, "symlink_target": "", "chain_table_id": 0,
        "chain_table_version": 0, "chunk_size": 0, "stripe_size": 0, "chain_begin": 0, "shuffle_seed": 0,
    }])  # fmt: skip
    counters = sa.table("meta_counters", sa.column("name"), sa.column("value"))
    # Files start at 2^20: ids below are left to tools that write raw chunks under fixed inode ids (the
    # appliance's storage demo uses 0xDE30), so that meta's files never share chunk ids with them.
    op.bulk_insert(counters, [{"name": "next_inode_id", "value": FIRST_INODE_ID}])
