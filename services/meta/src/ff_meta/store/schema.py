"""Meta's tables.

Inodes and directory entries (the INOD/DENT schema), write sessions, quotas, trash, the GC queue of removed files,
truncates under way, and counters.
"""

from __future__ import annotations

import sqlalchemy as sa

VERSION_TABLE = "ff_meta_alembic_version"

metadata = sa.MetaData()

inodes = sa.Table(
    "meta_inodes", metadata,
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
    # Directories: the parent (the root is its own); 0 while in the trash.
    sa.Column("parent_id", sa.BigInteger, nullable=False),
    sa.Column("symlink_target", sa.Text, nullable=False),
    sa.Column("chain_table_id", sa.Integer, nullable=False),
    sa.Column("chain_table_version", sa.BigInteger, nullable=False),
    sa.Column("chunk_size", sa.BigInteger, nullable=False),
    sa.Column("stripe_size", sa.Integer, nullable=False),
    sa.Column("chain_begin", sa.Integer, nullable=False),
    sa.Column("shuffle_seed", sa.BigInteger, nullable=False),
    # Device nodes: the device number (0 for every other type).
    sa.Column("rdev", sa.BigInteger, nullable=False, server_default="0"),
    # Directories: moves by one in every transaction that adds or removes one of its entries (a listing
    # cache's key: the same value, the same entries). 0 for every other type.
    sa.Column("entries_version", sa.BigInteger, nullable=False, server_default="0"),
)  # fmt: skip

dirents = sa.Table(
    "meta_dirents", metadata,
    sa.Column("parent_id", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("name", sa.String(255), primary_key=True),
    sa.Column("inode_id", sa.BigInteger, nullable=False, index=True),
    sa.Column("type", sa.SmallInteger, nullable=False),
)  # fmt: skip

sessions = sa.Table(
    "meta_sessions", metadata,
    sa.Column("session_id", sa.String(64), primary_key=True),
    sa.Column("client_id", sa.String(64), nullable=False, index=True),
    sa.Column("inode_id", sa.BigInteger, nullable=False, index=True),
    sa.Column("uid", sa.BigInteger, nullable=False),
    # NULL: no directory quota applies.
    sa.Column("write_limit", sa.BigInteger, nullable=True),
    sa.Column("reported_length", sa.BigInteger, nullable=False),
    sa.Column("lease_expires_at", sa.Float, nullable=False, index=True),
    # Comma-separated inode ids of the directory quotas charged for this session's reservation.
    sa.Column("quota_ids", sa.Text, nullable=False),
    # Meta's clock when an explicit mtime was last set on the file while this session was open (NULL: never):
    # a write time the session reports later counts only if it is later than this.
    sa.Column("times_set_at_ns", sa.BigInteger, nullable=True),
    # Meta's clock when a truncate of the file was committed while this session was open (NULL: never): from then
    # on the lengths the session reports count only as far as storage confirms them (its bytes before the cut are
    # gone; those after it are in storage), so a Close, Sync or renewal does not take back the cut.
    sa.Column("truncated_at_ns", sa.BigInteger, nullable=True),
)  # fmt: skip

quotas = sa.Table(
    "meta_quotas", metadata,
    sa.Column("inode_id", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("max_bytes", sa.BigInteger, nullable=False),
    sa.Column("max_inodes", sa.BigInteger, nullable=False),
    sa.Column("used_bytes", sa.BigInteger, nullable=False),
    sa.Column("used_inodes", sa.BigInteger, nullable=False),
    sa.Column("reserved_bytes", sa.BigInteger, nullable=False),
)  # fmt: skip

trash = sa.Table(
    "meta_trash", metadata,
    sa.Column("trash_id", sa.String(64), primary_key=True),
    sa.Column("inode_id", sa.BigInteger, nullable=False, index=True),
    sa.Column("type", sa.SmallInteger, nullable=False),
    sa.Column("uid", sa.BigInteger, nullable=False),
    sa.Column("original_path", sa.Text, nullable=False),
    sa.Column("removed_at_ns", sa.BigInteger, nullable=False),
    sa.Column("expires_at_ns", sa.BigInteger, nullable=False, index=True),
)  # fmt: skip

# Files whose chunks must be removed from storage (last link gone, no write session). A row leaves the
# queue only after storage confirmed the removal, so a crash anywhere just repeats the (idempotent) work.
gc_queue = sa.Table(
    "meta_gc_queue", metadata,
    sa.Column("inode_id", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("chain_table_id", sa.Integer, nullable=False),
    sa.Column("stripe_size", sa.Integer, nullable=False),
    sa.Column("chain_begin", sa.Integer, nullable=False),
    sa.Column("shuffle_seed", sa.BigInteger, nullable=False),
    sa.Column("enqueued_at", sa.Float, nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
)  # fmt: skip

# Truncates under way: a shrinking truncate removes the chunks past the new end from storage, then commits the
# length. Its row is written before storage is touched and goes with that commit; a truncate cut short by a crash
# (its first chunks gone, the old length kept) is finished from its row by the background job.
truncates = sa.Table(
    "meta_truncates", metadata,
    sa.Column("inode_id", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("length", sa.BigInteger, nullable=False),
    sa.Column("started_at_ns", sa.BigInteger, nullable=False),
)  # fmt: skip

# Mutating calls done once (``store/once.py``): a call's key (method, caller, the client's key) and its result.
once = sa.Table(
    "meta_once", metadata,
    sa.Column("once_key", sa.String(200), primary_key=True),
    sa.Column("result", sa.Text, nullable=False),
    sa.Column("recorded_at_ns", sa.BigInteger, nullable=False, index=True),
)  # fmt: skip

# Files a write session under a byte quota closed with room left: storage is asked their length again once every
# capability of that session expired (``store/fsops/sessions.py``, ``Background.recheck_lengths``).
length_checks = sa.Table(
    "meta_length_checks", metadata,
    sa.Column("inode_id", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("ended_at", sa.Float, nullable=False, index=True),
    sa.Column("quota_ids", sa.Text, nullable=False),
)  # fmt: skip

counters = sa.Table(
    "meta_counters", metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("value", sa.BigInteger, nullable=False),
)  # fmt: skip
