"""Runs through their states: suspend protocol, failures, watchdog, lease loss, err_nodes (pure)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ff_scheduler.core import priority as p
from ff_scheduler.core.builders import nodes, running, with_state
from ff_scheduler.core.lifecycle import request_stop, request_suspend, step_run, task_outcome
from ff_scheduler.core.model import (
    EndReason,
    Failure,
    FailureClass,
    NodePhase,
    NodeRunReport,
    NodeState,
    RunState,
    SuspendStage,
    TaskSnap,
    TaskState,
)
from ff_scheduler.core.policy import LifecyclePolicy

T0 = 1000.0
POLICY = LifecyclePolicy(
    ack_window_s=5, default_grace_s=60, stop_timeout_s=30, start_timeout_s=100, node_failure_threshold=2
)


def suspending(
    stage: SuspendStage, *, received_at: float = 0.0, checkpoint_at: float = 0.0, taken_at: float = 0.0
) -> TaskSnap:
    task = running(1, (1, 2), p.LOW, started_at=T0 - 100)
    assert task.run is not None
    change = request_suspend(task.run, EndReason.PREEMPTED, POLICY, 0)
    assert change is not None and change.state is RunState.SUSPENDING and change.grace_s == 60
    run = replace(
        task.run,
        state=RunState.SUSPENDING,
        suspend_stage=stage,
        suspend_requested_at=T0,
        suspend_received_at=received_at,
        ack_window_s=change.ack_window_s,
        grace_s=change.grace_s,
        stop_reason=EndReason.PREEMPTED,
        checkpoint_committed_at=checkpoint_at,
        checkpoint_taken_at=taken_at,
    )
    return replace(task, run=run)


@pytest.mark.parametrize(
    ("name", "task", "now", "expected_state", "message_part"),
    [
        ("flag sent, within the acknowledge window: wait", suspending(SuspendStage.SENT), T0 + 4.9, None, ""),
        (
            "no acknowledgment within the window: forced stop",
            suspending(SuspendStage.SENT),
            T0 + 5,
            RunState.STOPPING,
            "not acknowledged",
        ),
        ("acknowledged: the grace runs", suspending(SuspendStage.RECEIVED, received_at=T0 + 1), T0 + 60, None, ""),
        (
            "acknowledged, grace over: forced stop",
            suspending(SuspendStage.RECEIVED, received_at=T0 + 1),
            T0 + 61,
            RunState.STOPPING,
            "grace",
        ),
        (
            "go_suspend(): stopped at once",
            suspending(SuspendStage.CAN_SUSPEND),
            T0 + 2,
            RunState.STOPPING,
            "go_suspend",
        ),
        (
            "checkpoint taken after the flag was read: evicted at once",
            suspending(SuspendStage.RECEIVED, received_at=T0 + 1, checkpoint_at=T0 + 2, taken_at=T0 + 1.5),
            T0 + 3,
            RunState.STOPPING,
            "checkpoint committed",
        ),
        (
            "a checkpoint older than the suspend does not count",
            suspending(SuspendStage.RECEIVED, received_at=T0 + 1, checkpoint_at=T0 - 1, taken_at=T0 - 2),
            T0 + 3,
            None,
            "",
        ),
        (
            # A periodic save the task started before it read the flag commits after it: it lacks the steps
            # since, and the task is saving again (then calls go_suspend()); ending the run now loses them.
            "a save started before the flag was read and committed after it does not count",
            suspending(SuspendStage.RECEIVED, received_at=T0 + 1, checkpoint_at=T0 + 2, taken_at=T0 + 0.5),
            T0 + 3,
            None,
            "",
        ),
        (
            "a checkpoint without its snapshot time does not end a suspend",
            suspending(SuspendStage.RECEIVED, received_at=T0 + 1, checkpoint_at=T0 + 2),
            T0 + 3,
            None,
            "",
        ),
        (
            "a checkpoint before the flag is read does not count, whenever it was taken",
            suspending(SuspendStage.SENT, checkpoint_at=T0 + 2, taken_at=T0 + 1),
            T0 + 3,
            None,
            "",
        ),
    ],
)
def test_suspend_protocol(
    name: str, task: TaskSnap, now: float, expected_state: RunState | None, message_part: str
) -> None:
    change = step_run(task, nodes(2), now, POLICY).change
    if expected_state is None:
        assert change is None
    else:
        assert change is not None and change.state is expected_state and change.reason is EndReason.PREEMPTED
        assert message_part in change.message


def test_suspend_ends_when_every_node_exited_and_task_requeues() -> None:
    task = suspending(SuspendStage.CAN_SUSPEND)
    assert task.run is not None
    stopping = replace(task.run, state=RunState.STOPPING, stop_requested_at=T0 + 2)
    half = replace(
        stopping, reports={1: NodeRunReport(phase=NodePhase.EXITED), 2: NodeRunReport(phase=NodePhase.STOPPING)}
    )
    assert step_run(replace(task, run=half), nodes(2), T0 + 3, POLICY).change is None
    done = replace(stopping, reports={n: NodeRunReport(phase=NodePhase.EXITED) for n in (1, 2)})
    change = step_run(replace(task, run=done), nodes(2), T0 + 3, POLICY).change
    assert change is not None and change.state is RunState.SUSPENDED
    outcome = task_outcome(task, change.reason)
    assert outcome.state is TaskState.SUSPENDED and outcome.num_restarts == 0


def test_stop_not_confirmed_in_time_puts_the_node_in_err_nodes() -> None:
    task = running(1, (1, 2), p.LOW, started_at=T0)
    assert task.run is not None
    reports = {1: NodeRunReport(phase=NodePhase.EXITED), 2: NodeRunReport(phase=NodePhase.STOPPING)}
    run = replace(
        task.run, state=RunState.STOPPING, stop_requested_at=T0, stop_reason=EndReason.STOPPED_BY_USER, reports=reports
    )
    assert step_run(replace(task, run=run), nodes(2), T0 + 30, POLICY).change is None
    step = step_run(replace(task, run=run), nodes(2), T0 + 31, POLICY)
    assert step.change is not None and step.change.state is RunState.STOPPED
    assert [(v.node_id, bool(v.err_reason)) for v in step.node_verdicts] == [(2, True)]


def failed(node_id: int, cls: FailureClass, at: float = T0 + 5) -> NodeRunReport:
    return NodeRunReport(
        phase=NodePhase.EXITED,
        failure=Failure(failure_class=cls, node_id=node_id, exit_code=1, failed_at=at, message="boom"),
    )


def test_rank_failure_stops_the_other_nodes_then_fails_with_the_earliest_root_cause() -> None:
    task = running(1, (1, 2), p.LOW, started_at=T0, max_restarts=1)
    assert task.run is not None
    run = replace(
        task.run, reports={1: failed(1, FailureClass.USER, T0 + 7), 2: failed(2, FailureClass.INFRASTRUCTURE)}
    )
    change = step_run(replace(task, run=run), nodes(2), T0 + 10, POLICY).change
    assert change is not None and change.state is RunState.FAILED and change.reason is EndReason.RANK_FAILED
    assert change.failure is not None and change.failure.node_id == 2
    hung = NodeRunReport(
        phase=NodePhase.RUNNING,
        failure=Failure(
            failure_class=FailureClass.INFRASTRUCTURE,
            node_id=2,
            local_rank=1,
            failed_at=T0 + 3,
            message="hang: rank 3",
            hang=True,
        ),
    )
    change = step_run(
        replace(task, run=replace(task.run, reports={1: failed(1, FailureClass.USER), 2: hung})),
        nodes(2),
        T0 + 10,
        POLICY,
    ).change
    assert change is not None and change.state is RunState.STOPPING and change.reason is EndReason.HANG_DETECTED
    assert change.failure is not None and change.failure.hang and change.failure.node_id == 2
    partial = replace(task.run, reports={1: failed(1, FailureClass.USER), 2: NodeRunReport(phase=NodePhase.RUNNING)})
    change = step_run(replace(task, run=partial), nodes(2), T0 + 10, POLICY).change
    assert change is not None and change.state is RunState.STOPPING


def test_a_tie_between_root_causes_does_not_depend_on_the_order_of_the_reports() -> None:
    """Two nodes failing at the same time: the lower node rank is the root cause, whichever report came first."""
    task = running(1, (1, 2), p.LOW, started_at=T0, max_restarts=1)
    assert task.run is not None
    first = replace(failed(5, FailureClass.INFRASTRUCTURE), failure=Failure(node_id=5, node_rank=1, failed_at=T0 + 5))
    second = replace(failed(9, FailureClass.USER), failure=Failure(node_id=9, node_rank=0, failed_at=T0 + 5))
    picked = set()
    for reports in ({1: first, 2: second}, {2: second, 1: first}):
        change = step_run(replace(task, run=replace(task.run, reports=reports)), nodes(2), T0 + 10, POLICY).change
        assert change is not None and change.failure is not None
        picked.add(change.failure.node_id)
    assert picked == {9}


@pytest.mark.parametrize(
    ("reason", "num_restarts", "max_restarts", "state", "restarts_after"),
    [
        (EndReason.COMPLETED, 0, 0, TaskState.SUCCEEDED, 0),
        (EndReason.PREEMPTED, 0, 0, TaskState.SUSPENDED, 0),
        (EndReason.SUSPENDED_BY_USER, 2, 2, TaskState.SUSPENDED, 2),
        (EndReason.STOPPED_BY_USER, 0, 3, TaskState.STOPPED, 0),
        (EndReason.RANK_FAILED, 0, 2, TaskState.SUSPENDED, 1),
        (EndReason.NODE_LOST, 1, 2, TaskState.SUSPENDED, 2),
        (EndReason.NODE_LOST, 2, 2, TaskState.FAILED, 2),
        (EndReason.WATCHDOG_TIMEOUT, 0, 5, TaskState.FAILED, 0),
    ],
)
def test_task_outcome(
    reason: EndReason, num_restarts: int, max_restarts: int, state: TaskState, restarts_after: int
) -> None:
    task = replace(running(1, (1,), p.LOW), num_restarts=num_restarts, max_restarts=max_restarts)
    outcome = task_outcome(task, reason)
    assert (outcome.state, outcome.num_restarts) == (state, restarts_after)


def test_restart_limit_reached_says_so() -> None:
    outcome = task_outcome(replace(running(1, (1,), p.LOW), num_restarts=3, max_restarts=3), EndReason.NODE_LOST)
    assert outcome.state is TaskState.FAILED and "restart limit 3 reached" in outcome.message


def test_node_lost_fails_the_run_and_counts_against_the_node() -> None:
    task = running(1, (1, 2), p.LOW, started_at=T0)
    all_nodes = with_state(nodes(2), 2, NodeState.OFFLINE)
    step = step_run(task, all_nodes, T0 + 1, POLICY)
    assert step.change is not None and step.change.state is RunState.STOPPING
    assert step.change.reason is EndReason.NODE_LOST and step.change.failure is not None
    assert step.change.failure.node_id == 2


def test_repeated_non_user_failures_put_the_node_in_err_nodes_and_success_clears() -> None:
    task = running(1, (1, 2), p.LOW, started_at=T0)
    assert task.run is not None
    run = replace(
        task.run, reports={1: failed(1, FailureClass.INFRASTRUCTURE), 2: NodeRunReport(phase=NodePhase.EXITED)}
    )
    first = step_run(replace(task, run=run), nodes(2), T0 + 10, POLICY).node_verdicts
    assert [(v.node_id, v.num_failures, v.err_reason) for v in first] == [(1, 1, "")]
    again = {1: replace(nodes(2)[1], num_failures=1), 2: nodes(2)[2]}
    second = step_run(replace(task, run=run), again, T0 + 10, POLICY).node_verdicts
    assert [(v.node_id, v.num_failures) for v in second] == [(1, 2)] and second[0].err_reason
    user_fault = replace(task.run, reports={1: failed(1, FailureClass.USER), 2: NodeRunReport(phase=NodePhase.EXITED)})
    assert step_run(replace(task, run=user_fault), again, T0 + 10, POLICY).node_verdicts == []
    ok = replace(task.run, reports={n: NodeRunReport(phase=NodePhase.EXITED) for n in (1, 2)})
    cleared = step_run(replace(task, run=ok), again, T0 + 10, POLICY).node_verdicts
    assert [(v.node_id, v.num_failures) for v in cleared] == [(1, 0)]


def test_peers_that_failed_before_their_dead_node_was_noticed_blame_that_node() -> None:
    task = replace(running(1, (1, 2), p.LOW, started_at=T0), max_restarts=2)
    assert task.run is not None
    peer = Failure(
        failure_class=FailureClass.USER,
        node_id=1,
        exit_code=1,
        failed_at=T0 + 1,
        message="local rank 1 exited with 1: RuntimeError: Connection reset by peer",
    )
    stopping = replace(
        task.run,
        state=RunState.STOPPING,
        stop_reason=EndReason.RANK_FAILED,
        stop_requested_at=T0 + 1,
        failure=peer,
        reports={1: NodeRunReport(phase=NodePhase.EXITED, failure=peer), 2: NodeRunReport(phase=NodePhase.RUNNING)},
    )
    # Node 2's agent died with its ranks: it never reports; its lease lapses 10 s later.
    assert step_run(replace(task, run=stopping), nodes(2), T0 + 5, POLICY).change is None
    lost = with_state(nodes(2), 2, NodeState.OFFLINE)
    ended = step_run(replace(task, run=stopping), lost, T0 + 11, POLICY)
    assert ended.change is not None and ended.change.reason is EndReason.NODE_LOST
    failure = ended.change.failure
    assert failure is not None and (failure.node_id, failure.node_rank, failure.failed_at) == (2, 1, T0 + 11)
    assert failure.failure_class is FailureClass.INFRASTRUCTURE and "Connection reset by peer" in failure.message
    assert [(v.node_id, v.num_failures) for v in ended.node_verdicts] == [(2, 1)]
    # A lost node that had reported its ranks' exit did not cause the failure: the peers' failure stands.
    told = replace(stopping, reports={**stopping.reports, 2: NodeRunReport(phase=NodePhase.EXITED)})
    change = step_run(replace(task, run=told), lost, T0 + 11, POLICY).change
    assert change is not None and change.reason is EndReason.RANK_FAILED and change.failure == peer


def test_a_hung_rank_cordons_its_node_at_once_and_requeues_the_task() -> None:
    task = replace(running(1, (1, 2), p.LOW, started_at=T0), max_restarts=2)
    assert task.run is not None
    message = "hang: rank 3 (node rank 1, local rank 1) finished collective 5 but never entered 6"
    hang = Failure(
        failure_class=FailureClass.INFRASTRUCTURE,
        node_id=2,
        node_rank=1,
        local_rank=1,
        failed_at=T0 + 5,
        message=message,
        hang=True,
    )
    hung = replace(
        task.run,
        reports={1: NodeRunReport(phase=NodePhase.RUNNING), 2: NodeRunReport(phase=NodePhase.RUNNING, failure=hang)},
    )
    stopping = step_run(replace(task, run=hung), nodes(3), T0 + 6, POLICY)
    assert stopping.change is not None and stopping.change.state is RunState.STOPPING
    assert stopping.change.reason is EndReason.HANG_DETECTED and stopping.node_verdicts == []
    stopped = replace(
        hung,
        state=RunState.STOPPING,
        stop_reason=EndReason.HANG_DETECTED,
        stop_requested_at=T0 + 6,
        failure=hang,
        reports={n: NodeRunReport(phase=NodePhase.EXITED) for n in (1, 2)},
    )
    ended = step_run(replace(task, run=stopped), nodes(3), T0 + 9, POLICY)
    assert ended.change is not None and ended.change.reason is EndReason.HANG_DETECTED
    # The first failure on node 2 (the threshold is 2), yet it goes to err_nodes: a hang names its node.
    [verdict] = ended.node_verdicts
    assert (verdict.node_id, verdict.num_failures) == (2, 1)
    assert verdict.err_reason == f"cordoned: task 1 run 1001: {message}"
    outcome = task_outcome(task, ended.change.reason)
    assert outcome.state is TaskState.SUSPENDED and outcome.num_restarts == 1


@pytest.mark.parametrize(("silent_s", "fires"), [(299.0, False), (301.0, True)])
def test_watchdog(silent_s: float, fires: bool) -> None:
    task = replace(running(1, (1,), p.LOW, started_at=T0), watchdog_time_s=300.0)
    change = step_run(task, nodes(1), T0 + silent_s, POLICY).change
    assert (change is not None) == fires
    if change is not None:
        assert change.reason is EndReason.WATCHDOG_TIMEOUT and "300 s" in change.message
        assert task_outcome(task, change.reason).state is TaskState.FAILED


def test_start_promotes_to_running_when_every_node_runs_and_times_out_otherwise() -> None:
    task = running(1, (1, 2), p.LOW, started_at=T0, state=RunState.STARTING, phase=NodePhase.STARTING)
    assert task.run is not None
    assert step_run(task, nodes(2), T0 + 1, POLICY).change is None
    up = replace(task.run, reports={n: NodeRunReport(phase=NodePhase.RUNNING) for n in (1, 2)})
    change = step_run(replace(task, run=up), nodes(2), T0 + 1, POLICY).change
    assert change is not None and change.state is RunState.RUNNING
    late = step_run(task, nodes(2), T0 + 101, POLICY).change
    assert late is not None and late.reason is EndReason.LAUNCH_FAILED


def test_user_stop_and_suspend_requests() -> None:
    task = running(1, (1,), p.LOW)
    assert task.run is not None
    stop = request_stop(task.run, EndReason.STOPPED_BY_USER)
    assert stop is not None and stop.state is RunState.STOPPING
    assert request_suspend(replace(task.run, state=RunState.STOPPING), EndReason.SUSPENDED_BY_USER, POLICY, 0) is None
    capped = request_suspend(task.run, EndReason.SUSPENDED_BY_USER, LifecyclePolicy(max_grace_s=100), 1000)
    assert capped is not None and capped.grace_s == 100
