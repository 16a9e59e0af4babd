"""Write sessions and the file lengths they bring: open, Close and Sync, lease renewal and collection, Reserve."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import sqlalchemy as sa

from ff_meta.core.errors import FsCode, fs_error
from ff_meta.core.model import NO_LIMIT, Defaults, Inode, QuotaRow, SessionInfo
from ff_meta.core.perms import R, W, allowed, require, require_session_owner
from ff_meta.core.quota import headroom
from ff_meta.store.schema import sessions
from ff_meta.store.tx import Tx, raw_sql


def open_session(
    tx: Tx, inode: Inode, chain: list[QuotaRow], session_id: str, client_id: str, defaults: Defaults, expires_at: float
) -> SessionInfo:
    """Open (or find again, by its id) a write session of the file."""
    if not session_id or not client_id or len(session_id) > 64 or len(client_id) > 64:
        raise fs_error(FsCode.INVALID_ARGUMENT, "a write open needs a session_id and a client_id (at most 64 chars)")
    owner = tx.session_owner(session_id)
    if owner is not None:
        owner_inode, owner_client, write_limit = owner
        if owner_inode != inode.inode_id or owner_client != client_id:
            raise fs_error(FsCode.BAD_SESSION, f"session {session_id} belongs to another file or client")
        have = NO_LIMIT if write_limit is None else write_limit
        return SessionInfo(session_id, client_id, inode.inode_id, have, defaults.lease_s)
    limit = inode.length if chain else None
    tx.insert_session(session_id, client_id, inode, limit, expires_at, chain)
    return SessionInfo(session_id, client_id, inode.inode_id, NO_LIMIT if limit is None else limit, defaults.lease_s)


class SessionRow(NamedTuple):
    """A write session's row (``meta_sessions``)."""

    session_id: str
    inode_id: int
    uid: int
    write_limit: int | None
    reported_length: int
    quota_ids: str
    times_set_at_ns: int | None
    truncated_at_ns: int | None


_RAW_SESSION = raw_sql(f"SELECT {', '.join(SessionRow._fields)} FROM meta_sessions WHERE session_id = ?")


def session_row(tx: Tx, inode_id: int, session_id: str) -> SessionRow:
    """A write session's row, through the cursor.

    The session's row, read through the cursor helpers (so that Close's first check runs on a bare cursor
    on the event loop, without an ORM session: see ``MetaStore.read``).
    """
    rows = tx.fetch_all(_RAW_SESSION, (session_id,))
    if not rows or rows[0][1] != inode_id:
        raise fs_error(FsCode.BAD_SESSION, f"write session {session_id!r} is unknown, closed or collected")
    return SessionRow(*rows[0])


def set_length(
    tx: Tx,
    inode: Inode,
    new_length: int,
    chain: list[QuotaRow],
    *,
    mtime_ns: int | None = None,
    from_reservation: bool = False,
) -> Inode:
    """Adopt a new file length, charging the difference to the quotas (out of the reservation if any)."""
    delta = new_length - inode.length
    if delta:
        if from_reservation:
            tx.quotas.charge(chain, dbytes=delta, dreserved=-delta if delta > 0 else 0, enforce=False)
        else:
            tx.quotas.charge(chain, dbytes=delta, enforce=False)
    values: dict[str, Any] = {"length": new_length}
    if mtime_ns is not None:
        values.update(mtime_ns=mtime_ns, ctime_ns=max(mtime_ns, inode.ctime_ns))
    tx.update(inode.inode_id, **values)
    return inode.with_(**values)


def authorize_finish(tx: Tx, inode_id: int, session_id: str) -> tuple[Inode, Any, bool]:
    """Who may Close or Sync a file.

    As (inode, session row or None, whether the call may change it): the holder of the write session named; without one,
    whoever may reach the file by inode and write it (then only storage's length counts); a reader gets the inode
    unchanged; anyone else is refused.
    """
    inode = tx.must(inode_id)
    if session_id:
        row = session_row(tx, inode_id, session_id)
        require_session_owner(tx.caller, row.uid)
        return inode, row, True
    tx.paths.check_reachable(inode)
    if inode.is_file and allowed(tx.caller, inode, W):
        return inode, None, True
    require(tx.caller, inode, R, f"sync inode {inode_id}")
    return inode, None, False


def storage_answer_stands(asked: Inode | None, now: Inode, storage_length: int | None, known: int) -> bool:
    """Whether storage's length, asked once the file was read as ``asked``, may count for the file as it is ``now``.

    A truncate cuts storage first and then commits the new length (and ctime): an answer asked before the cut and
    committed after it would bring the cut bytes back (as zeros past the new end). An answer that takes the file
    past what meta knows (``known``) stands only if the length and ctime did not change since; otherwise the caller
    asks storage again (``asked`` None: nothing to compare, the answer stands).
    """
    if asked is None or storage_length is None or storage_length <= known:
        return True
    return (asked.length, asked.ctime_ns) == (now.length, now.ctime_ns)


def finish_length(
    tx: Tx,
    inode_id: int,
    session_id: str,
    written: int,
    storage_length: int | None,
    mtime_ns: int | None,
    close: bool,
    *,
    asked: Inode | None = None,
    reported_only: bool = False,
) -> Inode | None:
    """Close or sync: the exact length (storage's answer, never below what meta knew), session ended on close.

    Without a session the caller's hints (written length, mtime) do not count. A session's write time counts
    only if it is later than an explicit mtime set while the session was open (utime after the last write:
    ``cp -p``, ``tar x``), so that a late Close does not put an earlier time back. Nor does the written length of a
    session whose file was truncated while it was open (``truncated_at_ns``: the bytes it wrote before the cut are
    gone, those after it are in storage): storage's answer alone, which the caller then brings.

    None, changing nothing, where storage's answer may predate a truncate (``storage_answer_stands``): ask again.
    ``reported_only`` (a writer's Sync, storage not asked): None, changing nothing, where the session's report does
    not count (none, or its file was cut since): ask storage.
    """
    inode, row, may_change = authorize_finish(tx, inode_id, session_id)
    if not may_change:
        return inode
    if reported_only and (row is None or row.truncated_at_ns is not None):
        return None
    if row is not None and row.truncated_at_ns is not None:
        written = 0
    if row is None:
        written, mtime_ns = 0, None
    elif mtime_ns is not None and row.times_set_at_ns is not None and mtime_ns <= row.times_set_at_ns:
        mtime_ns = None
    if not storage_answer_stands(asked, inode, storage_length, max(inode.length, written)):
        return None
    chain = tx.quotas.of_ids(row.quota_ids) if row is not None else []
    exact = (
        max(inode.length, written, storage_length or 0) if storage_length is not None else max(inode.length, written)
    )
    inode = set_length(tx, inode, exact, chain, mtime_ns=mtime_ns, from_reservation=True)
    if row is not None and close:
        _end_session(tx, inode, row, chain)
        inode = tx.get(inode_id) or inode
    return inode


_RAW_QUEUE_LENGTH_CHECK = raw_sql(
    "INSERT INTO meta_length_checks (inode_id, ended_at, quota_ids) VALUES (?, ?, ?) ON CONFLICT (inode_id) "
    "DO UPDATE SET ended_at = excluded.ended_at, quota_ids = excluded.quota_ids"
)
_RAW_DUE_LENGTH_CHECKS = raw_sql("SELECT inode_id FROM meta_length_checks WHERE ended_at <= ? LIMIT ?")
_RAW_LENGTH_CHECK = raw_sql("SELECT quota_ids FROM meta_length_checks WHERE inode_id = ?")
_RAW_DROP_LENGTH_CHECK = raw_sql("DELETE FROM meta_length_checks WHERE inode_id = ?")


def _end_session(tx: Tx, inode: Inode, row: Any, chain: list[QuotaRow]) -> None:
    """Give back the session's unused reservation; drop it; free the file if that was its last link's holder.

    A session under a byte quota that ends with room left queues a length check (``adopt_checked_length``): its
    writable capability, which names its limit, lets a client write up to it until it expires, and what it writes
    then must count in the quota.
    """
    unused = 0
    if row.write_limit is not None:
        unused = max(0, int(row.write_limit) - max(inode.length, int(row.reported_length)))
        if unused:
            tx.quotas.charge(chain, dreserved=-unused, enforce=False)
    tx.delete_session(row.session_id)
    if inode.nlink == 0 and not tx.has_sessions(inode.inode_id):
        tx.free_file(inode)  # GC removes every chunk, once no capability is left
    elif unused:
        tx.execute(_RAW_QUEUE_LENGTH_CHECK, (inode.inode_id, tx.now_ns / 1e9, row.quota_ids))


def due_length_checks(tx: Tx, ready_before: float, limit: int = 32) -> list[int]:
    """The files queued for a length check before ``ready_before`` (Unix seconds)."""
    return [int(r[0]) for r in tx.fetch_all(_RAW_DUE_LENGTH_CHECKS, (ready_before, limit))]


def adopt_checked_length(tx: Tx, inode_id: int, storage_length: int | None, asked: Inode | None) -> bool:
    """A queued length check: storage's length, where it is past meta's, becomes the file's.

    Charged to the quotas the ended session was under. Whether the check is done (False: kept for a later round).

    Dropped, changing nothing, while the file has write sessions (theirs end by asking storage too, and would give
    back a reservation this had charged as bytes) and when the file is gone (GC removes its chunks).
    """
    rows = tx.fetch_all(_RAW_LENGTH_CHECK, (inode_id,))
    inode = tx.get(inode_id)
    if not rows or inode is None or tx.has_sessions(inode_id):
        tx.execute(_RAW_DROP_LENGTH_CHECK, (inode_id,))
        return bool(rows)
    if storage_length is None or not storage_answer_stands(asked, inode, storage_length, inode.length):
        return False
    if storage_length > inode.length:
        set_length(tx, inode, storage_length, tx.quotas.of_ids(rows[0][0]))
    tx.execute(_RAW_DROP_LENGTH_CHECK, (inode_id,))
    return True


def collect_session(tx: Tx, session_id: str, storage_length: int | None, asked: Inode | None = None) -> bool:
    """End a session whose lease lapsed; its file gets the exact length.

    False if it is gone already, or kept for a later round where storage's answer may predate a truncate
    (``storage_answer_stands``).
    """
    row = tx.session.execute(sa.select(sessions).where(sessions.c.session_id == session_id)).first()
    if row is None:
        return False
    inode = tx.get(row.inode_id)
    if inode is None:
        tx.session.execute(sa.delete(sessions).where(sessions.c.session_id == session_id))
        return True
    reported = int(row.reported_length) if row.truncated_at_ns is None else 0  # cut since: storage's answer alone
    if not storage_answer_stands(asked, inode, storage_length, max(inode.length, reported)):
        return False
    chain = tx.quotas.of_ids(row.quota_ids)
    exact = max(inode.length, reported, storage_length or 0)
    inode = set_length(tx, inode, exact, chain, from_reservation=True)
    _end_session(tx, inode, row, chain)
    return True


def expired_sessions(tx: Tx, limit: int = 100) -> list[tuple[str, int]]:
    """(session id, inode id) of write sessions whose lease lapsed (the oldest first is not promised)."""
    q = sa.select(sessions.c.session_id, sessions.c.inode_id).where(sessions.c.lease_expires_at < tx.now_ns / 1e9)
    return [(r.session_id, r.inode_id) for r in tx.session.execute(q.limit(limit))]


def renew(tx: Tx, client_id: str, reports: Sequence[tuple[str, int, int]], expires_at: float) -> list[str]:
    """Extend every session of ``client_id``; adopt larger reported lengths. Returns lost session ids.

    The client's sessions are read in one query (not one per report), so a report of thousands costs little.
    """
    q = sa.update(sessions).where(sessions.c.client_id == client_id)
    if not tx.caller.is_root:
        q = q.where(sessions.c.uid == tx.caller.uid)
    tx.session.execute(q.values(lease_expires_at=expires_at))
    mine = tx.session.execute(sa.select(sessions).where(sessions.c.client_id == client_id)).all()
    rows = {r.session_id: r for r in mine if tx.caller.is_root or r.uid == tx.caller.uid}
    lost = []
    for session_id, inode_id, written in reports:
        row = rows.get(session_id)
        if row is None or row.inode_id != inode_id:
            lost.append(session_id)
            continue
        if written <= row.reported_length:  # meta knows the file is at least this long
            continue
        if row.truncated_at_ns is not None:  # cut while open: its Sync or Close brings storage's length
            continue
        tx.session.execute(
            sa.update(sessions).where(sessions.c.session_id == session_id).values(reported_length=written)
        )
        inode = tx.get(inode_id)
        if inode is not None and written > inode.length:
            # The write time is unknown here: meta's clock, unless an explicit mtime was set meanwhile (then the
            # session's Close or Sync brings the time of its last write, which counts if later).
            mtime_ns = tx.now_ns if row.times_set_at_ns is None else None
            set_length(tx, inode, written, tx.quotas.of_ids(row.quota_ids), mtime_ns=mtime_ns, from_reservation=True)
    return lost


def reserve(tx: Tx, inode_id: int, session_id: str, want: int, partial: bool = False) -> tuple[int, int]:
    """Raise a write session's limit to ``want`` (all or nothing, or with ``partial`` as far as the quotas allow).

    Returns (the session's limit, bytes the quotas would still grant).
    """
    row = session_row(tx, inode_id, session_id)
    require_session_owner(tx.caller, row.uid)
    if row.write_limit is None:
        return NO_LIMIT, NO_LIMIT
    chain = tx.quotas.of_ids(row.quota_ids)
    have = int(row.write_limit)
    if want <= have:
        return have, headroom(chain)
    inode = tx.must(inode_id)
    base = max(have, inode.length)  # the reservation covers what lies past the file's end
    grow = max(0, want - base)
    if partial:
        grow = min(grow, headroom(chain))
        want = base + grow
        if want <= have:
            raise fs_error(FsCode.QUOTA_EXCEEDED, f"byte quota above inode {inode_id} exhausted")
    tx.quotas.charge(chain, dreserved=grow)
    tx.session.execute(sa.update(sessions).where(sessions.c.session_id == session_id).values(write_limit=want))
    return want, headroom(tx.quotas.of_ids(row.quota_ids))
