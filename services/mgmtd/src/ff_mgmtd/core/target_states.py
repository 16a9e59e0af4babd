"""3FS's public target state machine: the transition table and the chain scan that applies it (pure).

The table is the one of 3FS's design notes (local state, current public state, predecessor -> next public
state). "Predecessor" is the target just before this one in the chain once offline targets have been
moved to the end: a target at the head has none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from ff_mgmtd.core.model import Chain, ChainTarget, LocalTargetState, PublicTargetState

L = LocalTargetState
P = PublicTargetState


def next_public_state(local: L, public: P, predecessor: P | None) -> P:
    """The public state a target moves to, given its local state and its predecessor's (new) public state.

    Args:
        local: what the target's node reports (offline when the node is dead).
        public: the target's current public state.
        predecessor: the new public state of the target before it in the chain; None at the head.
    """
    pred_serving = predecessor is P.SERVING
    if local is L.UPTODATE:
        return {P.SERVING: P.SERVING, P.SYNCING: P.SERVING, P.WAITING: P.WAITING,
                P.LASTSRV: P.SERVING, P.OFFLINE: P.WAITING}[public]  # fmt: skip
    if local is L.ONLINE:
        if public in (P.SYNCING, P.WAITING):
            return P.SYNCING if pred_serving else P.WAITING
        return {P.SERVING: P.SERVING, P.LASTSRV: P.SERVING, P.OFFLINE: P.WAITING}[public]
    # local offline
    if public is P.SERVING:
        return P.LASTSRV if predecessor is None else P.OFFLINE
    return P.LASTSRV if public is P.LASTSRV else P.OFFLINE


# Order of a chain: readers and writers first, then targets being brought back, offline ones last.
_PUBLIC_RANK = {P.SERVING: 0, P.SYNCING: 1, P.WAITING: 2, P.LASTSRV: 3, P.OFFLINE: 4}


def scan_chain(chain: Chain, local_states: Mapping[int, L]) -> Chain:
    """One scan of one chain: new public states, offline targets at the end.

    The version increases when a public state or the order changes (what routing depends on); a change
    of local states only is returned with the same version. An unchanged chain is returned as is.

    Args:
        chain: the chain as stored.
        local_states: the local state of targets whose node reported them (or is dead); a target not in
            it keeps the local state stored in the chain.
    """
    current = [replace(t, local_state=local_states.get(t.target_id, t.local_state)) for t in chain.targets]
    # Who serves after this scan does not depend on predecessors (serving or lastsrv and up, or an up-to-date
    # syncing target). A serving target that goes offline is the chain's last copy (lastsrv) only when no
    # other target will serve and no offline target already holds lastsrv: exactly one lastsrv, so the
    # chain can come back from it, and never a lastsrv while another replica still serves.
    will_serve = any(
        t.local_state is not L.OFFLINE and next_public_state(t.local_state, t.public_state, P.SERVING) is P.SERVING
        for t in current
    )
    lastsrv_taken = will_serve or any(t.public_state is P.LASTSRV and t.local_state is L.OFFLINE for t in current)
    # Offline targets go to the end first, so that "predecessor" means a target that is still up, and
    # among the live ones the serving targets come first.
    order = sorted(
        current,
        key=lambda t: (
            t.local_state is L.OFFLINE,
            0 if t.public_state in (P.SERVING, P.LASTSRV) else _PUBLIC_RANK[t.public_state],
        ),
    )
    updated: list[ChainTarget] = []
    for target in order:
        if target.local_state is L.OFFLINE and target.public_state is P.SERVING:
            new_state = P.OFFLINE if lastsrv_taken else P.LASTSRV
            lastsrv_taken = True
        else:
            predecessor = updated[-1].public_state if updated else None
            new_state = next_public_state(target.local_state, target.public_state, predecessor)
        updated.append(replace(target, public_state=new_state))
    final = tuple(sorted(updated, key=lambda t: _PUBLIC_RANK[t.public_state]))
    if final == chain.targets:
        return chain
    routed = [(t.target_id, t.public_state) for t in final] != [(t.target_id, t.public_state) for t in chain.targets]
    return Chain(chain_id=chain.chain_id, version=chain.version + (1 if routed else 0), targets=final)


def scan_chains(chains: list[Chain], local_states: Mapping[int, L]) -> list[Chain]:
    """The chains that change in this scan (with their new versions)."""
    changed = []
    for chain in chains:
        new = scan_chain(chain, local_states)
        if new is not chain:
            changed.append(new)
    return changed
