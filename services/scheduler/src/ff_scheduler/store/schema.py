"""Tables of the scheduler. Changed only through migrations (ff_scheduler/store/migrations)."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    UniqueConstraint,
)

metadata = MetaData()

VERSION_TABLE = "scheduler_alembic_version"

# Agent nodes. The state is derived: OFFLINE when not online, ERR when disabled or err, else READY.
nodes = Table(
    "sched_nodes",
    metadata,
    Column("node_id", Integer, primary_key=True, autoincrement=False),
    Column("hostname", String(255), nullable=False),
    Column("agent_address", String(255), nullable=False),
    Column("master_ip", String(255), nullable=False),
    Column("node_group", String(128), nullable=False),
    Column("zone", String(128), nullable=False),
    Column("devices", JSON, nullable=False),
    Column("num_cpus", Integer, nullable=False),
    Column("memory_bytes", BigInteger, nullable=False),
    Column("online", Boolean, nullable=False),
    # Set by an admin (SetNodeEnabled) or by the scheduler (failures, validation): the node is in err_nodes.
    Column("disabled_reason", String(512), nullable=False),
    Column("err_reason", String(512), nullable=False),
    Column("num_failures", Integer, nullable=False),
    Column("registered_at", Float, nullable=False),
    Column("last_report_at", Float, nullable=False),
    Column("validation", JSON, nullable=True),
)

quotas = Table(
    "sched_quotas",
    metadata,
    Column("user_name", String(128), primary_key=True),
    Column("priority", Integer, primary_key=True, autoincrement=False),
    Column("node_group", String(128), primary_key=True),
    Column("max_nodes", Integer, nullable=False),
)

tasks = Table(
    "sched_tasks",
    metadata,
    Column("task_id", Integer, primary_key=True, autoincrement=True),
    Column("user_name", String(128), nullable=False),
    Column("uid", Integer, nullable=False),
    Column("request_id", String(128), nullable=True),
    Column("name", String(256), nullable=False),
    # argv, env, working_dir, ranks_per_node, image, tags: what the agents need to start a run.
    Column("spec", JSON, nullable=False),
    Column("num_nodes", Integer, nullable=False),
    Column("asked_priority", Integer, nullable=True),  # NULL = AUTO
    Column("priority", Integer, nullable=True),  # in force; NULL = AUTO not placed yet
    Column("node_group", String(128), nullable=False),
    Column("state", Integer, nullable=False),
    Column("queue_reason", Integer, nullable=False),
    Column("whole_life_state", BigInteger, nullable=False),
    Column("watchdog_time_s", Float, nullable=False),
    Column("max_restarts", Integer, nullable=False),
    Column("suspend_grace_s", Float, nullable=False),
    Column("num_runs", Integer, nullable=False),
    Column("num_restarts", Integer, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("first_started_at", Float, nullable=False),
    Column("finished_at", Float, nullable=False),
    Column("end_reason", Integer, nullable=False),
    Column("end_message", String(1024), nullable=False),
    UniqueConstraint("user_name", "request_id", name="uq_sched_tasks_request"),
    Index("ix_sched_tasks_state", "state"),
    Index("ix_sched_tasks_user", "user_name", "task_id"),
)

runs = Table(
    "sched_runs",
    metadata,
    Column("run_id", Integer, primary_key=True, autoincrement=True),
    Column("task_id", Integer, nullable=False),
    Column("run_index", Integer, nullable=False),
    Column("state", Integer, nullable=False),
    Column("priority", Integer, nullable=False),
    Column("node_ids", JSON, nullable=False),  # in node-rank order
    Column("master_address", String(255), nullable=False),
    Column("start_whole_life_state", BigInteger, nullable=False),
    Column("suspend_stage", Integer, nullable=False),
    Column("suspend_requested_at", Float, nullable=False),
    Column("suspend_received_at", Float, nullable=False),
    Column("stop_requested_at", Float, nullable=False),
    Column("stop_reason", Integer, nullable=False),
    Column("ack_window_s", Float, nullable=False),
    Column("grace_s", Float, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("started_at", Float, nullable=False),
    Column("ended_at", Float, nullable=False),
    Column("end_reason", Integer, nullable=False),
    Column("end_message", String(1024), nullable=False),
    Column("failure", JSON, nullable=True),
    Column("checkpoint", JSON, nullable=True),
    Index("ix_sched_runs_state", "state"),
    Index("ix_sched_runs_task", "task_id"),
)

# What each node's agent last reported about a run.
run_nodes = Table(
    "sched_run_nodes",
    metadata,
    Column("run_id", Integer, primary_key=True, autoincrement=False),
    Column("node_id", Integer, primary_key=True, autoincrement=False),
    Column("node_rank", Integer, nullable=False),
    Column("phase", Integer, nullable=False),
    Column("last_output_at", Float, nullable=False),
    Column("reported_at", Float, nullable=False),
    Column("failure", JSON, nullable=True),
)

# Tokens issued (by mgmtd) for runs' ranks, by id (never the secret), until revoked: a restarted scheduler still
# revokes the tokens of runs that end after the restart.
run_tokens = Table(
    "sched_run_tokens",
    metadata,
    Column("token_id", String(64), primary_key=True),
    Column("run_id", Integer, nullable=False),
    Column("issued_at", Float, nullable=False),
    Index("ix_sched_run_tokens_run", "run_id"),
)
