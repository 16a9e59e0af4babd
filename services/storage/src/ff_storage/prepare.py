"""How the CRAQ write path decides each update of a round and builds its new content (``prepare``).

At the head and at the replicas, before anything is stored: whether an update is a retry of one already
committed, a duplicate, a missing one, or a removal of nothing (its result is set then); else its version and
the chunk's content after it, from the committed copy. At the head, a run of writes to one chunk becomes one
version (``_prepare_merged``). ``writes.ChainWriter`` calls it for each round (``_prepared``), on its event
loop or in a worker thread: it reads committed chunks and touches no event loop.
"""

from __future__ import annotations

from ff_fsprotocol.checksum import crc32c_of
from ff_storage.core import craq
from ff_storage.core.chunks import UpdateRecord, apply_truncate, apply_write, apply_writes
from ff_storage.core.errors import ChunkCorrupt
from ff_storage.core.requests import Payload, UpdateKind
from ff_storage.core.results import IoStatus, UpdateResult
from ff_storage.node_state import Target, Update, result_of
from ff_storage.rounds import first_copies


def prepare(target: Target, updates: list[Update], at_head: bool, update_ids: bool) -> list[Update]:
    """Decide each update and compute its new content; returns the ones to store and pass on.

    The others have their result set (already committed, duplicate, missing update, corrupt base chunk:
    ``corrupt`` set, the caller repairs; nothing to remove). It reads committed chunks and touches no event
    loop: ``ChainWriter._prepared`` runs it on the loop or in a worker thread. ``update_ids``: the node's
    ``config.update_ids``.
    """
    place = craq.Place.HEAD if at_head else craq.Place.REPLICA
    ready: list[Update] = []
    for u in updates:
        meta = target.engine.get(u.key)
        committed = meta.committed_version if meta else 0
        if u.members is not None:
            if _prepare_merged(target, u, committed, update_ids):
                ready.append(u)
            continue
        retried = _already_committed(target, u, update_ids) if at_head else None
        same = None if at_head else _same_update(target, u, committed, update_ids)
        decision = craq.admit(
            place,
            committed,
            u.version,
            full=u.full,
            recovery_copy=u.no_forward and u.full,
            same_update=same,
            retried_version=retried.version if retried else None,
            remove_of_nothing=u.kind is UpdateKind.REMOVE and meta is None,
        )
        verdict = decision.verdict
        if verdict is craq.Verdict.RETRIED and retried is not None:  # its first result
            u.result = UpdateResult(IoStatus.OK, "already committed", retried.version, retried.length, retried.checksum)
            continue
        if verdict is craq.Verdict.DUPLICATE:
            u.result = result_of(IoStatus.OK, "duplicate", committed, meta)
            continue
        if verdict is craq.Verdict.MISSING:
            missing = f"have version {committed}, got {u.version}"
            u.result = result_of(IoStatus.MISSING_UPDATE, missing)
            continue
        if verdict is craq.Verdict.NOTHING_TO_REMOVE:
            u.result = result_of(IoStatus.OK, "already removed")
            continue
        u.version = decision.version
        try:
            u.content = _new_content(target, u)
        except ChunkCorrupt as exc:
            repair = craq.on_damaged_base(place) is craq.DamagedBase.REPAIR_THEN_RETRY  # else: ask for the whole
            status = IoStatus.CHECKSUM_MISMATCH if repair else IoStatus.MISSING_UPDATE
            u.result, u.corrupt = result_of(status, str(exc)), True
            continue
        if u.content is not None:
            u.content_checksum = u.data_checksum if u.content is u.data else None
            if u.content_checksum is None:
                u.content_checksum = crc32c_of(u.content)
        ready.append(u)
    return ready


def _prepare_merged(target: Target, u: Update, committed: int, update_ids: bool) -> bool:
    """At the head, a run of writes to one chunk (``u.members``) as one version: whether ``u`` is to store.

    A member committed before (a retry) gets its first result; the others apply in order over the committed
    copy, and ``u`` becomes one write of the span they cover (from the first byte any of them writes to the last),
    cut from the result, carrying the chunk's records with their ids (each replica keeps them in place of its
    own, as a full-chunk replace's), so a retry of any of them at any replica is known. One round trip of the
    chain for the run, where each write took its own: a database's flush writes a few pages here and there in a
    chunk, each a durable chain write in turn. The replicas apply the span over the same committed copy.
    """
    assert u.members is not None
    todo: list[Update] = []
    for m in u.members:
        retried = _already_committed(target, m, update_ids)
        if retried is None:
            todo.append(m)
        else:  # its first result
            m.result = UpdateResult(IoStatus.OK, "already committed", retried.version, retried.length, retried.checksum)
    u.members = todo
    if not todo:
        return False
    try:
        current = target.engine.read_committed(u.key)
    except ChunkCorrupt as exc:  # the head's copy is bad: repaired, then prepared again (``ChainWriter._head_round``)
        u.result, u.corrupt = result_of(IoStatus.CHECKSUM_MISMATCH, str(exc)), True
        return False
    writes = first_copies(todo)
    content = apply_writes(current[1] if current else None, writes)
    checksum = crc32c_of(content)
    lo, hi = min(at for at, _ in writes), max(at + len(data) for at, data in writes)
    u.version = craq.admit(craq.Place.HEAD, committed, 0).version
    u.offset, u.data = lo, memoryview(content)[lo:hi]
    u.length, u.data_checksum = hi - lo, crc32c_of(u.data)
    u.content, u.content_checksum = content, checksum
    u.update_id = todo[0].update_id
    ids = [m.update_id for m in todo if m.update_id is not None]
    u.records = target.engine.records_after(u.key, ids, u.version, len(content), checksum)
    return True


def _already_committed(target: Target, u: Update, update_ids: bool) -> UpdateRecord | None:
    if not update_ids or u.update_id is None:
        return None
    return target.engine.find_update(u.key, u.update_id)


def _same_update(target: Target, u: Update, committed: int, update_ids: bool) -> bool | None:
    """Whether this replica committed ``u.version`` from this very update.

    None: ids off, or the update has none, so the version alone decides. The id must have made that version here,
    and made the chunk ``u`` makes: a merged run (it carries its records) made one version of every write of the run,
    so a run is the same only where the chunk it made (its record's length and checksum) is the one committed here
    (not a version its first id made with fewer writes); a single write is the same only where it made the version
    alone (not as one of a merged run that had other writes too: a retried write that the head now applies alone).
    """
    if not update_ids or u.update_id is None or u.full or u.version > committed:
        return None
    record = target.engine.find_update(u.key, u.update_id)
    if record is None or record.version != u.version:
        return False
    if u.records:
        sent = next((r for r in u.records if r.update_id == u.update_id), None)
        return sent is not None and (sent.version, sent.length, sent.checksum) == (
            record.version,
            record.length,
            record.checksum,
        )
    return not any(r.version == u.version and r.update_id != u.update_id for r in target.engine.recent_updates(u.key))


def _new_content(target: Target, u: Update) -> Payload | None:
    if u.kind is UpdateKind.REMOVE:
        return None
    if u.full:
        return u.data
    if u.kind is UpdateKind.WRITE and u.offset == 0 and u.length == u.chunk_size:
        return u.data  # whole chunk: no need to read the old one
    current = target.engine.read_committed(u.key)
    old = current[1] if current else None
    if u.kind is UpdateKind.TRUNCATE:
        return apply_truncate(old, u.length)
    return apply_write(old, u.offset, u.data)
