"""The victim choice of preemption (core.victims), one table row per rule, and through the matcher."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from ff_scheduler.core import priority as p
from ff_scheduler.core.builders import nodes, queued, running, snapshot
from ff_scheduler.core.model import RunSnap, RunState, TaskSnap
from ff_scheduler.core.policy import LifecyclePolicy, SchedulingPolicy
from ff_scheduler.core.tick import plan_tick
from ff_scheduler.core.victims import Candidate, VictimChoice, choose, durable_at, loss_node_s

CHEAPEST, HAI = VictimChoice.CHEAPEST, VictimChoice.LEAST_IMPORTANT_LATEST
FEWEST, FRESHEST = VictimChoice.FEWEST, VictimChoice.FEWEST_FRESHEST


def c(
    task_id: int,
    num_nodes: int,
    loss_per_node_s: float,
    level: int = p.LOW,
    fcfs: int | None = None,
    ran_s: float = 3600.0,
) -> Candidate:
    """A candidate losing ``loss_per_node_s`` on each of its ``num_nodes`` nodes, its run ``ran_s`` old."""
    fcfs = task_id if fcfs is None else fcfs
    return Candidate(task_id, level, num_nodes, loss_per_node_s * num_nodes, fcfs, ran_s)


@dataclass
class Case:
    name: str
    candidates: list[Candidate]
    need: int
    chosen: set[int]
    rule: VictimChoice = CHEAPEST


CASES = [
    Case("nothing needed: no victim", [c(1, 2, 10)], 0, set()),
    Case("all together free too few: no victim", [c(1, 1, 10), c(2, 1, 10)], 3, set()),
    Case("the one that just checkpointed", [c(1, 2, 300), c(2, 2, 5), c(3, 2, 120)], 2, {2}),
    Case("the smallest loss wins over the submission order", [c(1, 1, 50, fcfs=9), c(2, 1, 40, fcfs=1)], 1, {2}),
    Case(
        "a small victim rather than a big one that frees more than needed",
        [c(1, 16, 10), c(2, 2, 60)],
        2,
        {2},
    ),
    Case("two cheap small ones rather than one dear big one", [c(1, 4, 200), c(2, 2, 20), c(3, 2, 30)], 4, {2, 3}),
    Case(
        "one big fresh one when the small ones are dear",
        [c(1, 4, 1), c(2, 2, 500), c(3, 2, 500)],
        4,
        {1},
    ),
    Case(
        "victims not needed once a later one completes the set are dropped",
        [c(1, 1, 1), c(2, 1, 2), c(3, 4, 3)],
        4,
        {3},
    ),
    Case(
        "cheapest whatever the level: a fresh NORMAL before a dear LOW",
        [c(1, 2, 600, level=p.LOW), c(2, 2, 10, level=p.NORMAL)],
        2,
        {2},
    ),
    Case("equal losses: the lower level", [c(1, 2, 60, level=p.NORMAL), c(2, 2, 60, level=p.LOW)], 2, {2}),
    Case(
        "fewest: one task that frees enough rather than two cheaper ones",
        [c(1, 4, 300, ran_s=1200), c(2, 2, 5), c(3, 2, 5)],
        4,
        {1},
        FEWEST,
    ),
    Case(
        "fewest: the biggest, completed by the one losing least per run time",
        [c(1, 3, 60), c(2, 2, 60, ran_s=600), c(3, 2, 60, ran_s=7200)],
        4,
        {1, 3},
        FEWEST,
    ),
    Case(
        "fewest: of equal losses, the run that has gone longest",
        [c(1, 2, 60, ran_s=1800), c(2, 2, 60, ran_s=7200), c(3, 2, 60, ran_s=3600)],
        2,
        {2},
        FEWEST,
    ),
    Case(
        "fewest: an old run's bigger loss is less per run time than a young run's small one",
        [c(1, 2, 30, ran_s=900), c(2, 2, 90, ran_s=4 * 3600)],  # 60/900 s vs 180/14,400 s
        2,
        {2},
        FEWEST,
    ),
    Case(
        "fewest: a just-checkpointed young run before an old run that never checkpointed",
        [c(1, 2, 60 + 10, ran_s=900), c(2, 2, 60 + 3 * 3600, ran_s=3 * 3600)],  # ~0.16 vs ~2.0
        2,
        {1},
        FEWEST,
    ),
    Case(
        "fewest: a run that barely started is divided by the floor, not by ~0",
        [c(1, 1, 1, ran_s=0.5), c(2, 1, 100, ran_s=600)],  # 1/60 vs 100/600
        1,
        {1},
        FEWEST,
    ),
    Case(
        "fewest: of single victims, the one freeing the fewest nodes beyond the need",
        [c(1, 16, 1, ran_s=20 * 3600), c(2, 8, 60, ran_s=3600), c(3, 4, 300, ran_s=900), c(4, 2, 1)],
        4,
        {3},
        FEWEST,
    ),
    Case(
        "fewest: a bigger task than needed when no smaller one frees enough alone",
        [c(1, 16, 60), c(2, 1, 1), c(3, 1, 1)],
        3,
        {1},
        FEWEST,
    ),
    Case(
        "fewest_freshest: of single victims, the freshest checkpoint rather than the longest run",
        [c(1, 2, 60 + 240, ran_s=10 * 3600), c(2, 2, 60 + 10, ran_s=900)],  # fewest: 300/36,000 < 70/900
        2,
        {2},
        FRESHEST,
    ),
    Case(
        "fewest_freshest: still one task that frees enough rather than two fresher ones",
        [c(1, 4, 300), c(2, 2, 5), c(3, 2, 5)],
        4,
        {1},
        FRESHEST,
    ),
    Case(
        "fewest_freshest: the fewest nodes beyond the need before the freshest checkpoint",
        [c(1, 8, 60), c(2, 4, 300)],
        4,
        {2},
        FRESHEST,
    ),
    Case(
        "fewest_freshest: the biggest, completed by the freshest",
        [c(1, 3, 60), c(2, 2, 60 + 200, ran_s=7200), c(3, 2, 60 + 5, ran_s=600)],
        4,
        {1, 3},
        FRESHEST,
    ),
    Case(
        "HAI's rule: lowest level, then the latest submitted, whatever the loss",
        [c(1, 2, 5, level=p.NORMAL), c(2, 2, 600, level=p.LOW, fcfs=1), c(3, 2, 900, level=p.LOW, fcfs=2)],
        2,
        {3},
        HAI,
    ),
    Case(
        "HAI's rule takes victims in its order until enough",
        [c(1, 1, 5, level=p.NORMAL), c(2, 1, 600, level=p.LOW), c(3, 1, 900, level=p.LOW)],
        3,
        {1, 2, 3},
        HAI,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_choice(case: Case) -> None:
    chosen = choose(case.candidates, case.need, case.rule)
    assert {v.task_id for v in chosen} == case.chosen
    if chosen:
        assert sum(v.num_nodes for v in chosen) >= case.need


def _run(started_at: float, taken_at: float = 0.0, committed_at: float = 0.0, num_nodes: int = 2) -> RunSnap:
    return RunSnap(
        run_id=1,
        task_id=1,
        state=RunState.RUNNING,
        priority=p.LOW,
        node_ids=tuple(range(1, num_nodes + 1)),
        created_at=started_at,
        started_at=started_at,
        checkpoint_taken_at=taken_at,
        checkpoint_committed_at=committed_at,
    )


@pytest.mark.parametrize(
    ("run", "durable", "loss"),
    [
        (_run(1000), 1000, 2 * (500 + 60)),  # no checkpoint this run: everything since its start
        (_run(1000, taken_at=1400, committed_at=1405), 1400, 2 * (100 + 60)),  # since the snapshot, not the commit
        (_run(1000, committed_at=1450), 1450, 2 * (50 + 60)),  # no snapshot time: since the commit
        (_run(1000, taken_at=900, committed_at=950), 1000, 2 * (500 + 60)),  # older than the run: the start
        (_run(1000, taken_at=1600, committed_at=1600), 1600, 2 * 60),  # a clock ahead: nothing at risk, not less
    ],
)
def test_loss_counts_from_the_last_durable_checkpoint(run: RunSnap, durable: float, loss: float) -> None:
    assert durable_at(run) == durable
    assert loss_node_s(run, 1500, restart_cost_s=60) == pytest.approx(loss)


NOW = 10_000.0
POLICY = SchedulingPolicy(enforce_quotas=False, min_run_time_s=600, victim_choice=CHEAPEST)


def _checkpointed(task: TaskSnap, at: float) -> TaskSnap:
    assert task.run is not None
    run = task.run
    run.checkpoint_taken_at = run.checkpoint_committed_at = at
    return task


def _preempted(tasks: list[TaskSnap], num_nodes: int, policy: SchedulingPolicy = POLICY) -> set[int]:
    plan = plan_tick(snapshot(NOW, nodes(num_nodes), tasks), policy, LifecyclePolicy())
    assert plan.match is not None
    return {pre.task_id for pre in plan.match.preemptions}


def test_the_matcher_preempts_the_task_that_just_checkpointed() -> None:
    tasks = [
        _checkpointed(running(1, (1, 2), p.LOW, user="a", started_at=NOW - 3600), NOW - 280),
        _checkpointed(running(2, (3, 4), p.LOW, user="b", started_at=NOW - 3600), NOW - 10),
        _checkpointed(running(3, (5, 6), p.LOW, user="c", started_at=NOW - 3600), NOW - 150),
        queued(4, 2, p.HIGH, user="d"),
    ]
    assert _preempted(tasks, 6) == {2}
    assert _preempted(tasks, 6, SchedulingPolicy(enforce_quotas=False, min_run_time_s=600)) == {3}  # HAI's default


def test_minimum_run_time_protects_even_the_cheapest() -> None:
    tasks = [
        running(1, (1, 2), p.LOW, user="a", started_at=NOW - 100),  # fresh: nothing lost yet, but protected
        _checkpointed(running(2, (3, 4), p.LOW, user="b", started_at=NOW - 3600), NOW - 250),
        queued(3, 2, p.HIGH, user="c"),
    ]
    assert _preempted(tasks, 4) == {2}


def test_same_level_and_from_level_switches() -> None:
    tasks = [running(1, (1, 2), p.NORMAL, user="a", started_at=NOW - 3600), queued(2, 2, p.NORMAL, user="b", fcfs=0)]
    assert _preempted(tasks, 2) == {1}  # HAI: another user's task of the same level, later in the queue
    assert _preempted(tasks, 2, SchedulingPolicy(enforce_quotas=False, preempt_same_level=False)) == set()
    lower = [running(1, (1, 2), p.LOW, user="a", started_at=NOW - 3600), queued(2, 2, p.NORMAL, user="b")]
    assert _preempted(lower, 2) == {1}
    assert _preempted(lower, 2, SchedulingPolicy(enforce_quotas=False, preempt_from_level=p.HIGH)) == set()


def test_zones_refusing_the_cheapest_set_fall_back_and_spare_victims_not_used() -> None:
    """Another task already spans zones, so the HIGH task must fit in one: the two cheapest victims sit in
    different zones; the matcher adds the next cheapest (two nodes in zone z0) and takes nodes 1 and 3 there,
    so it preempts tasks 1 and 3, and task 2 (in z1, none of its nodes taken) keeps running."""
    all_nodes = nodes(8, zones=2)  # z0: 1 3 5 7, z1: 2 4 6 8
    old = NOW - 3600
    tasks = [
        running(9, (7, 8), p.HIGH, user="x", started_at=old),  # spans z0 and z1
        _checkpointed(running(1, (1,), p.LOW, user="a", started_at=old), NOW - 5),
        _checkpointed(running(2, (2,), p.LOW, user="b", started_at=old), NOW - 5),
        _checkpointed(running(3, (3, 5), p.LOW, user="c", started_at=old), NOW - 200),
        _checkpointed(running(4, (4, 6), p.LOW, user="d", started_at=old), NOW - 250),
        queued(5, 2, p.HIGH, user="e"),
    ]
    plan = plan_tick(snapshot(NOW, all_nodes, tasks), POLICY, LifecyclePolicy())
    assert plan.match is not None
    assert {pre.task_id for pre in plan.match.preemptions} == {1, 3}
    assert plan.starts == []  # the nodes are reserved until the victims have suspended


FEWEST_POLICY = SchedulingPolicy(enforce_quotas=False, min_run_time_s=600, victim_choice=FEWEST)


def test_the_matcher_weighs_loss_per_run_time_through_the_service_code() -> None:
    """Task 1 checkpointed 100 s ago but its run is 20 min old; task 2 checkpointed 200 s ago in a run of
    5 h: per second of run, task 2 loses ~8x less, so it is the one suspended (``cheapest`` takes task 1)."""
    tasks = [
        _checkpointed(running(1, (1, 2), p.LOW, user="a", started_at=NOW - 1200), NOW - 100),
        _checkpointed(running(2, (3, 4), p.LOW, user="b", started_at=NOW - 5 * 3600), NOW - 200),
        queued(3, 2, p.HIGH, user="c"),
    ]
    assert _preempted(tasks, 4) == {1}
    assert _preempted(tasks, 4, FEWEST_POLICY) == {2}


def test_the_matcher_suspends_the_fewest_tasks_through_the_service_code() -> None:
    """A 4-node HIGH task on a full group: two 2-node tasks that just checkpointed, or one 4-node task that
    checkpointed 4 min ago: ``cheapest`` suspends the two, ``fewest`` the one."""
    old = NOW - 3600
    tasks = [
        _checkpointed(running(1, (1, 2), p.LOW, user="a", started_at=old), NOW - 5),
        _checkpointed(running(2, (3, 4), p.LOW, user="b", started_at=old), NOW - 5),
        _checkpointed(running(3, (5, 6, 7, 8), p.LOW, user="c", started_at=old), NOW - 240),
        queued(4, 4, p.HIGH, user="d"),
    ]
    assert _preempted(tasks, 8) == {1, 2}
    assert _preempted(tasks, 8, FEWEST_POLICY) == {3}


def test_the_matcher_suspends_the_freshest_of_as_few_through_the_service_code() -> None:
    """Task 1 checkpointed 10 s ago in a run of 20 min, task 2 checkpointed 250 s ago in a run of 5 h: per
    second of run task 2 loses less (``fewest`` suspends it, and it must save while the HIGH task waits);
    per node task 1 loses less and can go at once (``fewest_freshest`` suspends it)."""
    tasks = [
        _checkpointed(running(1, (1, 2), p.LOW, user="a", started_at=NOW - 1200), NOW - 10),
        _checkpointed(running(2, (3, 4), p.LOW, user="b", started_at=NOW - 5 * 3600), NOW - 250),
        queued(3, 2, p.HIGH, user="c"),
    ]
    assert _preempted(tasks, 4, FEWEST_POLICY) == {2}
    freshest = SchedulingPolicy(enforce_quotas=False, min_run_time_s=600, victim_choice=FRESHEST)
    assert _preempted(tasks, 4, freshest) == {1}
