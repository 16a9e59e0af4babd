"""The knobs of the tick pipeline (the service's settings and the simulator's policies set them)."""

from __future__ import annotations

from dataclasses import dataclass

from ff_scheduler.core import priority
from ff_scheduler.core.victims import VictimChoice


@dataclass(frozen=True, kw_only=True)
class SchedulingPolicy:
    """How the assigner and matcher decide.

    Attributes:
        preemption: suspend running tasks for higher ones (HAI time-sharing); off = nothing is ever
            suspended by the scheduler.
        by_priority: order by priority, then FCFS (HAI); off = one FCFS queue whatever the priority.
        head_of_line_blocking: a queued task that cannot start blocks every task after it in its group
            (strict FIFO); off = later tasks that fit start (HAI skips what does not fit).
        enforce_quotas: check (user, priority, group) node quotas; off = unlimited (simulator).
        fair_share: within a priority level of a group, users holding fewer nodes go first (FCFS
            within a user); off = FCFS across users (HAI).
        min_run_time_s: a run is not preempted before it has run this long.
        demote_after_s: ABOVE_NORMAL runs drop to NORMAL after this long.
        victim_choice: which of the tasks it may preempt the matcher suspends (``core.victims``): HAI's
            lowest level, then the latest submitted (default); the least node-time lost since their last
            durable checkpoints, weighed by their sizes (``cheapest``); or the fewest victims, then the least
            of that loss per second of their runs (``fewest``) or per node, the freshest checkpoints
            (``fewest_freshest``: with ``preempt_same_level`` off, ``preempt_from_level`` HIGH and
            ``resume_first`` on it is the simulator's "hai").
        victim_restart_cost_s: what a preempted task's next run spends reloading, per node, in the loss
            the cheapest choice weighs (beside the work since its last durable checkpoint).
        preempt_same_level: a queued task may preempt another user's running task of its own level (HAI's
            time-sharing within a level); off = only lower levels are preempted.
        preempt_from_level: only a queued task at this level or above preempts (HAI: any level, LOW).
        resume_first: a suspended task waiting to resume (preempted, suspended by its user, or restarted
            after a failure) goes first among its level's queued tasks and, below ``preempt_from_level``,
            right after that level's tasks, ahead of every queued task of the levels that cannot preempt:
            it lost its nodes to time-sharing, not to the queue, so later arrivals of the levels between do
            not overtake it; it stays behind the preempting levels, which would only suspend it again. Off:
            it queues by its first submission within its own level (HAI).
    """

    preemption: bool = True
    by_priority: bool = True
    head_of_line_blocking: bool = False
    enforce_quotas: bool = True
    fair_share: bool = False
    min_run_time_s: float = 60.0
    demote_after_s: float = priority.DEMOTE_AFTER_S
    victim_choice: VictimChoice = VictimChoice.LEAST_IMPORTANT_LATEST
    victim_restart_cost_s: float = 60.0
    preempt_same_level: bool = True
    preempt_from_level: int = priority.LOW
    resume_first: bool = False


@dataclass(frozen=True, kw_only=True)
class LifecyclePolicy:
    """Deadlines of runs (the suspend protocol, starts, stops, failures).

    Attributes:
        ack_window_s: time rank 0 has to read the suspend flag (HAI: 5 s).
        default_grace_s: time after the acknowledgement to checkpoint and go_suspend() (HAI: 5 s).
        max_grace_s: cap of a task's own suspend_grace_s.
        start_timeout_s: a run not running on every node after this long failed to launch.
        stop_timeout_s: a node that has not confirmed a stop after this long goes to err_nodes.
        node_failure_threshold: consecutive non-user run failures that put a node in err_nodes.
    """

    ack_window_s: float = 5.0
    default_grace_s: float = 60.0
    max_grace_s: float = 600.0
    start_timeout_s: float = 300.0
    stop_timeout_s: float = 120.0
    node_failure_threshold: int = 3

    def grace_for(self, asked_s: float) -> float:
        """The suspend grace a task gets: what it asked (capped at ``max_grace_s``), else the default."""
        return min(asked_s, self.max_grace_s) if asked_s > 0 else self.default_grace_s
