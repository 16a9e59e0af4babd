"""Tables of mgmtd. Changed only through migrations (ff_mgmtd/store/migrations)."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Table,
    Text,
)

metadata = MetaData()

VERSION_TABLE = "mgmtd_alembic_version"

# One row: the cluster's identity and the routing version (bumped by every routing change).
cluster = Table(
    "mgmtd_cluster",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("cluster_id", String(64), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("routing_version", BigInteger, nullable=False),
)

# One row: the primary's lease (database clock).
election = Table(
    "mgmtd_election",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("holder_id", String(128), nullable=False),
    Column("holder_address", String(255), nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("epoch", BigInteger, nullable=False),
)

instances = Table(
    "mgmtd_instances",
    metadata,
    Column("instance_id", String(128), primary_key=True),
    Column("address", String(255), nullable=False),
    Column("last_seen_at", Float, nullable=False),
)

nodes = Table(
    "mgmtd_nodes",
    metadata,
    Column("node_id", BigInteger, primary_key=True),
    Column("node_type", Integer, nullable=False),
    Column("hostname", String(255), nullable=False),
    Column("endpoints", JSON, nullable=False),
    Column("tags", JSON, nullable=False),
    Column("status", Integer, nullable=False),
    Column("enabled", Boolean, nullable=False),
    Column("registered_at", Float, nullable=False),
)

# Nodes removed from the cluster (RemoveNode): their ids are never given out or registered again.
removed_nodes = Table(
    "mgmtd_removed_nodes",
    metadata,
    Column("node_id", BigInteger, primary_key=True),
    Column("node_type", Integer, nullable=False),
    Column("hostname", String(255), nullable=False),
    Column("removed_at", Float, nullable=False),
)

chains = Table(
    "mgmtd_chains",
    metadata,
    Column("chain_id", BigInteger, primary_key=True),
    Column("version", BigInteger, nullable=False),
)

# Targets of a chain in chain order (position 0 = head).
chain_targets = Table(
    "mgmtd_chain_targets",
    metadata,
    Column("target_id", BigInteger, primary_key=True),
    Column("chain_id", BigInteger, ForeignKey("mgmtd_chains.chain_id", ondelete="CASCADE"), nullable=False),
    Column("position", Integer, nullable=False),
    Column("node_id", BigInteger, ForeignKey("mgmtd_nodes.node_id"), nullable=False),
    Column("public_state", Integer, nullable=False),
    Column("local_state", Integer, nullable=False),
)

chain_tables = Table(
    "mgmtd_chain_tables",
    metadata,
    Column("table_id", BigInteger, primary_key=True),
    Column("version", BigInteger, nullable=False),
    Column("chain_ids", JSON, nullable=False),
)

configs = Table(
    "mgmtd_configs",
    metadata,
    Column("node_type", Integer, primary_key=True),
    Column("version", BigInteger, nullable=False),
    Column("content", Text, nullable=False),
    Column("updated_at", Float, nullable=False),
)

users = Table(
    "mgmtd_users",
    metadata,
    Column("uid", BigInteger, primary_key=True),
    Column("name", String(64), nullable=False, unique=True),
    Column("role", Integer, nullable=False),
    Column("disabled", Boolean, nullable=False),
    Column("created_at", Float, nullable=False),
)

groups = Table(
    "mgmtd_groups",
    metadata,
    Column("gid", BigInteger, primary_key=True),
    Column("name", String(64), nullable=False, unique=True),
)

group_members = Table(
    "mgmtd_group_members",
    metadata,
    Column("gid", BigInteger, ForeignKey("mgmtd_groups.gid", ondelete="CASCADE"), primary_key=True),
    Column("uid", BigInteger, ForeignKey("mgmtd_users.uid", ondelete="CASCADE"), primary_key=True),
)

tokens = Table(
    "mgmtd_tokens",
    metadata,
    Column("token_id", String(32), primary_key=True),
    Column("uid", BigInteger, ForeignKey("mgmtd_users.uid", ondelete="CASCADE"), nullable=False, index=True),
    Column("secret_hash", String(64), nullable=False),
    Column("description", String(256), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("revoked_at", Float, nullable=False),
)
