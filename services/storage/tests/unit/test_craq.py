"""The CRAQ decisions of one update at one replica (core.craq), as tables: no sockets, no disk."""

from __future__ import annotations

import pytest

from ff_storage.core import craq
from ff_storage.core.craq import AfterFailure, Answer, DamagedBase, Decision, Place, Step, Verdict

HEAD, REPLICA = Place.HEAD, Place.REPLICA
APPLY, RETRIED, DUP, MISSING, NOTHING = (
    Verdict.APPLY,
    Verdict.RETRIED,
    Verdict.DUPLICATE,
    Verdict.MISSING,
    Verdict.NOTHING_TO_REMOVE,
)


@pytest.mark.parametrize(
    ("place", "committed", "version", "kw", "expected"),
    [
        # the head versions: committed + 1, whatever the update says
        (HEAD, 0, 0, {}, Decision(APPLY, 1)),
        (HEAD, 7, 0, {}, Decision(APPLY, 8)),
        (HEAD, 7, 0, {"retried_version": 5}, Decision(RETRIED, 5)),  # a retry: its first result, not a new version
        # a replica applies the next version, and only that one
        (REPLICA, 4, 5, {}, Decision(APPLY, 5)),
        (REPLICA, 4, 7, {}, Decision(MISSING, 4)),  # versions 5 and 6 never came: send the whole chunk
        (REPLICA, 5, 5, {}, Decision(DUP, 5)),  # ids off: the version alone says it is here
        (REPLICA, 5, 4, {}, Decision(DUP, 5)),
        (REPLICA, 5, 5, {"same_update": True}, Decision(DUP, 5)),  # a re-forward of what it committed
        (REPLICA, 5, 5, {"same_update": False}, Decision(MISSING, 5)),  # another update at that version: replace
        # a full-chunk replace (sync, repair, the answer to MISSING) applies at or above the committed version
        (REPLICA, 5, 5, {"full": True}, Decision(APPLY, 5)),
        (REPLICA, 5, 9, {"full": True}, Decision(APPLY, 9)),
        (REPLICA, 5, 4, {"full": True}, Decision(DUP, 5)),
        # a sync's or repair's copy is the predecessor's committed chunk: it applies below the version held here too
        (REPLICA, 5, 4, {"full": True, "recovery_copy": True}, Decision(APPLY, 4)),
        (REPLICA, 5, 5, {"full": True, "recovery_copy": True, "same_update": False}, Decision(APPLY, 5)),
        # a remove of a chunk this replica does not have is done; a version gap still comes first
        (REPLICA, 0, 1, {"remove_of_nothing": True}, Decision(NOTHING, 0)),
        (REPLICA, 0, 2**62, {"full": True, "remove_of_nothing": True}, Decision(NOTHING, 0)),  # a sync's remove
        (REPLICA, 0, 3, {"remove_of_nothing": True}, Decision(MISSING, 0)),
    ],
)
def test_admit(place: Place, committed: int, version: int, kw: dict[str, object], expected: Decision) -> None:
    assert craq.admit(place, committed, version, **kw) == expected  # type: ignore[arg-type]


def test_a_damaged_base_is_repaired_at_the_head_and_replaced_whole_at_a_replica() -> None:
    assert craq.on_damaged_base(HEAD) is DamagedBase.REPAIR_THEN_RETRY
    assert craq.on_damaged_base(REPLICA) is DamagedBase.ASK_WHOLE_CHUNK


@pytest.mark.parametrize(
    ("may_update", "in_chain", "has_successor", "expected"),
    [
        (True, True, True, Step.SEND),
        (True, True, False, Step.COMMIT),  # the tail
        (True, False, False, Step.NOT_IN_CHAIN),
        (False, True, True, Step.NOT_SERVING),  # lease lapsed or demoted: nothing more is forwarded
        (False, False, False, Step.NOT_SERVING),
    ],
)
def test_forward_step(may_update: bool, in_chain: bool, has_successor: bool, expected: Step) -> None:
    assert craq.forward_step(may_update, in_chain, has_successor) is expected


@pytest.mark.parametrize(
    ("ok", "missing", "expected"),
    [(True, False, Answer.ACKED), (False, True, Answer.SEND_WHOLE_CHUNK), (False, False, Answer.RETRY)],
)
def test_on_answer(ok: bool, missing: bool, expected: Answer) -> None:
    assert craq.on_answer(ok, missing) is expected


def test_a_failure_after_the_successor_took_an_update_sends_this_replica_to_recovery() -> None:
    assert craq.on_failure(successor_took_any=False) is AfterFailure.DROP
    assert craq.on_failure(successor_took_any=True) is AfterFailure.DROP_AND_RECOVER
