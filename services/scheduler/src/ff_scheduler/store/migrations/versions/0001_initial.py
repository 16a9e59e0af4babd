"""The scheduler's initial schema: nodes, quotas, tasks, runs, per-node run reports.

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
        "sched_nodes",
        sa.Column("node_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("hostname", sa.String(255), nullable=False),
        sa.Column("agent_address", sa.String(255), nullable=False),
        sa.Column("master_ip", sa.String(255), nullable=False),
        sa.Column("node_group", sa.String(128), nullable=False),
        sa.Column("zone", sa.String(128), nullable=False),
        sa.Column("devices", sa.JSON, nullable=False),
        sa.Column("num_cpus", sa.Integer, nullable=False),
        sa.Column("memory_bytes", sa.BigInteger, nullable=False),
        sa.Column("online", sa.Boolean, nullable=False),
        sa.Column("disabled_reason", sa.String(512), nullable=False),
        sa.Column("err_reason", sa.String(512), nullable=False),
        sa.Column("num_failures", sa.Integer, nullable=False),
        sa.Column("registered_at", sa.Float, nullable=False),
        sa.Column("last_report_at", sa.Float, nullable=False),
        sa.Column("validation", sa.JSON, nullable=True),
    )
    op.create_table(
        "sched_quotas",
        sa.Column("user_name", sa.String(128), primary_key=True),
        sa.Column("priority", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("node_group", sa.String(128), primary_key=True),
        sa.Column("max_nodes", sa.Integer, nullable=False),
    )
    op.create_table(
        "sched_tasks",
        sa.Column("task_id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("user_name", sa.String(128), nullable=False),
        sa.Column("uid", sa.Integer, nullable=False),
        sa.Column("request_id", sa.String(128), nullable=True),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("num_nodes", sa.Integer, nullable=False),
        sa.Column("asked_priority", sa.Integer, nullable=True),
        sa.Column("priority", sa.Integer, nullable=True),
        sa.Column("node_group", sa.String(128), nullable=False),
        sa.Column("state", sa.Integer, nullable=False),
        sa.Column("queue_reason", sa.Integer, nullable=False),
        sa.Column("whole_life_state", sa.BigInteger, nullable=False),
        sa.Column("watchdog_time_s", sa.Float, nullable=False),
        sa.Column("max_restarts", sa.Integer, nullable=False),
        sa.Column("suspend_grace_s", sa.Float, nullable=False),
        sa.Column("num_runs", sa.Integer, nullable=False),
        sa.Column("num_restarts", sa.Integer, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("first_started_at", sa.Float, nullable=False),
        sa.Column("finished_at", sa.Float, nullable=False),
        sa.Column("end_reason", sa.Integer, nullable=False),
        sa.Column("end_message", sa.String(1024), nullable=False),
        sa.UniqueConstraint("user_name", "request_id", name="uq_sched_tasks_request"),
    )
    op.create_index("ix_sched_tasks_state", "sched_tasks", ["state"])
    op.create_index("ix_sched_tasks_user", "sched_tasks", ["user_name", "task_id"])
    op.create_table(
        "sched_runs",
        sa.Column("run_id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("task_id", sa.Integer, nullable=False),
        sa.Column("run_index", sa.Integer, nullable=False),
        sa.Column("state", sa.Integer, nullable=False),
        sa.Column("priority", sa.Integer, nullable=False),
        sa.Column("node_ids", sa.JSON, nullable=False),
        sa.Column("master_address", sa.String(255), nullable=False),
        sa.Column("start_whole_life_state", sa.BigInteger, nullable=False),
        sa.Column("suspend_stage", sa.Integer, nullable=False),
        sa.Column("suspend_requested_at", sa.Float, nullable=False),
        sa.Column("suspend_received_at", sa.Float, nullable=False),
        sa.Column("stop_requested_at", sa.Float, nullable=False),
        sa.Column("stop_reason", sa.Integer, nullable=False),
        sa.Column("ack_window_s", sa.Float, nullable=False),
        sa.Column("grace_s", sa.Float, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("ended_at", sa.Float, nullable=False),
        sa.Column("end_reason", sa.Integer, nullable=False),
        sa.Column("end_message", sa.String(1024), nullable=False),
        sa.Column("failure", sa.JSON, nullable=True),
        sa.Column("checkpoint", sa.JSON, nullable=True),
    )
    op.create_index("ix_sched_runs_state", "sched_runs", ["state"])
    op.create_index("ix_sched_runs_task", "sched_runs", ["task_id"])
    op.create_table(
        "sched_run_nodes",
        sa.Column("run_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("node_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("node_rank", sa.Integer, nullable=False),
        sa.Column("phase", sa.Integer, nullable=False),
        sa.Column("last_output_at", sa.Float, nullable=False),
        sa.Column("reported_at", sa.Float, nullable=False),
        sa.Column("failure", sa.JSON, nullable=True),
    )


def downgrade() -> None:
    for table in ("sched_run_nodes", "sched_runs", "sched_tasks", "sched_quotas", "sched_nodes"):
        op.drop_table(table)
