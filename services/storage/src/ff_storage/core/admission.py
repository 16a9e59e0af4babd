"""Whether a target takes a chain update now, at the head and at a replica (pure).

At the head the update is a client's write, truncate or remove; at a replica it is what its predecessor
forwards. The node describes the target as it stands, this says yes or why not.

CRAQ (3FS flavour): only the chain's head starts updates, for the chain version the caller routed by; a replica
takes forwarded updates while it may update (serving, or syncing as full-chunk replaces) and its chain is at the
version the update was sent for, except a repair's copy for this one replica (``no_forward``), which is sent for
the version the chunk was written at. The head takes none: only a target taken out of the chain would send it one.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Refusal(enum.Enum):
    """Why an update is not taken (the service answers each with its status: retry after fresh routing)."""

    NOT_SERVING = "not serving"
    STALE_CHAIN_VERSION = "stale chain version"


@dataclass(frozen=True)
class TargetState:
    """One target of this node as an update finds it.

    ``chain_version`` and ``index``: the chain's version and the target's position in it, as this node's routing
    has them (None: the target is not in its chain's routing). ``may_update``: lease held, not down, serving or
    syncing. ``serving``: its public state is serving (a syncing target is no head).
    """

    target_id: int
    chain_version: int | None
    index: int | None
    may_update: bool
    serving: bool


def at_head(target: TargetState | None, chain_id: int, routed_version: int) -> tuple[Refusal, str] | None:
    """None when ``target`` starts an update the caller routed by ``routed_version``; else why not.

    ``target`` is this node's target of chain ``chain_id``, None if it has none.
    """
    if target is None:
        return Refusal.NOT_SERVING, f"no target of chain {chain_id} on this node"
    if target.chain_version is None or target.index is None or not (target.may_update and target.serving):
        return Refusal.NOT_SERVING, f"target {target.target_id} is not serving"
    if target.chain_version != routed_version:
        return Refusal.STALE_CHAIN_VERSION, f"chain {chain_id} is at version {target.chain_version}"
    if target.index != 0:
        return Refusal.NOT_SERVING, f"target {target.target_id} is not the head"
    return None


def at_replica(
    target: TargetState | None, chain_id: int, sent_version: int, no_forward: bool, sender_ahead: bool = True
) -> tuple[Refusal, str] | None:
    """None when ``target`` takes an update its predecessor sent for chain version ``sent_version``; else why not.

    ``sender_ahead``: the sender is a serving target ahead of ``target`` in its chain, as this node's routing has it.
    A copy (``no_forward``: a sync's or a repair's, applied whatever version is held here) is taken only from such a
    sender; one from a target taken out of the chain (its routing stale) may be older than what is here.
    """
    if target is None:
        return Refusal.NOT_SERVING, f"no target of chain {chain_id} here"
    if target.chain_version is None or not target.may_update:
        return Refusal.NOT_SERVING, f"target {target.target_id} not serving"
    if target.index == 0:  # a head has no predecessor: this comes from a target taken out of the chain
        return Refusal.NOT_SERVING, f"target {target.target_id} heads chain {chain_id}: it takes no forwarded update"
    if no_forward and not sender_ahead:
        return Refusal.NOT_SERVING, f"a copy for target {target.target_id} from a target not serving ahead of it"
    if not no_forward and target.chain_version != sent_version:
        return Refusal.STALE_CHAIN_VERSION, f"chain at version {target.chain_version}"
    return None
