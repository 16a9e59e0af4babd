"""The matcher: concrete nodes for the tasks the assigner let through (HAI FIFOMatcher, corrected).

Per node group, candidates (running tasks and queued tasks in quota) are visited in order: priority
high to low, then FCFS (or fair share, then FCFS); with ``resume_first``, suspended tasks waiting to resume
go ahead of the levels that cannot preempt (``order_key``). A running task keeps its nodes. A queued task takes
free nodes; if there are too few, it waits for nodes that are already being freed (runs suspending or
stopping) and reserves them, so that no later task takes them; if even those are too few, it preempts
running tasks that come after it in the order (``core.victims`` picks which) and reserves their nodes.

A running task may be preempted only when it has run at least ``min_run_time_s``, when it is not
already being suspended, and when it is not a task of the same user at the same priority (HAI's rule).
Whole nodes only, no node twice, and at most one task (running or starting) spans more than one zone.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from ff_scheduler.core import victims
from ff_scheduler.core.assigner import Verdict
from ff_scheduler.core.model import NodeState, NodeView, QueueReason, TaskSnap, TaskState
from ff_scheduler.core.policy import SchedulingPolicy


@dataclass(frozen=True, slots=True)
class Start:
    """Start a queued task on these nodes at this priority."""

    task_id: int
    node_ids: tuple[int, ...]
    priority: int


@dataclass(frozen=True, slots=True)
class Preempt:
    """Suspend a running task's run so that a queued task can have its nodes."""

    task_id: int
    run_id: int
    # The queued task the nodes are taken for.
    for_task_id: int


@dataclass
class MatchResult:
    """What one matching pass decided: starts, preemptions, and why the other queued tasks wait."""

    starts: list[Start] = field(default_factory=list)
    preemptions: list[Preempt] = field(default_factory=list)
    # Queued tasks that stay queued, and why.
    waiting: dict[int, QueueReason] = field(default_factory=dict)


def order_key(task: TaskSnap, level: int, usage: int, policy: SchedulingPolicy) -> tuple[int, int, int, int]:
    """Visit order: priority high to low (unless FIFO), then held nodes (fair share), then FCFS.

    With ``resume_first``, a suspended task waiting to resume goes first at its level, and one below
    ``preempt_from_level`` goes right after the tasks of that level, ahead of every level that cannot preempt
    (such tasks among themselves by fair share, then FCFS, whatever their levels: the simulator measured
    that a little better than by level).
    """
    share = usage if policy.fair_share else 0
    if not policy.by_priority:
        return (0, _NEW, share, task.fcfs)
    tier = _NEW
    if policy.resume_first and task.run is None and task.state is TaskState.SUSPENDED:
        tier = _RESUMED
        if level < policy.preempt_from_level:
            level, tier = policy.preempt_from_level, _RESUMED_BELOW
    return (-level, tier, share, task.fcfs)


# Tiers of ``order_key`` within a level: suspended tasks of the level, then its running and never-run tasks,
# then suspended tasks of the levels below (``resume_first``).
_RESUMED, _NEW, _RESUMED_BELOW = 0, 1, 2


def select_nodes(available: Iterable[int], need: int, nodes: dict[int, NodeView], *, cross_zone_ok: bool) -> list[int]:
    """``need`` nodes out of ``available``, in one zone if possible, else across zones when allowed.

    In one zone, the tightest zone that fits; [] when impossible.
    """
    by_zone: dict[str, set[int]] = defaultdict(set)
    for node_id in available:
        by_zone[nodes[node_id].zone].add(node_id)
    return _select_by_zone(by_zone, need, cross_zone_ok=cross_zone_ok)


def _select_by_zone(by_zone: dict[str, set[int]], need: int, *, cross_zone_ok: bool) -> list[int]:
    """``select_nodes`` over nodes already grouped by zone (empty zones are skipped)."""
    if sum(len(ids) for ids in by_zone.values()) < need:
        return []
    fitting = [(len(ids), zone) for zone, ids in by_zone.items() if len(ids) >= need]
    if fitting:
        _, zone = min(fitting)
        # The smallest ids, in order: sorted(...)[:need] without sorting a whole zone per start (1,500 at a first tick).
        return heapq.nsmallest(need, by_zone[zone])
    if not cross_zone_ok:
        return []
    chosen: list[int] = []
    for zone in sorted((z for z in by_zone if by_zone[z]), key=lambda z: (-len(by_zone[z]), z)):
        chosen += heapq.nsmallest(need - len(chosen), by_zone[zone])
        if len(chosen) == need:
            break
    return chosen


def _spans_zones(node_ids: Iterable[int], nodes: dict[int, NodeView]) -> bool:
    return len({nodes[n].zone for n in node_ids if n in nodes}) > 1


class _GroupMatch:
    """The matching of one node group (state of the visit)."""

    def __init__(
        self,
        nodes: dict[int, NodeView],
        policy: SchedulingPolicy,
        now: float,
        result: MatchResult,
        cross_zone_in_use: bool,
    ) -> None:
        self.nodes = nodes
        self.policy = policy
        self.now = now
        self.result = result
        self.cross_zone_in_use = cross_zone_in_use
        # Free nodes neither started on nor reserved in this tick, by zone, and how many.
        self.free_by_zone: dict[str, set[int]] = defaultdict(set)
        self.num_free = 0
        self.draining: set[int] = set()
        self.reserved: set[int] = set()
        # (level, user) -> the fewest nodes a task of that user at that level could not have (neither free, nor
        # being freed, nor by preemption) since the last preemption; a task asking as many or more waits too, as
        # nodes only get taken until a preemption frees some (this spares the walk of a long queue on a full group).
        self.failed: dict[tuple[int, str], int] = {}
        # Running tasks not yet visited that may be preempted, each as a victim candidate (its ready nodes and
        # loss do not change within a tick: computed once), and their nodes per level and user.
        self.victims: dict[int, TaskSnap] = {}
        self.candidates: dict[int, victims.Candidate] = {}
        self._all_ready: bool | None = None
        self.nodes_at: dict[int, int] = defaultdict(int)
        self.nodes_at_user: dict[tuple[int, str], int] = defaultdict(int)
        self.blocked = False

    def add_free(self, node_id: int) -> None:
        self.free_by_zone[self.nodes[node_id].zone].add(node_id)
        self.num_free += 1

    def _take(self, node_ids: Iterable[int]) -> None:
        """No longer free for this tick (started on or reserved)."""
        for node_id in node_ids:
            zone_free = self.free_by_zone[self.nodes[node_id].zone]
            if node_id in zone_free:
                zone_free.discard(node_id)
                self.num_free -= 1

    def preemptible(self, task: TaskSnap) -> bool:
        run = task.run
        assert run is not None
        ran_s = self.now - (run.started_at or run.created_at)
        return self.policy.preemption and not run.state.draining and ran_s >= self.policy.min_run_time_s

    def add_victim(self, task: TaskSnap) -> None:
        run = task.run
        assert run is not None
        self.victims[task.task_id] = task
        if self._all_ready is None:  # once per tick: then a victim's ready nodes are all of them
            self._all_ready = all(n.state is NodeState.READY for n in self.nodes.values())
        ready = len(run.node_ids)
        if not self._all_ready:
            ready = len([n for n in run.node_ids if self.nodes[n].state is NodeState.READY])
        loss = 0.0  # only the rules that weigh it
        if self.policy.victim_choice.weighs_loss:
            loss = victims.loss_node_s(run, self.now, self.policy.victim_restart_cost_s)
        ran_s = self.now - (run.started_at or run.created_at)
        self.candidates[task.task_id] = victims.Candidate(task.task_id, run.priority, ready, loss, task.fcfs, ran_s)
        self.nodes_at[run.priority] += task.num_nodes
        self.nodes_at_user[(run.priority, task.user)] += task.num_nodes

    def drop_victim(self, task: TaskSnap) -> None:
        if self.victims.pop(task.task_id, None) is not None:
            del self.candidates[task.task_id]
            assert task.run is not None
            self.nodes_at[task.run.priority] -= task.num_nodes
            self.nodes_at_user[(task.run.priority, task.user)] -= task.num_nodes

    def may_preempt(self, victim: TaskSnap, level: int, user: str) -> bool:
        assert victim.run is not None
        vlevel = victim.run.priority
        if not self.policy.by_priority:
            return victim.user != user
        same_level = self.policy.preempt_same_level and vlevel == level and victim.user != user
        return vlevel < level or same_level

    def preemptible_bound(self, level: int, user: str) -> int:
        if not self.policy.by_priority:
            return sum(self.nodes_at.values()) - sum(n for (_, u), n in self.nodes_at_user.items() if u == user)
        below = sum(n for lvl, n in self.nodes_at.items() if lvl < level)
        if not self.policy.preempt_same_level:
            return below
        return below + self.nodes_at[level] - self.nodes_at_user[(level, user)]

    def place(self, task: TaskSnap, level: int) -> None:
        need = task.num_nodes
        if self.blocked:
            self.result.waiting[task.task_id] = QueueReason.WAITING_FOR_NODES
            return
        chosen = (
            _select_by_zone(self.free_by_zone, need, cross_zone_ok=not self.cross_zone_in_use)
            if self.num_free >= need
            else []
        )
        if chosen:
            self._take(chosen)
            self.cross_zone_in_use |= _spans_zones(chosen, self.nodes)
            self.result.starts.append(Start(task.task_id, tuple(chosen), level))
            return
        self.result.waiting[task.task_id] = QueueReason.WAITING_FOR_NODES
        failed = self.failed.get((level, task.user))
        if failed is None or need < failed:
            if self._wait_or_preempt(task, level):
                return
            self.failed[(level, task.user)] = need
        if self.policy.head_of_line_blocking:
            self.blocked = True

    def _wait_or_preempt(self, task: TaskSnap, level: int) -> bool:
        """Reserve nodes being freed, else preempt for the task; False when neither can give it its nodes."""
        need = task.num_nodes
        soon: set[int] = set().union(*self.free_by_zone.values())
        soon.update(self.draining - self.reserved)
        if len(soon) >= need and self._reserve(soon, need):
            return True
        if not self.policy.preemption or level < self.policy.preempt_from_level:
            return False
        bound = len(soon) + self.preemptible_bound(level, task.user)
        return bound >= need and self._preempt_for(task, level, soon)

    def _reserve(self, pool: set[int], need: int) -> bool:
        chosen = select_nodes(pool, need, self.nodes, cross_zone_ok=not self.cross_zone_in_use)
        self.reserved.update(chosen)
        self._take(chosen)
        return bool(chosen)

    def _preempt_for(self, task: TaskSnap, level: int, soon: set[int]) -> bool:
        """Preempt victims (``core.victims``) whose nodes, with ``soon``, give ``task`` its nodes; False if none do."""
        rule = self.policy.victim_choice
        candidates = self._candidates(level, task.user)
        if rule.weighs_loss:
            chosen = [self.victims[c.task_id] for c in victims.choose(candidates, task.num_nodes - len(soon), rule)]
            if chosen and self._take_victims(chosen, task, soon | self._ready_nodes(chosen)):
                return True
        # HAI's walk (and the cheapest choice's when zones refuse its set): victims one by one in the rule's
        # order until their nodes fit.
        pool = set(soon)
        taken: list[TaskSnap] = []
        for c in victims.order(candidates, rule):
            taken.append(self.victims[c.task_id])
            pool |= self._ready_nodes(taken[-1:])
            if len(pool) >= task.num_nodes and self._take_victims(taken, task, pool):
                return True
        return False

    def _candidates(self, level: int, user: str) -> list[victims.Candidate]:
        """The running tasks ``user``'s task at ``level`` may preempt that free a node it could have."""
        return [
            c
            for task_id, c in self.candidates.items()
            if c.num_nodes and self.may_preempt(self.victims[task_id], level, user)
        ]

    def _ready_nodes(self, tasks: list[TaskSnap]) -> set[int]:
        return {n for t in tasks if t.run is not None for n in t.run.node_ids if self.nodes[n].state is NodeState.READY}

    def _take_victims(self, taken: list[TaskSnap], task: TaskSnap, pool: set[int]) -> bool:
        """Preempt those of ``taken`` that give ``task`` nodes, if its nodes can be reserved out of ``pool``.

        ``pool`` holds the victims' nodes and free ones; a victim none of whose nodes the placement takes (zones
        may leave some out) keeps running.
        """
        if len(pool) < task.num_nodes:
            return False
        chosen = select_nodes(pool, task.num_nodes, self.nodes, cross_zone_ok=not self.cross_zone_in_use)
        if not chosen:
            return False
        self.reserved.update(chosen)
        self._take(chosen)
        for v in taken:
            assert v.run is not None
            if set(v.run.node_ids).isdisjoint(chosen):
                continue
            self.drop_victim(v)
            self.draining.update(v.run.node_ids)
            self.result.preemptions.append(Preempt(v.task_id, v.run.run_id, task.task_id))
        self.failed.clear()  # nodes of the victims not reserved now are being freed for others
        return True


def match(
    tasks: list[TaskSnap],
    verdicts: dict[int, Verdict],
    nodes: dict[int, NodeView],
    policy: SchedulingPolicy,
    now: float,
) -> MatchResult:
    """Starts, preemptions and waits for this tick (see the module docstring)."""
    result = MatchResult()
    groups = _groups(tasks, nodes, policy, now, result)
    candidates = _candidates(tasks, verdicts, policy, result)
    cross_zone_in_use = any(g.cross_zone_in_use for g in groups.values())
    for group_name, entries in candidates.items():
        group = groups.get(group_name)
        if group is None:  # no node in that group (yet)
            result.waiting.update((t.task_id, QueueReason.WAITING_FOR_NODES) for _, t, _ in entries if t.run is None)
            continue
        group.cross_zone_in_use = cross_zone_in_use
        entries.sort(key=lambda e: e[0])
        for _, task, _ in entries:
            if task.run is not None and group.preemptible(task):
                group.add_victim(task)
        for _, task, level in entries:
            if task.run is not None:
                group.drop_victim(task)
            else:
                group.place(task, level)
        cross_zone_in_use = group.cross_zone_in_use
    return result


def _groups(
    tasks: list[TaskSnap], nodes: dict[int, NodeView], policy: SchedulingPolicy, now: float, result: MatchResult
) -> dict[str, _GroupMatch]:
    """Per node group: free nodes, and nodes being freed (by runs suspending or stopping)."""
    held: set[int] = set()
    cross_zone_in_use = False
    for task in tasks:
        if task.run is not None:
            held.update(task.run.node_ids)
            cross_zone_in_use |= _spans_zones(task.run.node_ids, nodes)
    groups: dict[str, _GroupMatch] = {}
    for node in nodes.values():
        group = groups.get(node.group)
        if group is None:
            group = groups[node.group] = _GroupMatch(nodes, policy, now, result, cross_zone_in_use)
        if node.state is NodeState.READY and node.node_id not in held:
            group.add_free(node.node_id)
    for task in tasks:
        run = task.run
        if run is not None and run.state.draining and task.group in groups:
            ready = (n for n in run.node_ids if n in nodes and nodes[n].state is NodeState.READY)
            groups[task.group].draining.update(ready)
    return groups


Candidate = tuple[tuple[int, int, int, int], TaskSnap, int]


def _candidates(
    tasks: list[TaskSnap], verdicts: dict[int, Verdict], policy: SchedulingPolicy, result: MatchResult
) -> dict[str, list[Candidate]]:
    """Running tasks (not being suspended or stopped) and queued tasks in quota, per group."""
    usage: dict[tuple[str, str], int] = defaultdict(int)
    for task in tasks:
        if task.run is not None:
            usage[(task.group, task.user)] += task.num_nodes
    candidates: dict[str, list[Candidate]] = defaultdict(list)
    for task in tasks:
        verdict = verdicts[task.task_id]
        if not verdict.in_quota:
            result.waiting[task.task_id] = verdict.reason
            continue
        if task.run is not None and task.run.state.draining:
            continue
        level = verdict.priority if verdict.priority is not None else 0
        key = order_key(task, level, usage[(task.group, task.user)], policy)
        candidates[task.group].append((key, task, level))
    return candidates
