"""The scheduler's settings (env prefix FF_SCHEDULER_)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, model_validator

from ff_config import MgmtdClientSettings
from ff_scheduler.core import priority
from ff_scheduler.core.policy import LifecyclePolicy, SchedulingPolicy
from ff_scheduler.core.validation import Limits
from ff_scheduler.core.victims import VictimChoice

ENV_PREFIX = "FF_SCHEDULER_"


class SchedulerSettings(MgmtdClientSettings):
    """The scheduler's settings, loaded once in ``__main__``."""

    state_dir: Path = Field(Path("./scheduler-state"), description="where the default SQLite file lives")
    database_url: SecretStr = Field(
        SecretStr(""), description="SQLAlchemy URL (may hold a password); default sqlite:///<state_dir>/scheduler.db"
    )
    tick_interval_s: float = Field(1.0, gt=0, description="time between scheduling ticks (HAI: 1 s)")
    default_group: str = Field("default", description="node group of tasks and agents that name none")
    default_priority: int = Field(priority.NORMAL, description="priority of tasks that give none")
    min_run_time_s: float = Field(60.0, ge=0, description="a run is not preempted before it ran this long")
    fair_share: bool = Field(False, description="within a priority, users holding fewer nodes go first")
    victim_choice: VictimChoice = Field(
        VictimChoice.LEAST_IMPORTANT_LATEST,
        description=(
            "preempt HAI's lowest level, latest first; the least work lost since checkpoints (cheapest);"
            " or the fewest victims, then the least of that loss per second of their runs (fewest)"
            " or per node, the freshest checkpoints (fewest_freshest)"
        ),
    )
    victim_restart_cost_s: float = Field(60.0, ge=0, description="reload time a victim's loss counts per node")
    preempt_same_level: bool = Field(True, description="another user's task of the same level may be preempted (HAI)")
    preempt_from_level: int = Field(priority.LOW, description="only tasks at this level or above preempt")
    resume_first: bool = Field(
        False, description="suspended tasks resume ahead of the queued tasks of the levels that cannot preempt"
    )
    ack_window_s: float = Field(5.0, gt=0, description="time rank 0 has to read the suspend flag")
    check_checkpoints: bool = Field(
        True, description="count a reported checkpoint only when its file is in 3FS, owned by the task's user"
    )
    default_grace_s: float = Field(60.0, gt=0, description="time to checkpoint and go_suspend() after the flag")
    max_grace_s: float = Field(600.0, gt=0, description="cap of a task's own suspend grace")
    start_timeout_s: float = Field(300.0, gt=0, description="a run not running everywhere after this failed")
    stop_timeout_s: float = Field(120.0, gt=0, description="a node not confirming a stop after this goes to err_nodes")
    node_failure_threshold: int = Field(3, ge=1, description="consecutive non-user run failures -> err_nodes")
    default_max_restarts: int = Field(3, ge=0, description="failure restarts of a task before it fails")
    default_watchdog_time_s: float = Field(1800.0, gt=0, description="log silence that fails a run (HAI: 1800 s)")
    max_command_bytes: int = Field(64 * 1024, gt=0, description="size limit of a task's command and environment")
    master_port: int = Field(2222, gt=0, lt=65536, description="MASTER_PORT given to the ranks (HAI: 2222)")
    order_resend_interval_s: float = Field(5.0, gt=0, description="resend unanswered orders to agents this often")
    term_grace_s: float = Field(10.0, ge=0, description="SIGTERM-to-SIGKILL delay agents give a run's processes")
    telemetry_interval_s: float = Field(
        10.0, ge=0, description="push the queue's counts (pending by reason, running, suspends) this often; 0: never"
    )
    agent_call_timeout_s: float = Field(5.0, gt=0, description="deadline of calls to agents")

    @model_validator(mode="after")
    def _check(self) -> SchedulerSettings:
        for name in ("default_priority", "preempt_from_level"):
            if not priority.is_level(getattr(self, name)):
                raise ValueError(f"{name} must be a level: {priority.describe_levels()}")
        if self.default_grace_s > self.max_grace_s:
            raise ValueError("default_grace_s must be at most max_grace_s")
        return self

    def resolved_database_url(self) -> str:
        """The database to open: ``database_url``, else a SQLite file in ``state_dir`` (holds secrets: not logged)."""
        return self.database_url.get_secret_value() or f"sqlite:///{self.state_dir / 'scheduler.db'}"

    def scheduling_policy(self) -> SchedulingPolicy:
        """The matcher's policy from these settings."""
        return SchedulingPolicy(
            min_run_time_s=self.min_run_time_s,
            fair_share=self.fair_share,
            victim_choice=self.victim_choice,
            victim_restart_cost_s=self.victim_restart_cost_s,
            preempt_same_level=self.preempt_same_level,
            preempt_from_level=self.preempt_from_level,
            resume_first=self.resume_first,
        )

    def lifecycle_policy(self) -> LifecyclePolicy:
        """The run lifecycle's deadlines and thresholds from these settings."""
        return LifecyclePolicy(
            ack_window_s=self.ack_window_s,
            default_grace_s=self.default_grace_s,
            max_grace_s=self.max_grace_s,
            start_timeout_s=self.start_timeout_s,
            stop_timeout_s=self.stop_timeout_s,
            node_failure_threshold=self.node_failure_threshold,
        )

    def limits(self) -> Limits:
        """What a submission may ask for, and the defaults it gets, from these settings."""
        return Limits(
            max_command_bytes=self.max_command_bytes,
            default_group=self.default_group,
            default_priority=self.default_priority,
            default_watchdog_time_s=self.default_watchdog_time_s,
            default_max_restarts=self.default_max_restarts,
        )
