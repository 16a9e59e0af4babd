"""A batch's writes to one chunk as one version at the head: the content they make, and which ones go together."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from ff_fsprotocol.checksum import crc32c_of
from ff_storage.core.chunks import apply_write, apply_writes
from ff_storage.core.requests import UpdateKind
from ff_storage.core.results import IoStatus
from ff_storage.node import StorageNode
from ff_storage.node_state import Update
from ff_storage.rounds import merged_writes, plan_rounds


@pytest.mark.parametrize("seed", range(30))
def test_writes_applied_at_once_make_what_they_make_one_after_another(seed: int) -> None:
    rng = random.Random(seed)
    old = None if seed % 3 == 0 else rng.randbytes(rng.randrange(0, 5000))
    writes = [(rng.randrange(0, 6000), rng.randbytes(rng.randrange(0, 700))) for _ in range(rng.randrange(1, 9))]
    one_by_one = old
    for offset, data in writes:
        one_by_one = apply_write(one_by_one, offset, data)
    assert apply_writes(old, writes) == (one_by_one or b"")


def _up(key: tuple[int, int], kind: UpdateKind = UpdateKind.WRITE, chunk_size: int = 1 << 16) -> Update:
    return Update(key=key, kind=kind, chunk_size=chunk_size)


def test_runs_of_writes_to_one_chunk_become_one_carrier_in_the_place_of_the_first() -> None:
    a1, b1, a2, a3 = _up((1, 0)), _up((2, 0)), _up((1, 0)), _up((1, 0))
    out = merged_writes([a1, b1, a2, a3])
    assert len(out) == 2 and out[1] is b1
    assert out[0].key == (1, 0) and out[0].members == [a1, a2, a3]


def test_another_update_of_the_chunk_ends_a_run_and_keeps_its_place() -> None:
    w1, cut, w2, w3, w4 = _up((1, 0)), _up((1, 0), UpdateKind.TRUNCATE), _up((1, 0)), _up((1, 0)), _up((1, 0), 1 << 20)
    out = merged_writes([w1, cut, w2, w3, w4])
    assert out[0] is w1 and out[1] is cut and out[2].members == [w2, w3]
    assert out[3] is w4  # another chunk size (a client's mistake the chunk's checks refuse): not merged into them
    assert all(u.members is None for u in (w1, cut, w4))


def test_lone_writes_stay_as_they_are() -> None:
    ups = [_up((1, 0)), _up((1, 1)), _up((2, 0), UpdateKind.REMOVE)]
    assert merged_writes(ups) == ups


async def test_a_write_sent_twice_in_one_batch_is_applied_once(
    whole_chain_node: Callable[[int, int, int], StorageNode],
) -> None:
    """A batch that holds one write twice (same id: the client's, bound to its bytes) and another write over it in
    between: the second copy is a retry, answered as the first, not applied again over the later write (as when each
    write was its own round: the copy met the first one's record). Merged, every copy was applied in turn."""
    node = whole_chain_node(101, 1, 1)
    target = node.state.targets[1]

    def write(data: bytes, request_id: int) -> Update:
        return Update(
            key=(3, 0),
            kind=UpdateKind.WRITE,
            chunk_size=1 << 16,
            data=data,
            data_checksum=crc32c_of(data),
            length=len(data),
            update_id=(b"writer", request_id),
        )

    first, later, again = write(b"a" * 10, 1), write(b"b" * 10, 2), write(b"a" * 10, 1)
    await node.writer._head_updates(target, [first, later, again])
    assert [(u.result.status, u.result.committed_version) for u in (first, later, again)] == [(IoStatus.OK, 1)] * 3
    got = target.engine.read_committed((3, 0))
    assert got is not None and got[1] == b"b" * 10


def test_a_run_goes_as_one_only_where_its_span_weighs_less_than_the_round_trips_it_saves() -> None:
    """Two pages at the two ends of a 4 MiB chunk go as two writes (their span down the chain would weigh more than
    the round trip saved); five go as one; so do two pages close together (a database's)."""

    def page(at: int) -> Update:
        return Update(key=(1, 0), kind=UpdateKind.WRITE, chunk_size=4 << 20, offset=at, length=4096)

    two_apart = [page(0), page((4 << 20) - 4096)]
    assert merged_writes(two_apart) == two_apart  # in order, each its own round
    five_apart = [page(k * ((4 << 20) - 4096) // 4) for k in range(5)]
    [carrier] = merged_writes(five_apart)
    assert carrier.members == five_apart
    two_close = [page(0), page(90 << 10)]
    [carrier] = merged_writes(two_close)
    assert carrier.members == two_close


def test_rounds_hold_at_most_the_budget_of_chunk_contents_and_keep_each_chunks_order() -> None:
    """A hostile batch of one-byte writes at the end of 64 MiB chunks built every chunk in memory in one round
    (4,096 of them: 256 GiB, at the head and at each replica); rounds now hold at most the budget (one update over it
    alone), and a chunk's updates still come in order, each after the round of the one before."""
    ups = [Update(key=(k % 5, 0), kind=UpdateKind.WRITE, chunk_size=64 << 20, offset=(64 << 20) - 1, length=1)
           for k in range(12)]  # fmt: skip
    rounds = plan_rounds(ups, lambda u: 64 << 20, 128 << 20)
    assert all(len(r) <= 2 for r in rounds) and sum(len(r) for r in rounds) == 12
    where = {id(u): n for n, r in enumerate(rounds) for u in r}
    for key in {u.key for u in ups}:
        mine = [where[id(u)] for u in ups if u.key == key]
        assert mine == sorted(set(mine)), (key, mine)  # strictly later rounds, in the batch's order
    assert len(plan_rounds([ups[0]], lambda u: 1 << 30, 1 << 20)) == 1  # over the budget: alone
    assert [len(r) for r in plan_rounds(ups)] == [5, 5, 2]  # no budget: as before
