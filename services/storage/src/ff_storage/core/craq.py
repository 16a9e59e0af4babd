"""The CRAQ decisions for one chain update at one replica, with no I/O (3FS's flavour of CRAQ).

Each function takes what the replica knows when an event happens and returns what to do; ``writes.ChainWriter``
does the I/O each decision calls for (store the pending version and forward at once, commit on the successor's
ack, drop, recover):

- ``admit``: an update arrives (a client's at the head, a forwarded one at a replica): store it at a version,
  answer a retry with its first result, answer a duplicate, or ask the predecessor for the whole chunk;
- ``on_damaged_base``: the committed copy the update applies to fails its checksum;
- ``forward_step``: before each send to the successor: send, commit (this is the tail), or stop;
- ``on_answer``: the successor answered one update;
- ``on_failure``: storing or committing the update here failed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ff_storage.core.chunks import ForwardDecision, decide_forward


class Place(enum.Enum):
    """Where in the chain the replica deciding is."""

    HEAD = "head"  # versions the updates of clients
    REPLICA = "replica"  # applies what its predecessor forwards


class Verdict(enum.Enum):
    """What ``admit`` decides for an arriving update."""

    APPLY = "apply"  # store as pending at ``version``, forward, commit on the successor's ack
    RETRIED = "retried"  # head: a retry of an update committed before: answer its first result (``version``)
    DUPLICATE = "duplicate"  # replica: this version is committed here already: answer OK
    MISSING = "missing"  # replica: a version is missing in between: the predecessor must send the whole chunk
    NOTHING_TO_REMOVE = "nothing to remove"  # replica: a remove of a chunk it does not have: answer OK


@dataclass(frozen=True)
class Decision:
    """An ``admit`` verdict and the version it is about."""

    verdict: Verdict
    version: int  # APPLY: the version to store; RETRIED: the version it committed; otherwise the committed one


def admit(
    place: Place,
    committed: int,
    version: int,
    *,
    full: bool = False,
    same_update: bool | None = None,
    retried_version: int | None = None,
    remove_of_nothing: bool = False,
    recovery_copy: bool = False,
) -> Decision:
    """What a replica does with an update that arrives.

    Args:
        place: whether this replica is the chain's head or a replica after it.
        committed: the chunk's committed version here (0: none).
        version: the update's version as forwarded (replicas; the head assigns its own).
        full: a full-chunk replace (recovery, repair, an answer to MISSING).
        same_update: replica: whether ``version`` was committed here from this very update (update ids); None:
            ids are off or it has none, so the version alone decides.
        retried_version: head: the version this update (by its id) committed before, if it did.
        remove_of_nothing: a remove of a chunk this replica does not have.
        recovery_copy: replica: a sync's or repair's full copy of the predecessor's committed chunk (applies
            whatever version is here: ``decide_forward``).
    """
    if place is Place.HEAD:
        if retried_version is not None:
            return Decision(Verdict.RETRIED, retried_version)
        return Decision(Verdict.APPLY, committed + 1)
    decided = decide_forward(committed, version, full, same_update, recovery_copy=recovery_copy)
    if decided is ForwardDecision.DUPLICATE:
        return Decision(Verdict.DUPLICATE, committed)
    if decided is ForwardDecision.MISSING:
        return Decision(Verdict.MISSING, committed)
    if remove_of_nothing:
        return Decision(Verdict.NOTHING_TO_REMOVE, committed)
    return Decision(Verdict.APPLY, version)


class DamagedBase(enum.Enum):
    """What to do when the committed copy an update applies to fails its checksum."""

    REPAIR_THEN_RETRY = "repair"  # head: rewrite the chunk here and down the chain from a good copy, then admit again
    ASK_WHOLE_CHUNK = "ask"  # replica: answer MISSING_UPDATE; the whole chunk that follows replaces the bad copy


def on_damaged_base(place: Place) -> DamagedBase:
    """The head repairs the chunk from a good copy and admits again; a replica asks for the whole chunk."""
    return DamagedBase.REPAIR_THEN_RETRY if place is Place.HEAD else DamagedBase.ASK_WHOLE_CHUNK


class Step(enum.Enum):
    """What ``forward_step`` decides before a send to the successor."""

    SEND = "send"  # to the next serving or syncing target
    COMMIT = "commit"  # no successor: this is the tail, every update is acknowledged
    NOT_SERVING = "not serving"  # this target may no longer update: what is not acknowledged fails
    NOT_IN_CHAIN = "not in chain"  # routing no longer has this target in the chain: what is not acknowledged fails


def forward_step(may_update: bool, in_chain: bool, has_successor: bool) -> Step:
    """Before each send of what the successor has not acknowledged yet."""
    if not may_update:
        return Step.NOT_SERVING
    if not in_chain:
        return Step.NOT_IN_CHAIN
    return Step.SEND if has_successor else Step.COMMIT


class Answer(enum.Enum):
    """What the successor's answer to one update means here."""

    ACKED = "acked"  # the successor (and the chain after it) committed it: commit here
    SEND_WHOLE_CHUNK = "whole"  # the successor misses a version: send the whole chunk (until the deadline)
    RETRY = "retry"  # refused or lost: send again once routing changes (until the deadline)


def on_answer(ok: bool, missing_update: bool) -> Answer:
    """The successor's answer to one update: ``ok``, or refused with ``missing_update`` or another status."""
    if ok:
        return Answer.ACKED
    return Answer.SEND_WHOLE_CHUNK if missing_update else Answer.RETRY


class AfterFailure(enum.Enum):
    """What to do when storing or committing an update here failed."""

    DROP = "drop"  # drop what was stored; the chain is as before the update, which fails
    DROP_AND_RECOVER = "recover"  # the successor took it: this replica is a version behind, it goes through recovery


def on_failure(successor_took_any: bool) -> AfterFailure:
    """Storing or committing updates here failed (disk full, I/O error, the service stopping)."""
    return AfterFailure.DROP_AND_RECOVER if successor_took_any else AfterFailure.DROP
