"""Which running tasks to preempt for a queued one: a set that frees enough nodes for the least cost.

What preempting a run loses is node-time: on each of its nodes, the work done since its last durable
checkpoint (a suspended task that cannot save within its grace loses it; one that saves holds its nodes
about as long: either way at most that) plus the time its next run spends reloading. A run with no
checkpoint of its own counts from its start: a resumed run has nothing newer than the checkpoint it
reloaded, and one that never checkpoints loses everything. So a task that just checkpointed is cheap and a
long one that never did is dear.

Three rules weigh that loss. ``CHEAPEST`` weighs it by the victim's node count: a preempted task queues again
and must find all its nodes free at once, which takes a big task far longer (in the simulator one 16-node
LOW task, preempted for a 2-node one, ended the trace ~6 h late). Among the tasks the matcher may preempt
(any lower level; the same level when the policy allows it), it takes the cheapest per node first,
finishing each prefix with the cheapest single task that completes it, keeps the cheapest such set and
drops the dearest victims that are not needed.

``FEWEST`` suspends as few tasks as it can; among as few, those that free the fewest nodes beyond the need;
then those that lose the least per second their runs have gone. Each suspend delays one job (it queues
again, and must find its nodes free at once, as the preemptor would have had to), whatever its size, so the
fewest victims delay the fewest jobs; nodes freed beyond the need delay a victim for nothing (in the
simulator, one 16-node 22 h task suspended for 4-node ones ended the trace late); and job durations are
heavy-tailed, so a run that has gone long is likely to go on long: suspending it moves its work behind the
preemptor where it delays the fewest others. In the simulator it has ~70% fewer suspends than ``CHEAPEST``
and the lower mean JCT. It takes the biggest first until the next one would complete the set, completes it
with the task that frees the fewest extra nodes and loses least per run time, and drops victims not needed.

``FEWEST_FRESHEST`` is ``FEWEST`` whose last criterion is the loss per node instead of per second of run:
among as few victims freeing as few extra nodes, those whose last durable checkpoints are the freshest. A
victim whose checkpoint is fresher than its save takes goes at once, so the preemptor does not wait for a
save and nothing is saved or held; dividing by the run time instead prefers a long run whose checkpoint may
be minutes old. In the simulator (20 seeds) it lowers the mean JCT of HIGH and above on every seed and the
node-time lost on most; the mean JCT of all jobs changes by less than it varies from seed to seed.

HAI's rule (lowest priority, then the latest submitted) is kept as an option.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ff_scheduler.core.model import RunSnap


class VictimChoice(enum.Enum):
    """How the matcher picks victims among the tasks it may preempt."""

    # Lowest priority first, then the latest submitted (HAI's FIFOMatcher).
    LEAST_IMPORTANT_LATEST = "least_important_latest"
    # The least node-time lost, weighed by the victims' sizes, whatever their (lower) level.
    CHEAPEST = "cheapest"
    # The fewest victims, then the fewest nodes freed beyond the need, then the least node-time lost per second
    # of their runs, whatever their (lower) level.
    FEWEST = "fewest"
    # The fewest victims, then the fewest nodes freed beyond the need, then the least node-time lost per node (the
    # freshest checkpoints), whatever their (lower) level.
    FEWEST_FRESHEST = "fewest_freshest"

    @property
    def weighs_loss(self) -> bool:
        """The rule weighs what preempting each candidate loses (the matcher computes it only then)."""
        return self is not VictimChoice.LEAST_IMPORTANT_LATEST


@dataclass(frozen=True, slots=True)
class Candidate:
    """A running task that may be preempted: its level, the nodes it would free and what stopping it loses."""

    task_id: int
    level: int
    num_nodes: int
    loss_node_s: float
    # FCFS key: smaller came first.
    fcfs: int
    # How long its run has gone (what ``loss_per_run_s`` divides by).
    ran_s: float = 0.0


# ``loss_per_run_s`` divides by at least this, so that a run that has barely started is not divided by ~0.
MIN_RAN_S = 60.0


def durable_at(run: RunSnap) -> float:
    """Since when the run's progress is at risk: its last checkpoint's snapshot, else the run's start.

    The checkpoint's time is rank 0's node clock and the start the scheduler's: the clocks are taken to agree
    to well under a checkpoint interval (NTP); a checkpoint reported without its snapshot time counts from
    its commit.
    """
    start = run.started_at or run.created_at
    checkpoint = run.checkpoint_taken_at or run.checkpoint_committed_at
    return max(start, checkpoint)


def loss_node_s(run: RunSnap, now: float, restart_cost_s: float) -> float:
    """The node-time preempting ``run`` at ``now`` loses: work since its last durable state, and a reload."""
    at_risk_s = max(0.0, now - durable_at(run))
    return len(run.node_ids) * (at_risk_s + restart_cost_s)


def choose(candidates: Sequence[Candidate], need: int, rule: VictimChoice) -> list[Candidate]:
    """Victims that together free at least ``need`` nodes, by ``rule``; [] when all of them free fewer."""
    if need <= 0 or sum(c.num_nodes for c in candidates) < need:
        return []
    if rule is VictimChoice.LEAST_IMPORTANT_LATEST:
        return _prefix(order(candidates, rule), need)
    if rule is VictimChoice.FEWEST:
        return _fewest_cover(candidates, need, loss_per_run_s)
    if rule is VictimChoice.FEWEST_FRESHEST:
        return _fewest_cover(candidates, need, loss_per_node)
    return _cheapest_cover(candidates, need)


def order(candidates: Sequence[Candidate], rule: VictimChoice) -> list[Candidate]:
    """The candidates in the order the rule prefers them one by one (for placements ``choose`` cannot make)."""
    if rule is VictimChoice.LEAST_IMPORTANT_LATEST:
        return sorted(candidates, key=lambda c: (c.level, -c.fcfs))
    if rule is VictimChoice.FEWEST:
        return sorted(candidates, key=_biggest_first(loss_per_run_s))
    if rule is VictimChoice.FEWEST_FRESHEST:
        return sorted(candidates, key=_biggest_first(loss_per_node))
    return sorted(candidates, key=_cheapest_first)


def cost(c: Candidate) -> float:
    """What the cheapest choice weighs: the node-time lost, times the nodes the victim must gather again."""
    return c.loss_node_s * c.num_nodes


def loss_per_run_s(c: Candidate) -> float:
    """What the fewest choice weighs among as many victims: the node-time lost per second its run has gone."""
    return c.loss_node_s / max(c.ran_s, MIN_RAN_S)


def loss_per_node(c: Candidate) -> float:
    """What the fewest-freshest choice weighs among as many victims: the node-time lost per node it frees."""
    return c.loss_node_s / c.num_nodes if c.num_nodes else math.inf


def _prefix(ordered: list[Candidate], need: int) -> list[Candidate]:
    taken: list[Candidate] = []
    have = 0
    for c in ordered:
        taken.append(c)
        have += c.num_nodes
        if have >= need:
            return taken
    return []


def _cheapest_first(c: Candidate) -> tuple[float, int, int, int]:
    """Cost per node freed, then fewer nodes, then the lower level, then the latest submitted."""
    per_node = cost(c) / c.num_nodes if c.num_nodes else math.inf
    return (per_node, c.num_nodes, c.level, -c.fcfs)


def _biggest_first(dearness: Callable[[Candidate], float]) -> Callable[[Candidate], tuple[int, float, int, int]]:
    """More nodes, then the least ``dearness``, then the lower level, then the latest submitted."""
    return lambda c: (-c.num_nodes, dearness(c), c.level, -c.fcfs)


def _fewest_cover(pool: Sequence[Candidate], need: int, dearness: Callable[[Candidate], float]) -> list[Candidate]:
    """Few of ``pool`` freeing at least ``need`` nodes, few beyond ``need``, of little ``dearness`` (greedy).

    Candidates go biggest first; one that would complete the prefix taken so far is a way to finish (the way
    with the fewest victims, then the fewest extra nodes, then the least ``dearness`` in total, is kept), one
    that would not joins the prefix. Linear after the sort, like ``_cheapest_cover``.
    """
    best: list[Candidate] = []
    best_key = (math.inf, math.inf, math.inf)
    prefix: list[Candidate] = []
    have, prefix_loss = 0, 0.0
    for c in sorted(pool, key=_biggest_first(dearness)):
        loss = dearness(c)
        if have + c.num_nodes >= need:
            key = (len(prefix) + 1.0, have + c.num_nodes - need, prefix_loss + loss)
            if key < best_key:
                best, best_key = [*prefix, c], key
        else:
            prefix.append(c)
            have += c.num_nodes
            prefix_loss += loss
    return _drop_unneeded(best, need, dearness)


def _cheapest_cover(pool: Sequence[Candidate], need: int) -> list[Candidate]:
    """A set of ``pool`` freeing at least ``need`` nodes at a low ``cost`` (greedy; ``pool`` frees enough).

    Candidates go cheapest per node first; one that would complete the prefix taken so far is a way to
    finish (the cheapest such way is kept), one that would not joins the prefix. Linear after the sort, so it
    holds at 10,000 nodes (the exact minimum is a knapsack).
    """
    best: list[Candidate] = []
    best_cost = math.inf
    prefix: list[Candidate] = []
    have, prefix_cost = 0, 0.0
    for c in sorted(pool, key=_cheapest_first):
        if have + c.num_nodes >= need:
            if prefix_cost + cost(c) < best_cost:
                best, best_cost = [*prefix, c], prefix_cost + cost(c)
        else:
            prefix.append(c)
            have += c.num_nodes
            prefix_cost += cost(c)
    return _drop_unneeded(best, need, cost)


def _drop_unneeded(chosen: list[Candidate], need: int, dearness: Callable[[Candidate], float]) -> list[Candidate]:
    """``chosen`` without the dearest victims (by ``dearness``) the others can do without."""
    have = sum(c.num_nodes for c in chosen)
    kept = list(chosen)
    for c in sorted(chosen, key=lambda c: -dearness(c)):
        if have - c.num_nodes >= need:
            kept.remove(c)
            have -= c.num_nodes
    return kept
