"""The scheduler's domain: nodes, tasks, runs, quotas, and the snapshot a tick decides from."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

ERR_NODES = "err_nodes"


class NodeState(enum.IntEnum):
    """Whether the scheduler places runs on a node (mirror of scheduler.v1.NodeState)."""

    READY = 1
    ERR = 2
    OFFLINE = 3


class TaskState(enum.IntEnum):
    """Where a task is in its life (mirror of scheduler.v1.TaskState)."""

    QUEUED = 1
    RUNNING = 2
    SUSPENDED = 3
    SUCCEEDED = 4
    FAILED = 5
    STOPPED = 6

    @property
    def finished(self) -> bool:
        """The task will not run again."""
        return self in (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.STOPPED)

    @property
    def queued(self) -> bool:
        """The task waits to be scheduled (new, or suspended and requeued)."""
        return self in (TaskState.QUEUED, TaskState.SUSPENDED)


class QueueReason(enum.IntEnum):
    """Why a queued task is not running (mirror of scheduler.v1.QueueReason)."""

    NONE = 0
    WAITING_FOR_NODES = 1
    OUT_OF_QUOTA = 2
    QUOTA_EXCEEDED = 3


class RunState(enum.IntEnum):
    """Where one run of a task is in its life (mirror of scheduler.v1.RunState)."""

    STARTING = 1
    RUNNING = 2
    SUSPENDING = 3
    STOPPING = 4
    SUCCEEDED = 5
    FAILED = 6
    STOPPED = 7
    SUSPENDED = 8

    @property
    def active(self) -> bool:
        """The run holds its nodes."""
        return self <= RunState.STOPPING

    @property
    def draining(self) -> bool:
        """Asked to end: its nodes free up soon, and it must not be preempted again."""
        return self in (RunState.SUSPENDING, RunState.STOPPING)


class SuspendStage(enum.IntEnum):
    """HAI's SUSPEND_CODE."""

    NONE = 1
    SENT = 2
    RECEIVED = 3
    CAN_SUSPEND = 4


class EndReason(enum.IntEnum):
    """Why a run ended (mirror of scheduler.v1.RunEndReason)."""

    NONE = 0
    COMPLETED = 1
    RANK_FAILED = 2
    PREEMPTED = 3
    SUSPENDED_BY_USER = 4
    STOPPED_BY_USER = 5
    STOPPED_BY_ADMIN = 6
    WATCHDOG_TIMEOUT = 7
    NODE_LOST = 8
    LAUNCH_FAILED = 9
    HANG_DETECTED = 10

    @property
    def requeues(self) -> bool:
        """A run ended this way queues its task again without counting a restart."""
        return self in (EndReason.PREEMPTED, EndReason.SUSPENDED_BY_USER)

    @property
    def restartable(self) -> bool:
        """A failure that restarts the task while its restart budget lasts."""
        return self in (EndReason.RANK_FAILED, EndReason.NODE_LOST, EndReason.LAUNCH_FAILED, EndReason.HANG_DETECTED)

    @property
    def run_state(self) -> RunState:
        """The state a run that ended for this reason ends in."""
        if self is EndReason.COMPLETED:
            return RunState.SUCCEEDED
        if self.requeues:
            return RunState.SUSPENDED
        if self in (EndReason.STOPPED_BY_USER, EndReason.STOPPED_BY_ADMIN):
            return RunState.STOPPED
        return RunState.FAILED


class NodePhase(enum.IntEnum):
    """An agent's view of one run on its node (NodeRunPhase)."""

    UNKNOWN = 0
    STARTING = 1
    RUNNING = 2
    SUSPENDING = 3
    STOPPING = 4
    EXITED = 5


class FailureClass(enum.IntEnum):
    """Whose fault a run's failure is: the task's code, the platform, or the machine."""

    UNSPECIFIED = 0
    USER = 1
    PLATFORM = 2
    INFRASTRUCTURE = 3


@dataclass(frozen=True, kw_only=True)
class Failure:
    """The root cause of a failed run (the earliest over its nodes)."""

    failure_class: FailureClass = FailureClass.UNSPECIFIED
    node_id: int = 0
    node_rank: int = 0
    local_rank: int = 0
    exit_code: int = 0
    signal: int = 0
    failed_at: float = 0.0
    message: str = ""
    hang: bool = False  # an agent found the rank hung (collective progress), it did not exit


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeView:
    """A node as the tick sees it: its group, zone and state."""

    node_id: int
    group: str
    zone: str = ""
    state: NodeState = NodeState.READY
    # Consecutive runs on this node that failed for reasons other than the task's own code.
    num_failures: int = 0


@dataclass(kw_only=True, slots=True)
class NodeRunReport:
    """What the agent of one node of a run last reported."""

    phase: NodePhase = NodePhase.UNKNOWN
    last_output_at: float = 0.0
    failure: Failure | None = None


@dataclass(kw_only=True, slots=True)
class RunSnap:
    """An active run as the tick sees it."""

    run_id: int
    task_id: int
    state: RunState
    priority: int
    node_ids: tuple[int, ...]
    created_at: float
    started_at: float = 0.0
    suspend_stage: SuspendStage = SuspendStage.NONE
    suspend_requested_at: float = 0.0
    suspend_received_at: float = 0.0
    stop_requested_at: float = 0.0
    # Why it is suspending or stopping (the end reason it will have).
    stop_reason: EndReason = EndReason.NONE
    # Why it was asked to suspend or stop, in words.
    stop_message: str = ""
    ack_window_s: float = 0.0
    grace_s: float = 0.0
    checkpoint_committed_at: float = 0.0
    # When the last reported checkpoint's state was captured (rank 0's node clock); 0 when not told.
    checkpoint_taken_at: float = 0.0
    reports: dict[int, NodeRunReport] = field(default_factory=dict)
    failure: Failure | None = None


@dataclass(kw_only=True, slots=True)
class TaskSnap:
    """An unfinished task as the tick sees it."""

    task_id: int
    user: str
    group: str
    num_nodes: int
    # The priority in force (after AUTO and demotion); None for an AUTO task not yet placed.
    priority: int | None
    # What the user asked: a level, or None for AUTO.
    asked_priority: int | None
    state: TaskState
    # FCFS key: smaller came first (the chain's first submission).
    fcfs: int
    queue_reason: QueueReason = QueueReason.NONE
    watchdog_time_s: float = 1800.0
    max_restarts: int = 0
    num_restarts: int = 0
    suspend_grace_s: float = 0.0
    run: RunSnap | None = None

    @property
    def is_auto(self) -> bool:
        """The task asked for AUTO priority (the scheduler picks the level)."""
        return self.asked_priority is None


QuotaKey = tuple[str, int, str]  # (user, priority, group)


@dataclass(kw_only=True)
class Snapshot:
    """Everything one tick decides from (the beater's TickData)."""

    now: float
    nodes: dict[int, NodeView]
    tasks: list[TaskSnap]
    quotas: dict[QuotaKey, int]
