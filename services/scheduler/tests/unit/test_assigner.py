"""Quota outcomes and AUTO priority (HAI FIFOAssigner), table-driven."""

from __future__ import annotations

import pytest

from ff_scheduler.core import priority as p
from ff_scheduler.core.assigner import Verdict, assign
from ff_scheduler.core.builders import GROUP, queued, running
from ff_scheduler.core.model import QueueReason

IN = QueueReason.NONE
OUT = QueueReason.OUT_OF_QUOTA
EXCEEDED = QueueReason.QUOTA_EXCEEDED


@pytest.mark.parametrize(
    ("quota", "used_by_running", "asked", "nodes", "expected"),
    [
        # fixed priority: enough quota left -> in quota at that level
        ({p.HIGH: 4}, 0, p.HIGH, 4, Verdict(True, p.HIGH)),
        # the user's running task holds the quota -> out of quota (it could run later)
        ({p.HIGH: 4}, 2, p.HIGH, 4, Verdict(False, p.HIGH, OUT)),
        # the quota itself is too small -> exceeded (it can never run there)
        ({p.HIGH: 2}, 0, p.HIGH, 4, Verdict(False, p.HIGH, EXCEEDED)),
        # no quota row at all -> exceeded
        ({}, 0, p.NORMAL, 1, Verdict(False, p.NORMAL, EXCEEDED)),
        # quota at another level does not help a fixed priority
        ({p.LOW: 8}, 0, p.HIGH, 1, Verdict(False, p.HIGH, EXCEEDED)),
        # AUTO: the highest level with enough quota left
        ({p.LOW: 8, p.HIGH: 2}, 0, None, 2, Verdict(True, p.HIGH)),
        ({p.LOW: 8, p.HIGH: 2}, 0, None, 4, Verdict(True, p.LOW)),
        # AUTO: HIGH used by the running task -> falls to LOW
        ({p.LOW: 8, p.HIGH: 2}, 2, None, 2, Verdict(True, p.LOW)),
        # AUTO: some level could hold it but is used -> out of quota; none could -> exceeded
        ({p.HIGH: 2}, 2, None, 2, Verdict(False, None, OUT)),
        ({p.HIGH: 2, p.LOW: 1}, 0, None, 3, Verdict(False, None, EXCEEDED)),
    ],
)
def test_quota_outcomes(
    quota: dict[int, int], used_by_running: int, asked: int | None, nodes: int, expected: Verdict
) -> None:
    quotas = {("alice", level, GROUP): n for level, n in quota.items()}
    tasks = [queued(2, nodes, asked)]
    if used_by_running:
        tasks.append(running(1, tuple(range(1, used_by_running + 1)), p.HIGH))
    assert assign(tasks, quotas)[2] == expected


def test_running_tasks_are_charged_before_older_queued_ones() -> None:
    """A suspended (older) task of a user never pushes the same user's running task out of quota."""
    quotas = {("alice", p.NORMAL, GROUP): 2}
    tasks = [queued(1, 2, p.NORMAL, fcfs=1), running(5, (1, 2), p.NORMAL, fcfs=5)]
    verdicts = assign(tasks, quotas)
    assert verdicts[5] == Verdict(True, p.NORMAL)
    assert verdicts[1] == Verdict(False, p.NORMAL, OUT)


def test_fcfs_within_quota_and_per_user_and_group() -> None:
    quotas = {("alice", p.NORMAL, GROUP): 3, ("bob", p.NORMAL, GROUP): 1}
    tasks = [
        queued(1, 2, p.NORMAL),
        queued(2, 2, p.NORMAL),
        queued(3, 1, p.NORMAL),
        queued(4, 1, p.NORMAL, user="bob"),
        queued(5, 1, p.NORMAL, group="other"),
    ]
    verdicts = assign(tasks, quotas)
    assert [verdicts[i].in_quota for i in (1, 2, 3, 4, 5)] == [True, False, True, True, False]
    assert verdicts[5].reason is EXCEEDED


def test_quotas_off_lets_everything_through_and_auto_takes_the_top_level() -> None:
    verdicts = assign([queued(1, 100, None), queued(2, 1, p.LOW)], {}, enforce=False)
    assert verdicts[1] == Verdict(True, p.EXTREME_HIGH)
    assert verdicts[2] == Verdict(True, p.LOW)
