"""Run failures as stored (JSON in the run and node-run rows) read back across versions of the scheduler."""

from __future__ import annotations

from ff_scheduler.core.model import Failure, FailureClass
from ff_scheduler.store.ticks import failure_from_json, failure_to_json
from ff_scheduler.wire import _failure_pb

HUNG = Failure(
    failure_class=FailureClass.INFRASTRUCTURE,
    node_id=3,
    node_rank=1,
    local_rank=1,
    failed_at=5.0,
    message="hang: rank 3",
    hang=True,
)


def test_a_failure_round_trips_through_its_json_and_proto() -> None:
    stored = failure_to_json(HUNG)
    assert failure_from_json(stored) == HUNG
    msg = _failure_pb(stored)
    assert msg is not None and msg.hang and msg.node_id == 3 and msg.message == "hang: rank 3"


def test_an_older_row_reads_with_defaults_and_a_newer_one_ignores_unknown_keys() -> None:
    older = {k: v for k, v in (failure_to_json(HUNG) or {}).items() if k != "hang"}
    assert failure_from_json(older) == Failure(**{**HUNG.__dict__, "hang": False})
    newer = {**(failure_to_json(HUNG) or {}), "from_a_later_version": 1}
    assert failure_from_json(newer) == HUNG
    later_class = {**(failure_to_json(HUNG) or {}), "failure_class": 99}  # a class this version does not know
    got = failure_from_json(later_class)
    assert got is not None and got.failure_class is FailureClass.UNSPECIFIED and got.message == HUNG.message
    msg = _failure_pb(newer)
    assert msg is not None and msg.hang
    assert failure_from_json(None) is None and _failure_pb({}) is None
