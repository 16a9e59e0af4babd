"""Runs through their states: start, failures, the watchdog, the suspend protocol and forced stops.

Pure: each function takes a run as the last reports left it and the time, and answers the change to
make. The driver applies it (guarded by the state it was decided from) and sends the orders.

Suspend protocol (HAI's, with a longer, configurable grace): the flag goes to rank 0 (stage SENT); if
rank 0 does not read it within the acknowledge window, the run is stopped at once; once read
(RECEIVED), the task has the grace to checkpoint and call go_suspend() (CAN_SUSPEND), after which, or
when the grace is over, the run is stopped. A checkpoint taken (its state captured) after rank 0 read
the flag also lets the scheduler stop it at once; one the task started before, even if it commits
after, does not (it lacks the steps since: the task saves again and calls go_suspend()). A stop ends
when every node confirmed that its processes exited (a node that went offline counts as exited); a
node that has not confirmed after ``stop_timeout_s`` goes to err_nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ff_scheduler.core.model import (
    EndReason,
    Failure,
    FailureClass,
    NodePhase,
    NodeState,
    NodeView,
    RunSnap,
    RunState,
    SuspendStage,
    TaskSnap,
    TaskState,
)
from ff_scheduler.core.policy import LifecyclePolicy


@dataclass(frozen=True, kw_only=True)
class RunChange:
    """Move a run from ``expect`` to ``state`` (or change its priority), with why."""

    run_id: int
    task_id: int
    expect: RunState
    state: RunState
    reason: EndReason = EndReason.NONE
    failure: Failure | None = None
    message: str = ""
    priority: int | None = None
    ack_window_s: float = 0.0
    grace_s: float = 0.0


@dataclass(frozen=True, kw_only=True)
class TaskOutcome:
    """What becomes of a task whose run ended."""

    state: TaskState
    num_restarts: int
    message: str = ""


@dataclass(frozen=True, kw_only=True)
class NodeVerdict:
    """A node's failure count after a run ended on it, and whether it goes to err_nodes."""

    node_id: int
    num_failures: int
    err_reason: str = ""


@dataclass
class RunStep:
    """What one tick decides for one run: its change, if any, and the verdicts on its nodes."""

    change: RunChange | None = None
    node_verdicts: list[NodeVerdict] = field(default_factory=list)


def request_suspend(run: RunSnap, reason: EndReason, policy: LifecyclePolicy, task_grace_s: float) -> RunChange | None:
    """Start the suspend protocol on an active run (None when it is already ending)."""
    if run.state not in (RunState.STARTING, RunState.RUNNING):
        return None
    return RunChange(
        run_id=run.run_id,
        task_id=run.task_id,
        expect=run.state,
        state=RunState.SUSPENDING,
        reason=reason,
        ack_window_s=policy.ack_window_s,
        grace_s=policy.grace_for(task_grace_s),
        message="suspend flag sent to rank 0",
    )


def request_stop(run: RunSnap, reason: EndReason, message: str = "") -> RunChange | None:
    """Stop an active run now (a suspending one too: the stop wins)."""
    if run.state not in (RunState.STARTING, RunState.RUNNING, RunState.SUSPENDING):
        return None
    return RunChange(
        run_id=run.run_id,
        task_id=run.task_id,
        expect=run.state,
        state=RunState.STOPPING,
        reason=reason,
        message=message,
    )


def _exited(run: RunSnap, node_id: int, nodes: dict[int, NodeView]) -> bool:
    node = nodes.get(node_id)
    report = run.reports.get(node_id)
    return node is None or node.state is NodeState.OFFLINE or (report is not None and report.phase is NodePhase.EXITED)


def _earliest_failure(run: RunSnap) -> Failure | None:
    """The root cause: the earliest failure.

    At equal times the lowest node rank, then local rank, then node id: not the order the reports were read in.
    """
    failures = [r.failure for r in run.reports.values() if r.failure is not None]
    return min(failures, key=lambda f: (f.failed_at, f.node_rank, f.local_rank, f.node_id)) if failures else None


def step_run(task: TaskSnap, nodes: dict[int, NodeView], now: float, policy: LifecyclePolicy) -> RunStep:
    """The change the run of ``task`` needs now, if any."""
    run = task.run
    assert run is not None
    all_exited = all(_exited(run, n, nodes) for n in run.node_ids)
    step = RunStep()
    if run.state in (RunState.STARTING, RunState.RUNNING):
        step.change = _step_live(task, run, nodes, now, policy, all_exited)
    elif run.state is RunState.SUSPENDING:
        step.change = _step_suspending(run, now, all_exited)
    elif run.state is RunState.STOPPING:
        step.change, step.node_verdicts = _step_stopping(run, nodes, now, policy, all_exited)
    if step.change is not None and not step.change.state.active:
        step.node_verdicts = _node_verdicts(run, nodes, step.change, policy, step.node_verdicts)
    return step


def _end(run: RunSnap, reason: EndReason, failure: Failure | None = None, message: str = "") -> RunChange:
    return RunChange(
        run_id=run.run_id,
        task_id=run.task_id,
        expect=run.state,
        state=reason.run_state,
        reason=reason,
        failure=failure,
        message=message,
    )


def _stop_or_end(run: RunSnap, reason: EndReason, all_exited: bool, failure: Failure | None, message: str) -> RunChange:
    if all_exited:
        return _end(run, reason, failure, message)
    return RunChange(
        run_id=run.run_id,
        task_id=run.task_id,
        expect=run.state,
        state=RunState.STOPPING,
        reason=reason,
        failure=failure,
        message=message,
    )


def _step_live(
    task: TaskSnap, run: RunSnap, nodes: dict[int, NodeView], now: float, policy: LifecyclePolicy, all_exited: bool
) -> RunChange | None:
    lost = [n for n in run.node_ids if n not in nodes or nodes[n].state is NodeState.OFFLINE]
    if lost:
        failure = Failure(
            failure_class=FailureClass.INFRASTRUCTURE,
            node_id=lost[0],
            failed_at=now,
            node_rank=run.node_ids.index(lost[0]),
            message=f"node {lost[0]} lost its lease",
        )
        return _stop_or_end(run, EndReason.NODE_LOST, all_exited, failure, failure.message)
    first = _earliest_failure(run)
    if first is not None:
        failure = first
        launch = run.state is RunState.STARTING and failure.failure_class is FailureClass.PLATFORM
        reason = (
            EndReason.LAUNCH_FAILED if launch else EndReason.HANG_DETECTED if failure.hang else EndReason.RANK_FAILED
        )
        return _stop_or_end(
            run, reason, all_exited, failure, failure.message or f"rank failed on node {failure.node_id}"
        )
    if all_exited:
        return _end(run, EndReason.COMPLETED, message="every rank exited 0")
    if run.state is RunState.STARTING:
        if all(run.reports.get(n) is not None and run.reports[n].phase >= NodePhase.RUNNING for n in run.node_ids):
            return RunChange(run_id=run.run_id, task_id=run.task_id, expect=run.state, state=RunState.RUNNING)
        if now - run.created_at > policy.start_timeout_s:
            return _stop_or_end(
                run,
                EndReason.LAUNCH_FAILED,
                False,
                None,
                f"not running on every node after {policy.start_timeout_s:g} s",
            )
        return None
    last_output = max([run.started_at, *(r.last_output_at for r in run.reports.values())])
    if task.watchdog_time_s > 0 and now - last_output > task.watchdog_time_s:
        return _stop_or_end(
            run, EndReason.WATCHDOG_TIMEOUT, False, None, f"no log output for {task.watchdog_time_s:g} s (watchdog)"
        )
    return None


def _step_suspending(run: RunSnap, now: float, all_exited: bool) -> RunChange | None:
    reason = run.stop_reason
    if all_exited:
        return _end(run, reason, message="suspended")
    if run.suspend_stage is SuspendStage.CAN_SUSPEND:
        return _stop_or_end(run, reason, False, None, "the task called go_suspend()")
    if _suspend_checkpoint_committed(run):
        return _stop_or_end(run, reason, False, None, "checkpoint committed: evicted at once")
    if run.suspend_stage < SuspendStage.RECEIVED and now >= run.suspend_requested_at + run.ack_window_s:
        return _stop_or_end(
            run, reason, False, None, f"suspend not acknowledged within {run.ack_window_s:g} s: forced stop"
        )
    received_at = run.suspend_received_at or run.suspend_requested_at
    if run.suspend_stage is SuspendStage.RECEIVED and now >= received_at + run.grace_s:
        return _stop_or_end(run, reason, False, None, f"grace of {run.grace_s:g} s is over: forced stop")
    return None


def _suspend_checkpoint_committed(run: RunSnap) -> bool:
    """Whether the last checkpoint is the one the suspend asked for: taken after rank 0 read the flag.

    Both times are rank 0's node clock (the acknowledgement's and the snapshot's), so skew between the
    scheduler and the node does not matter. A checkpoint without a snapshot time never counts here.
    """
    received_at = run.suspend_received_at
    return (
        run.suspend_stage >= SuspendStage.RECEIVED
        and received_at > 0
        and run.checkpoint_committed_at > 0
        and run.checkpoint_taken_at >= received_at
    )


def _step_stopping(
    run: RunSnap, nodes: dict[int, NodeView], now: float, policy: LifecyclePolicy, all_exited: bool
) -> tuple[RunChange | None, list[NodeVerdict]]:
    if all_exited:
        return _end_stopped(run, nodes, now), []
    if now - run.stop_requested_at <= policy.stop_timeout_s:
        return None, []
    stuck = [n for n in run.node_ids if not _exited(run, n, nodes)]
    verdicts = [
        NodeVerdict(
            node_id=n,
            num_failures=nodes[n].num_failures,
            err_reason=f"run {run.run_id} did not stop within {policy.stop_timeout_s:g} s",
        )
        for n in stuck
    ]
    return _end(run, run.stop_reason, run.failure, run.stop_message), verdicts


def _end_stopped(run: RunSnap, nodes: dict[int, NodeView], now: float) -> RunChange:
    """The end of a run stopped for a rank's failure, or for what it was asked to stop.

    A node that dies takes its ranks with it; their peers on the other nodes see a broken connection at once
    and fail, while the dead node's lease lapses only seconds later. So a run stopping for a rank failure,
    whose node was then lost without having reported its ranks' exit or a failure of its own, ended because of
    that node: NODE_LOST, blaming it (the peers' failure stays in the message).
    """
    first = run.failure
    if run.stop_reason is EndReason.RANK_FAILED and first is not None:
        silent = [n for n in run.node_ids if n != first.node_id and _lost_silently(run, n, nodes)]
        if silent:
            node_id = silent[0]
            failure = Failure(
                failure_class=FailureClass.INFRASTRUCTURE,
                node_id=node_id,
                node_rank=run.node_ids.index(node_id),
                failed_at=now,
                message=f"node {node_id} lost its lease (its ranks' peers failed first: {first.message})",
            )
            return _end(run, EndReason.NODE_LOST, failure, failure.message)
    return _end(run, run.stop_reason, first, run.stop_message)


def _lost_silently(run: RunSnap, node_id: int, nodes: dict[int, NodeView]) -> bool:
    node, report = nodes.get(node_id), run.reports.get(node_id)
    lost = node is None or node.state is NodeState.OFFLINE
    told = report is not None and (report.phase is NodePhase.EXITED or report.failure is not None)
    return lost and not told


def _node_verdicts(
    run: RunSnap, nodes: dict[int, NodeView], change: RunChange, policy: LifecyclePolicy, already: list[NodeVerdict]
) -> list[NodeVerdict]:
    """Count non-user failures against the node blamed; a completed run clears its nodes' counts.

    A node whose rank hung goes to err_nodes at once (cordoned): a rank that stops entering collectives
    while it still runs is a node fault more often than not (a stuck device, a lost link), and the task's
    next run must not be placed there. An admin (SetNodeEnabled) or a passing validation returns it.
    """
    verdicts = {v.node_id: v for v in already}
    if change.reason is EndReason.COMPLETED:
        for n in run.node_ids:
            if n in nodes and nodes[n].num_failures and n not in verdicts:
                verdicts[n] = NodeVerdict(node_id=n, num_failures=0)
    elif change.reason.restartable and change.failure is not None:
        blamed = change.failure.node_id
        user_fault = change.failure.failure_class is FailureClass.USER
        if blamed in nodes and not user_fault and blamed not in verdicts:
            count = nodes[blamed].num_failures + 1
            err = f"{count} runs failed on it in a row" if count >= policy.node_failure_threshold else ""
            if change.failure.hang:
                err = hang_cordon_reason(run, change.failure)
            verdicts[blamed] = NodeVerdict(node_id=blamed, num_failures=count, err_reason=err)
    return list(verdicts.values())


def hang_cordon_reason(run: RunSnap, failure: Failure) -> str:
    """Why a node is in err_nodes after a rank on it hung: the run, the task, and the agent's account of the rank."""
    account = failure.message or f"node rank {failure.node_rank}, local rank {failure.local_rank} hung"
    return f"cordoned: task {run.task_id} run {run.run_id}: {account}"


def task_outcome(task: TaskSnap, reason: EndReason) -> TaskOutcome:
    """A task's state after its run ended for ``reason``."""
    if reason is EndReason.COMPLETED:
        return TaskOutcome(state=TaskState.SUCCEEDED, num_restarts=task.num_restarts)
    if reason.requeues:
        return TaskOutcome(state=TaskState.SUSPENDED, num_restarts=task.num_restarts, message="suspended; queued again")
    if reason in (EndReason.STOPPED_BY_USER, EndReason.STOPPED_BY_ADMIN):
        return TaskOutcome(state=TaskState.STOPPED, num_restarts=task.num_restarts, message="stopped")
    if reason.restartable and task.num_restarts < task.max_restarts:
        return TaskOutcome(
            state=TaskState.SUSPENDED,
            num_restarts=task.num_restarts + 1,
            message=f"restart {task.num_restarts + 1} of {task.max_restarts}",
        )
    if reason.restartable:
        return TaskOutcome(
            state=TaskState.FAILED,
            num_restarts=task.num_restarts,
            message=f"{reason.name.lower()}; restart limit {task.max_restarts} reached",
        )
    return TaskOutcome(state=TaskState.FAILED, num_restarts=task.num_restarts, message=reason.name.lower())
