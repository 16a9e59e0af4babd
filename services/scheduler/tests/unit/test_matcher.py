"""The HAI rules of the matcher, one table row per rule (pure: plan_tick on snapshots)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from ff_scheduler.core import priority as p
from ff_scheduler.core.builders import GROUP, nodes, queued, running, snapshot, with_state
from ff_scheduler.core.model import NodeState, QueueReason, TaskSnap, TaskState
from ff_scheduler.core.policy import LifecyclePolicy, SchedulingPolicy
from ff_scheduler.core.tick import plan_tick

NOW = 10_000.0
OLD = NOW - 3600  # started an hour ago: past the minimum run time
RECENT = NOW - 10  # started 10 s ago: protected by the minimum run time
POLICY = SchedulingPolicy(enforce_quotas=False, min_run_time_s=60, demote_after_s=1800)


@dataclass
class Case:
    name: str
    tasks: list[TaskSnap]
    num_nodes: int = 4
    zones: int = 1
    policy: SchedulingPolicy = POLICY
    starts: dict[int, int] = field(default_factory=dict)  # task id -> number of nodes
    preempted: set[int] = field(default_factory=set)
    waiting: set[int] = field(default_factory=set)


CASES = [
    Case("whole nodes: a task gets exactly its node count", [queued(1, 3, p.NORMAL)], starts={1: 3}),
    Case("too big for the group: waits, nothing preempted", [queued(1, 5, p.HIGH)], waiting={1}),
    Case(
        "priorities: the higher one goes first", [queued(1, 3, p.LOW), queued(2, 3, p.HIGH)], starts={2: 3}, waiting={1}
    ),
    Case("FCFS within a level", [queued(2, 3, p.NORMAL), queued(1, 3, p.NORMAL)], starts={1: 3}, waiting={2}),
    Case(
        "a smaller later task fits around a big waiting one (HAI skips what does not fit)",
        [running(9, (1, 2), p.NORMAL, user="bob", started_at=RECENT), queued(1, 3, p.NORMAL), queued(2, 2, p.NORMAL)],
        starts={2: 2},
        waiting={1},
    ),
    Case(
        "FIFO policy: head-of-line blocking, priority ignored",
        [running(9, (1, 2), p.NORMAL, user="bob", started_at=OLD, fcfs=0), queued(1, 3, p.LOW), queued(2, 2, p.HIGH)],
        policy=SchedulingPolicy(preemption=False, by_priority=False, head_of_line_blocking=True, enforce_quotas=False),
        waiting={1, 2},
    ),
    Case(
        "preemption: a higher task suspends a lower running one",
        [running(1, (1, 2, 3, 4), p.LOW, started_at=OLD), queued(2, 2, p.HIGH, user="bob")],
        preempted={1},
        waiting={2},
    ),
    Case(
        "preemption takes the least important victim first",
        [
            running(1, (1, 2), p.LOW, started_at=OLD),
            running(3, (3, 4), p.NORMAL, user="carol", started_at=OLD),
            queued(5, 2, p.HIGH, user="bob"),
        ],
        preempted={1},
        waiting={5},
    ),
    Case(
        "same user, same priority: never suspended for that user's task",
        [running(5, (1, 2, 3, 4), p.NORMAL, started_at=OLD), queued(1, 2, p.NORMAL, fcfs=1)],
        waiting={1},
    ),
    Case(
        "same priority, another user, older in the queue: time-sharing suspends the running one",
        [running(5, (1, 2, 3, 4), p.NORMAL, started_at=OLD), queued(1, 2, p.NORMAL, user="bob", fcfs=1)],
        preempted={5},
        waiting={1},
    ),
    Case(
        "lower priority never preempts higher",
        [running(1, (1, 2, 3, 4), p.HIGH, started_at=OLD), queued(2, 2, p.LOW, user="bob")],
        waiting={2},
    ),
    Case(
        "minimum run time protects a fresh run",
        [running(1, (1, 2, 3, 4), p.LOW, started_at=RECENT), queued(2, 2, p.HIGH, user="bob")],
        waiting={2},
    ),
    Case(
        "preemption off: nothing is suspended",
        [running(1, (1, 2, 3, 4), p.LOW, started_at=OLD), queued(2, 2, p.HIGH, user="bob")],
        policy=SchedulingPolicy(preemption=False, enforce_quotas=False),
        waiting={2},
    ),
    Case("zones: a task that fits in one zone stays in it", [queued(1, 2, p.NORMAL)], zones=2, starts={1: 2}),
    Case("zones: one task may span zones", [queued(1, 4, p.NORMAL)], zones=2, starts={1: 4}),
    Case(
        "zones: at most one task spans zones",
        [running(1, (1, 2), p.NORMAL, user="bob", started_at=RECENT), queued(2, 3, p.NORMAL)],
        num_nodes=6,
        zones=2,
        waiting={2},
    ),
    Case(
        "zones: a second cross-zone task waits even when nodes are free",
        [running(1, (1, 2), p.NORMAL, user="bob", started_at=RECENT), queued(2, 4, p.NORMAL)],
        num_nodes=8,
        zones=4,
        waiting={2},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_rules(case: Case) -> None:
    plan = plan_tick(snapshot(NOW, nodes(case.num_nodes, zones=case.zones), case.tasks), case.policy, LifecyclePolicy())
    assert plan.match is not None
    assert {s.task_id: len(s.node_ids) for s in plan.starts} == case.starts
    assert {pre.task_id for pre in plan.match.preemptions} == case.preempted
    assert set(plan.match.waiting) == case.waiting
    _assert_no_node_twice(case.tasks, plan.starts)


def _assert_no_node_twice(tasks: list[TaskSnap], starts: list) -> None:  # type: ignore[type-arg]
    held = [n for t in tasks if t.run is not None for n in t.run.node_ids]
    taken = held + [n for s in starts for n in s.node_ids]
    assert len(taken) == len(set(taken))


def test_cross_zone_start_only_when_no_other_spans_zones() -> None:
    all_nodes = nodes(6, zones=2)
    plan = plan_tick(
        snapshot(NOW, all_nodes, [queued(1, 4, p.NORMAL), queued(2, 2, p.NORMAL)]), POLICY, LifecyclePolicy()
    )
    zones_of = {s.task_id: {all_nodes[n].zone for n in s.node_ids} for s in plan.starts}
    assert len(zones_of[1]) == 2 and len(zones_of[2]) == 1


def test_preempted_nodes_are_reserved_for_the_preemptor_until_freed() -> None:
    """While the victim is suspending, its nodes (and free ones the preemptor needs) are not given away."""
    first = plan_tick(
        snapshot(
            NOW,
            nodes(4),
            [
                running(1, (1, 2, 3), p.LOW, started_at=OLD),
                queued(2, 4, p.HIGH, user="bob"),
                queued(3, 1, p.LOW, user="carol"),
            ],
        ),
        POLICY,
        LifecyclePolicy(),
    )
    assert [pre.task_id for pre in first.match.preemptions] == [1]  # type: ignore[union-attr]
    assert first.starts == []
    draining = running(1, (1, 2, 3), p.LOW, started_at=OLD)
    assert draining.run is not None
    draining.run.state = draining.run.state.SUSPENDING
    draining.run.suspend_requested_at = NOW
    draining.run.ack_window_s = 5
    second = plan_tick(
        snapshot(NOW + 1, nodes(4), [draining, queued(2, 4, p.HIGH, user="bob"), queued(3, 1, p.LOW, user="carol")]),
        POLICY,
        LifecyclePolicy(),
    )
    assert second.starts == []
    assert second.match is not None and second.match.preemptions == []


def test_err_and_offline_nodes_get_nothing() -> None:
    all_nodes = with_state(with_state(nodes(4), 1, NodeState.ERR), 2, NodeState.OFFLINE)
    plan = plan_tick(
        snapshot(NOW, all_nodes, [queued(1, 2, p.NORMAL), queued(2, 1, p.NORMAL)]), POLICY, LifecyclePolicy()
    )
    assert [s.node_ids for s in plan.starts] == [(3, 4)]


def test_other_group_nodes_are_not_used() -> None:
    all_nodes = {**nodes(2), **nodes(2, group="gpu-b", start=10)}
    plan = plan_tick(
        snapshot(NOW, all_nodes, [queued(1, 2, p.NORMAL, group="gpu-b"), queued(2, 3, p.NORMAL)]),
        POLICY,
        LifecyclePolicy(),
    )
    assert [(s.task_id, s.node_ids) for s in plan.starts] == [(1, (10, 11))]


def test_quota_reasons_reach_the_plan() -> None:
    policy = SchedulingPolicy(min_run_time_s=60)
    quotas = {("alice", p.NORMAL, GROUP): 2}
    plan = plan_tick(
        snapshot(NOW, nodes(4), [queued(1, 2, p.NORMAL), queued(2, 1, p.NORMAL), queued(3, 4, p.NORMAL)], quotas),
        policy,
        LifecyclePolicy(),
    )
    reasons = {c.task_id: c.queue_reason for c in plan.task_changes if c.queue_reason is not None}
    assert [s.task_id for s in plan.starts] == [1]
    assert reasons[2] is QueueReason.OUT_OF_QUOTA
    assert reasons[3] is QueueReason.QUOTA_EXCEEDED


def test_auto_priority_starts_at_the_level_it_got() -> None:
    quotas = {("alice", p.HIGH, GROUP): 1, ("alice", p.LOW, GROUP): 4}
    plan = plan_tick(
        snapshot(NOW, nodes(4), [queued(1, 1, None), queued(2, 2, None)], quotas), SchedulingPolicy(), LifecyclePolicy()
    )
    assert sorted((s.task_id, s.priority) for s in plan.starts) == [(1, p.HIGH), (2, p.LOW)]


def test_fair_share_puts_the_lighter_user_first() -> None:
    tasks = [
        running(1, (1, 2), p.NORMAL, user="alice", started_at=RECENT),
        queued(2, 2, p.NORMAL, user="alice"),
        queued(3, 2, p.NORMAL, user="bob"),
    ]
    fifo = plan_tick(snapshot(NOW, nodes(4), tasks), POLICY, LifecyclePolicy())
    fair = plan_tick(
        snapshot(NOW, nodes(4), tasks), SchedulingPolicy(enforce_quotas=False, fair_share=True), LifecyclePolicy()
    )
    assert [s.task_id for s in fifo.starts] == [2]
    assert [s.task_id for s in fair.starts] == [3]


def test_above_normal_is_demoted_after_30_minutes() -> None:
    young = running(1, (1,), p.ABOVE_NORMAL, started_at=NOW - 1799)
    old = running(2, (2,), p.ABOVE_NORMAL, started_at=NOW - 1800)
    high = running(3, (3,), p.HIGH, started_at=NOW - 7200)
    plan = plan_tick(snapshot(NOW, nodes(4), [young, old, high]), POLICY, LifecyclePolicy())
    assert {c.task_id: c.priority for c in plan.task_changes} == {2: p.NORMAL}
    assert [(c.run_id, c.priority) for c in plan.run_changes] == [(1002, p.NORMAL)]


def test_demoted_task_can_then_be_preempted_by_above_normal() -> None:
    old = running(1, (1, 2, 3, 4), p.ABOVE_NORMAL, started_at=NOW - 1800, user="bob")
    plan = plan_tick(snapshot(NOW, nodes(4), [old, queued(2, 2, p.ABOVE_NORMAL)]), POLICY, LifecyclePolicy())
    assert [pre.task_id for pre in plan.match.preemptions] == [1]  # type: ignore[union-attr]


def _suspended(task: TaskSnap) -> TaskSnap:
    """A task waiting to resume (its run was suspended and it queued again)."""
    return replace(task, state=TaskState.SUSPENDED)


RESUME_FIRST = SchedulingPolicy(enforce_quotas=False, min_run_time_s=60, preempt_from_level=p.HIGH, resume_first=True)
RESUME_CASES = [
    Case(
        "resume first: a suspended LOW task goes ahead of a NORMAL one submitted later",
        [_suspended(queued(1, 2, p.LOW)), queued(2, 2, p.NORMAL)],
        num_nodes=2,
        policy=RESUME_FIRST,
        starts={1: 2},
        waiting={2},
    ),
    Case(
        "off: the NORMAL one goes first (HAI)",
        [_suspended(queued(1, 2, p.LOW)), queued(2, 2, p.NORMAL)],
        num_nodes=2,
        starts={2: 2},
        waiting={1},
    ),
    Case(
        "resume first stays behind the levels that preempt",
        [_suspended(queued(1, 2, p.LOW)), queued(2, 2, p.HIGH)],
        num_nodes=2,
        policy=RESUME_FIRST,
        starts={2: 2},
        waiting={1},
    ),
    Case(
        "resume first within its level: ahead of a task of its level submitted before it",
        [queued(1, 2, p.HIGH), _suspended(queued(2, 2, p.HIGH))],
        num_nodes=2,
        policy=RESUME_FIRST,
        starts={2: 2},
        waiting={1},
    ),
    Case(
        "resume first: suspended tasks below the preempting levels go by submission, not by level",
        [_suspended(queued(2, 2, p.LOW)), _suspended(queued(1, 2, p.NORMAL, fcfs=3))],
        num_nodes=2,
        policy=RESUME_FIRST,
        starts={2: 2},
        waiting={1},
    ),
    Case(
        "a resumed LOW task ahead of the queue does not preempt",
        [running(1, (1, 2), p.NORMAL, user="b", started_at=OLD), _suspended(queued(2, 2, p.LOW))],
        num_nodes=2,
        policy=RESUME_FIRST,
        waiting={2},
    ),
    Case(
        "FIFO ignores it",
        [queued(1, 2, p.NORMAL), _suspended(queued(2, 2, p.LOW))],
        num_nodes=2,
        policy=SchedulingPolicy(enforce_quotas=False, by_priority=False, resume_first=True),
        starts={1: 2},
        waiting={2},
    ),
]


@pytest.mark.parametrize("case", RESUME_CASES, ids=[c.name for c in RESUME_CASES])
def test_resume_first(case: Case) -> None:
    test_rules(case)
