"""The 3FS public-state transition table over every combination, and the chain scan built on it."""

from __future__ import annotations

import itertools

import pytest

from ff_mgmtd.core.model import Chain, ChainTarget, LocalTargetState, PublicTargetState
from ff_mgmtd.core.target_states import next_public_state, scan_chain, scan_chains

L, P = LocalTargetState, PublicTargetState
SERVING, SYNCING, WAITING, LASTSRV, OFFLINE = P.SERVING, P.SYNCING, P.WAITING, P.LASTSRV, P.OFFLINE

# The digest's table, written out: (local, public) -> next state for (no predecessor, predecessor
# serving, predecessor not serving). The predecessor matters only where the table says so.
TABLE: dict[tuple[L, P], tuple[P, P, P]] = {
    (L.UPTODATE, SERVING): (SERVING, SERVING, SERVING),
    (L.UPTODATE, SYNCING): (SERVING, SERVING, SERVING),
    (L.UPTODATE, WAITING): (WAITING, WAITING, WAITING),
    (L.UPTODATE, LASTSRV): (SERVING, SERVING, SERVING),
    (L.UPTODATE, OFFLINE): (WAITING, WAITING, WAITING),
    (L.ONLINE, SERVING): (SERVING, SERVING, SERVING),
    (L.ONLINE, SYNCING): (WAITING, SYNCING, WAITING),
    (L.ONLINE, WAITING): (WAITING, SYNCING, WAITING),
    (L.ONLINE, LASTSRV): (SERVING, SERVING, SERVING),
    (L.ONLINE, OFFLINE): (WAITING, WAITING, WAITING),
    (L.OFFLINE, SERVING): (LASTSRV, OFFLINE, OFFLINE),
    (L.OFFLINE, SYNCING): (OFFLINE, OFFLINE, OFFLINE),
    (L.OFFLINE, WAITING): (OFFLINE, OFFLINE, OFFLINE),
    (L.OFFLINE, LASTSRV): (LASTSRV, LASTSRV, LASTSRV),
    (L.OFFLINE, OFFLINE): (OFFLINE, OFFLINE, OFFLINE),
}


def test_table_covers_every_local_and_public_state() -> None:
    assert set(TABLE) == set(itertools.product(L, P))


@pytest.mark.parametrize(("local", "public", "predecessor"), list(itertools.product(L, P, [None, *P])))
def test_transition(local: L, public: P, predecessor: P | None) -> None:
    none, serving, other = TABLE[(local, public)]
    expected = none if predecessor is None else serving if predecessor is SERVING else other
    assert next_public_state(local, public, predecessor) is expected


def _chain(*targets: tuple[int, P, L], version: int = 7) -> Chain:
    return Chain(
        chain_id=1,
        version=version,
        targets=tuple(ChainTarget(target_id=i, node_id=i, public_state=p, local_state=loc) for i, p, loc in targets),
    )


def _states(chain: Chain) -> list[tuple[int, P]]:
    return [(t.target_id, t.public_state) for t in chain.targets]


def test_steady_chain_is_unchanged() -> None:
    chain = _chain((1, SERVING, L.UPTODATE), (2, SERVING, L.UPTODATE), (3, SERVING, L.UPTODATE))
    assert scan_chain(chain, {}) is chain
    assert scan_chains([chain], {1: L.UPTODATE}) == []


def test_failed_head_goes_offline_to_the_end_and_version_increases() -> None:
    chain = _chain((1, SERVING, L.UPTODATE), (2, SERVING, L.UPTODATE), (3, SERVING, L.UPTODATE))
    new = scan_chain(chain, {1: L.OFFLINE})
    assert _states(new) == [(2, SERVING), (3, SERVING), (1, OFFLINE)]
    assert new.version == 8


def test_last_serving_target_becomes_lastsrv() -> None:
    chain = _chain((1, SERVING, L.UPTODATE), (2, OFFLINE, L.OFFLINE), (3, OFFLINE, L.OFFLINE))
    new = scan_chain(chain, {1: L.OFFLINE})
    assert _states(new) == [(1, LASTSRV), (2, OFFLINE), (3, OFFLINE)]


def test_whole_chain_failing_at_once_leaves_exactly_one_lastsrv() -> None:
    chain = _chain((1, SERVING, L.UPTODATE), (2, SERVING, L.UPTODATE), (3, SERVING, L.UPTODATE))
    new = scan_chain(chain, {1: L.OFFLINE, 2: L.OFFLINE, 3: L.OFFLINE})
    assert [p for _, p in _states(new)] == [LASTSRV, OFFLINE, OFFLINE]


def test_returning_target_waits_then_syncs_then_serves() -> None:
    chain = _chain((2, SERVING, L.UPTODATE), (3, SERVING, L.UPTODATE), (1, OFFLINE, L.OFFLINE))
    waiting = scan_chain(chain, {1: L.ONLINE})
    assert _states(waiting) == [(2, SERVING), (3, SERVING), (1, WAITING)]
    syncing = scan_chain(waiting, {1: L.ONLINE})
    assert _states(syncing) == [(2, SERVING), (3, SERVING), (1, SYNCING)]
    assert scan_chain(syncing, {1: L.ONLINE}) is syncing
    serving = scan_chain(syncing, {1: L.UPTODATE})
    assert _states(serving) == [(2, SERVING), (3, SERVING), (1, SERVING)]
    assert serving.version == chain.version + 3


def test_only_one_target_syncs_at_a_time() -> None:
    chain = _chain((1, SERVING, L.UPTODATE), (2, WAITING, L.ONLINE), (3, WAITING, L.ONLINE))
    new = scan_chain(chain, {})
    assert _states(new) == [(1, SERVING), (2, SYNCING), (3, WAITING)]


def test_lastsrv_returning_serves_and_others_wait_for_it() -> None:
    chain = _chain((1, LASTSRV, L.OFFLINE), (2, OFFLINE, L.OFFLINE), (3, OFFLINE, L.OFFLINE))
    only_2 = scan_chain(chain, {2: L.ONLINE})
    assert dict(_states(only_2)) == {1: LASTSRV, 2: WAITING, 3: OFFLINE}
    back = scan_chain(only_2, {1: L.ONLINE, 2: L.ONLINE})
    assert _states(back)[0] == (1, SERVING)


def test_local_state_change_alone_keeps_the_version() -> None:
    chain = _chain((1, SERVING, L.ONLINE), (2, SERVING, L.UPTODATE))
    new = scan_chain(chain, {1: L.UPTODATE})
    assert new.version == chain.version and new.targets[0].local_state is L.UPTODATE


def test_last_serving_target_failing_while_another_syncs_becomes_lastsrv() -> None:
    # Seen in a whole-cluster restart: nodes come back one by one. The only serving target goes offline
    # while another is still syncing from it: it holds the chain's last copy, so it must be lastsrv (an
    # offline one would leave every target waiting for a serving predecessor that never comes).
    chain = _chain((1, P.SERVING, L.UPTODATE), (2, P.SYNCING, L.ONLINE), (3, P.OFFLINE, L.OFFLINE))
    after = scan_chain(chain, {1: L.OFFLINE})
    assert _states(after) == [(2, P.WAITING), (1, P.LASTSRV), (3, P.OFFLINE)]
    # Everyone returns: the lastsrv target serves again, then the others sync from it in turn.
    back = scan_chain(after, {1: L.ONLINE, 2: L.ONLINE, 3: L.ONLINE})
    assert _states(back)[0] == (1, P.SERVING)
    assert sorted(s for _, s in _states(back)[1:]) == [P.SYNCING, P.WAITING]


def test_serving_target_failing_while_another_still_serves_goes_offline() -> None:
    chain = _chain((1, P.SERVING, L.UPTODATE), (2, P.SERVING, L.UPTODATE), (3, P.SERVING, L.UPTODATE))
    after = scan_chain(chain, {1: L.OFFLINE})
    assert _states(after) == [(2, P.SERVING), (3, P.SERVING), (1, P.OFFLINE)]


@pytest.mark.parametrize("fail_order", list(itertools.permutations([1, 2, 3])))
def test_any_failure_order_keeps_a_way_back(fail_order: tuple[int, ...]) -> None:
    """Targets fail one scan at a time in any order: exactly one lastsrv remains, and when all return
    the chain ends with every target serving."""
    chain = _chain((1, P.SERVING, L.UPTODATE), (2, P.SERVING, L.UPTODATE), (3, P.SERVING, L.UPTODATE))
    down: dict[int, L] = {}
    for target_id in fail_order:
        down[target_id] = L.OFFLINE
        chain = scan_chain(chain, down)
    assert [s for _, s in _states(chain)].count(P.LASTSRV) == 1
    up = dict.fromkeys((1, 2, 3), L.ONLINE)
    for _ in range(6):  # returning targets sync one by one, then report up to date
        chain = scan_chain(chain, up)
        up = {t.target_id: L.UPTODATE if t.public_state is P.SYNCING else L.ONLINE for t in chain.targets}
    assert [s for _, s in _states(chain)] == [P.SERVING] * 3
