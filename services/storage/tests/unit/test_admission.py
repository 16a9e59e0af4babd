"""Which chain updates a target takes, at the head and at a replica (core.admission), as a table."""

from __future__ import annotations

import pytest

from ff_storage.core.admission import Refusal, TargetState, at_head, at_replica

NS, STALE = Refusal.NOT_SERVING, Refusal.STALE_CHAIN_VERSION


def state(version: int | None = 5, index: int | None = 0, may_update: bool = True, serving: bool = True) -> TargetState:
    return TargetState(target_id=11, chain_version=version, index=index, may_update=may_update, serving=serving)


@pytest.mark.parametrize(
    ("target", "routed", "expected"),
    [
        (state(), 5, None),  # the serving head, routed right
        (None, 5, NS),  # no target of the chain here
        (state(version=None, index=None), 5, NS),  # not in its chain's routing
        (state(may_update=False), 5, NS),  # lease lapsed, down, offline
        (state(serving=False), 5, NS),  # syncing: takes forwarded replaces, starts nothing
        (state(), 4, STALE),  # the caller's routing is old
        (state(), 6, STALE),  # or newer than this node's
        (state(index=1), 5, NS),  # a middle replica
        (state(index=1), 4, STALE),  # the version is checked first: the caller must refresh either way
    ],
)
def test_at_head(target: TargetState | None, routed: int, expected: Refusal | None) -> None:
    got = at_head(target, 3, routed)
    assert (got[0] if got else None) is expected, got


@pytest.mark.parametrize(
    ("target", "sent", "no_forward", "expected"),
    [
        (state(index=1), 5, False, None),
        (state(index=2, serving=False), 5, False, None),  # syncing: takes updates (as full replaces)
        (None, 5, False, NS),
        (state(version=None, index=None), 5, False, NS),
        (state(index=1, may_update=False), 5, False, NS),
        (state(index=1), 4, False, STALE),  # sent for an older chain: the predecessor re-forwards
        (state(index=1), 4, True, None),  # a repair's copy for this replica, sent for the chunk's version
        (state(index=1, may_update=False), 4, True, NS),
        (state(index=0), 5, False, NS),  # the head has no predecessor: a target taken out of the chain sent it
        (state(index=0), 4, True, NS),  # nor a repair's copy (a deposed head's, maybe older than what it holds)
    ],
)
def test_at_replica(target: TargetState | None, sent: int, no_forward: bool, expected: Refusal | None) -> None:
    got = at_replica(target, 3, sent, no_forward)
    assert (got[0] if got else None) is expected, got


@pytest.mark.parametrize(
    ("no_forward", "sender_ahead", "expected"),
    [
        (True, True, None),  # a sync's or repair's copy from a serving target ahead of this one
        (True, False, NS),  # from one taken out of the chain (its routing stale), or behind this one
        (False, False, None),  # a forward: its chain version says whether it is current
    ],
)
def test_a_copy_is_taken_only_from_a_serving_target_ahead(
    no_forward: bool, sender_ahead: bool, expected: Refusal | None
) -> None:
    got = at_replica(state(index=2), 3, 5, no_forward, sender_ahead)
    assert (got[0] if got else None) is expected, got
