"""The file-system operations as transaction bodies over the INOD/DENT tables.

Every public function here takes a ``Tx`` (one serializable transaction, run by ``MetaStore`` and
re-run on conflict) and does only reads and writes through it: no RPCs, no clocks of its own (the
caller passes ``now_ns``), so a re-run is harmless. The rules come from ``core`` (``tx.paths``,
``tx.quotas``, ``core.perms``, ``core.layout``); storage work (exact lengths, chunk removal) is done by
the operators (``ops/``) around these transactions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import sqlalchemy as sa

from ff_meta.core.errors import FsCode, FsError, fs_error
from ff_meta.core.layout import check_chunk_size, choose_layout
from ff_meta.core.model import (
    DEVICE_TYPES,
    NO_LIMIT,
    ROOT_INODE_ID,
    SPECIAL_TYPES,
    AttrChange,
    Defaults,
    DirEntry,
    Inode,
    InodeType,
    LayoutSpec,
    PathAt,
    QuotaRow,
    SessionInfo,
    inode_type_of,
)
from ff_meta.core.paths import MAX_DIR_DEPTH, check_name, join, split_path
from ff_meta.core.perms import (
    R,
    W,
    X,
    allowed,
    check_sticky,
    checked_mode,
    checked_owner,
    require,
    require_owner,
    require_session_owner,
)
from ff_meta.core.quota import headroom
from ff_meta.core.resolve import Resolved
from ff_meta.store.listing import ListingCache
from ff_meta.store.schema import inodes, quotas, sessions, trash, truncates
from ff_meta.store.tx import MAX_LINKS, SELECT_INODE_COLS, Tx, inode_of_tuple, raw_sql

_SCAN = f"SELECT d.name, {SELECT_INODE_COLS} FROM meta_dirents d JOIN meta_inodes i ON i.inode_id = d.inode_id "
_RAW_SCAN = raw_sql(_SCAN + "WHERE d.parent_id = ? ORDER BY d.name LIMIT ?")
_RAW_SCAN_AFTER = raw_sql(_SCAN + "WHERE d.parent_id = ? AND d.name > ? ORDER BY d.name LIMIT ?")
_RAW_LIST = raw_sql("SELECT name, inode_id, type FROM meta_dirents WHERE parent_id = ? ORDER BY name LIMIT ?")
_RAW_LIST_AFTER = raw_sql(
    "SELECT name, inode_id, type FROM meta_dirents WHERE parent_id = ? AND name > ? ORDER BY name LIMIT ?"
)


# ---- inode allocation ----


_RAW_NEXT_ID = raw_sql("SELECT value FROM meta_counters WHERE name = 'next_inode_id'")
_RAW_SET_NEXT_ID = raw_sql("UPDATE meta_counters SET value = ? WHERE name = 'next_inode_id'")


def allocate_ids(tx: Tx, count: int) -> int:
    """Reserve ``count`` consecutive inode ids; returns the first."""
    [(first,)] = tx.fetch_all(_RAW_NEXT_ID, ())
    tx.execute(_RAW_SET_NEXT_ID, (int(first) + count,))
    return int(first)


# ---- operations ----


def stat(tx: Tx, at: PathAt, follow_last: bool) -> Inode:
    """The inode a path names."""
    inode = tx.paths.existing(at, follow_last=follow_last).inode
    assert inode is not None
    return inode


def stat_with_sessions(tx: Tx, at: PathAt, follow_last: bool) -> tuple[Inode, int]:
    """The inode and, for a file, how many write sessions it has open."""
    inode = stat(tx, at, follow_last)
    return inode, (tx.count_sessions(inode.inode_id) if inode.is_file else 0)


def batch_stat(tx: Tx, ats: Sequence[PathAt | FsError], follow_last: bool) -> list[Inode | FsError]:
    """Each path's inode or error (an FsError given in place of a path is its answer)."""
    tx.paths.cache_walks = True  # read only: a directory walked for one path is the same for the next
    out: list[Inode | FsError] = []
    for at in ats:
        if isinstance(at, FsError):
            out.append(at)
            continue
        try:
            out.append(stat(tx, at, follow_last))
        except FsError as err:
            out.append(err)
    return out


def new_parent(tx: Tx, r: Resolved, what: str) -> Inode:
    """The directory a new entry goes in; the name checked; W and X on it."""
    if r.inode is not None:
        raise fs_error(FsCode.EXISTS, f"{what}: file exists")
    if r.parent is None:
        raise fs_error(FsCode.EXISTS, f"{what}: file exists")
    check_name(r.name)
    require(tx.caller, r.parent, W | X, f"create in {what}")
    return r.parent


def create(
    tx: Tx,
    at: PathAt,
    mode: int,
    exclusive: bool,
    write: bool,
    layout: LayoutSpec | None,
    inode_id: int,
    defaults: Defaults,
    session: tuple[str, str] = ("", ""),
) -> tuple[Inode, bool, list[QuotaRow]]:
    """Create a file (or find the existing one). Returns (inode, created, quota chain of its directory).

    A symlink as the last component is followed (a dangling one creates its target), except with ``exclusive``:
    then any existing entry, a symlink included, is EEXIST (POSIX O_CREAT|O_EXCL), unless the file holds the write
    session this Create opens (``session``: its id and the client's): then an earlier attempt of this very Create
    made it, and the client, which never got that answer, sends it again; it gets the same answer.
    """
    r = tx.paths.resolve(at, follow_last=False)
    if r.inode is not None and r.inode.is_symlink:
        if exclusive:
            raise fs_error(FsCode.EXISTS, f"{at.path}: file exists")
        r = tx.paths.resolve(at, follow_last=True)
    if r.inode is not None:
        if exclusive and _holds_session(tx, r.inode, *session):
            return r.inode, True, tx.quotas.chain(tx.paths.folder_of(r))
        if exclusive:
            raise fs_error(FsCode.EXISTS, f"{at.path}: file exists")
        if r.inode.is_dir:
            raise fs_error(FsCode.IS_DIRECTORY, f"{at.path}: is a directory")
        require(tx.caller, r.inode, W if write else R, f"open {at.path}")
        return r.inode, False, tx.quotas.chain(tx.paths.folder_of(r))
    parent = new_parent(tx, r, at.path)
    chain = tx.quotas.chain(parent)
    tx.quotas.charge(chain, dinodes=1)
    inode = Inode(
        inode_id=inode_id,
        type=InodeType.FILE,
        mode=mode & 0o7777,
        uid=tx.caller.uid,
        gid=tx.caller.gid,
        nlink=1,
        atime_ns=tx.now_ns,
        mtime_ns=tx.now_ns,
        ctime_ns=tx.now_ns,
        **choose_layout(parent, layout, defaults, inode_id),
    )
    tx.insert(inode)
    tx.link(parent.inode_id, r.name, inode)
    return inode, True, chain


def _holds_session(tx: Tx, inode: Inode, session_id: str, client_id: str) -> bool:
    """Whether the file holds the write session ``session_id`` of ``client_id``."""
    owner = tx.session_owner(session_id) if session_id else None
    return owner is not None and (owner[0], owner[1]) == (inode.inode_id, client_id)


def open_file(tx: Tx, at: PathAt, write: bool, read: bool) -> tuple[Inode, list[QuotaRow]]:
    """Open a file: its inode, and for a write the quota chain of its folder."""
    r = tx.paths.existing(at, follow_last=True)
    inode = r.inode
    assert inode is not None
    if inode.is_dir and write:
        raise fs_error(FsCode.IS_DIRECTORY, f"{at.path}: is a directory")
    want = (R if read else 0) | (W if write else 0)
    require(tx.caller, inode, want or R, f"open {at.path}")
    return inode, (tx.quotas.chain(tx.paths.folder_of(r)) if write else [])


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


def _session(tx: Tx, inode_id: int, session_id: str) -> SessionRow:
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
        row = _session(tx, inode_id, session_id)
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
) -> Inode | None:
    """Close or sync: the exact length (storage's answer, never below what meta knew), session ended on close.

    Without a session the caller's hints (written length, mtime) do not count. A session's write time counts
    only if it is later than an explicit mtime set while the session was open (utime after the last write:
    ``cp -p``, ``tar x``), so that a late Close does not put an earlier time back. Nor does the written length of a
    session whose file was truncated while it was open (``truncated_at_ns``: the bytes it wrote before the cut are
    gone, those after it are in storage): storage's answer alone, which the caller then brings.

    None, changing nothing, where storage's answer may predate a truncate (``storage_answer_stands``): ask again.
    """
    inode, row, may_change = authorize_finish(tx, inode_id, session_id)
    if not may_change:
        return inode
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


def _end_session(tx: Tx, inode: Inode, row: Any, chain: list[QuotaRow]) -> None:
    if row.write_limit is not None:
        unused = max(0, int(row.write_limit) - max(inode.length, int(row.reported_length)))
        if unused:
            tx.quotas.charge(chain, dreserved=-unused, enforce=False)
    tx.delete_session(row.session_id)
    if inode.nlink == 0 and not tx.has_sessions(inode.inode_id):
        tx.free_file(inode)


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
    row = _session(tx, inode_id, session_id)
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


@dataclass
class _Above:
    """Quota ids and depth of the directories one Mkdirs creates in.

    So that a deep ``mkdir -p`` walks up the tree once, not once per new level (which made it quadratic).
    """

    tx: Tx
    known: dict[int, tuple[list[int], int]] = field(default_factory=dict)

    def of(self, d: Inode) -> tuple[list[int], int]:
        if d.inode_id not in self.known:
            ids = [int(r[0]) for r in self.tx.paths.ancestry(d.inode_id)]
            quota_ids = [q.inode_id for q in self.tx.quotas.chain_of(ids)]
            self.known[d.inode_id] = (quota_ids, len(ids) - 1)
        return self.known[d.inode_id]

    def created(self, parent: Inode, child: Inode) -> None:
        quota_ids, depth = self.of(parent)
        self.known[child.inode_id] = (quota_ids, depth + 1)


def mkdirs(tx: Tx, at: PathAt, mode: int, recursive: bool, layout: LayoutSpec | None, ids: list[int]) -> Inode:
    """Mkdir (-p).

    ``ids`` are pre-allocated inode ids, one per directory that may be created. Linear in the number of components (at
    most ``MAX_PATH_COMPONENTS``); no directory deeper than ``MAX_DIR_DEPTH``.
    """
    absolute, parts = split_path(at.path)
    above = _Above(tx)
    if not recursive:
        return _mkdir_one(tx, tx.paths.resolve(at, follow_last=False), at.path, mode, layout, ids[0], above)
    # mkdir -p: walk down, creating what is missing.
    base = PathAt(at.parent_id if not absolute else ROOT_INODE_ID, "/" if absolute else "")
    cur = tx.paths.resolve(base, follow_last=True).inode
    assert cur is not None
    for i, comp in enumerate(parts):
        r = tx.paths.resolve(PathAt(cur.inode_id, comp), follow_last=True, reached=True)
        if r.inode is None:
            r.inode = _mkdir_one(
                tx, r, "/".join(parts[: i + 1]), mode, layout if i == len(parts) - 1 else None, ids[i], above
            )
        elif not r.inode.is_dir:
            raise fs_error(
                FsCode.NOT_DIRECTORY if i < len(parts) - 1 else FsCode.EXISTS,
                f"{'/'.join(parts[: i + 1])!r} exists and is not a directory",
            )
        cur = r.inode
    return cur


def _mkdir_one(
    tx: Tx, r: Resolved, what: str, mode: int, layout: LayoutSpec | None, inode_id: int, above: _Above
) -> Inode:
    parent = new_parent(tx, r, what)
    quota_ids, depth = above.of(parent)
    if depth + 1 > MAX_DIR_DEPTH:
        raise fs_error(FsCode.NAME_TOO_LONG, f"{what}: directories nest at most {MAX_DIR_DEPTH} levels deep")
    tx.quotas.charge(tx.quotas.chain_of(quota_ids), dinodes=1)
    spec = layout or LayoutSpec(parent.chain_table_id, parent.chunk_size, parent.stripe_size)
    if spec.chunk_size:
        check_chunk_size(spec.chunk_size)
    inode = Inode(
        inode_id=inode_id,
        type=InodeType.DIRECTORY,
        mode=mode & 0o7777,
        uid=tx.caller.uid,
        gid=tx.caller.gid,
        nlink=1,
        atime_ns=tx.now_ns,
        mtime_ns=tx.now_ns,
        ctime_ns=tx.now_ns,
        parent_id=parent.inode_id,
        chain_table_id=spec.chain_table_id,
        chunk_size=spec.chunk_size,
        stripe_size=spec.stripe_size,
    )
    tx.insert(inode)
    tx.link(parent.inode_id, r.name, inode)
    above.created(parent, inode)
    return inode


def symlink(tx: Tx, at: PathAt, target: str, inode_id: int) -> Inode:
    """Make a symbolic link."""
    if not target or "\0" in target or len(target.encode()) > 4096:
        raise fs_error(FsCode.INVALID_ARGUMENT, "a symlink target is 1-4096 bytes without NUL")
    r = tx.paths.resolve(at, follow_last=False)
    parent = new_parent(tx, r, at.path)
    tx.quotas.charge(tx.quotas.chain(parent), dinodes=1)
    inode = Inode(
        inode_id=inode_id,
        type=InodeType.SYMLINK,
        mode=0o777,
        uid=tx.caller.uid,
        gid=tx.caller.gid,
        nlink=1,
        atime_ns=tx.now_ns,
        mtime_ns=tx.now_ns,
        ctime_ns=tx.now_ns,
        length=len(target.encode()),
        symlink_target=target,
    )
    tx.insert(inode)
    tx.link(parent.inode_id, r.name, inode)
    return inode


def mknod(tx: Tx, at: PathAt, kind: InodeType, mode: int, rdev: int, inode_id: int) -> Inode:
    """A FIFO, socket or device node: an inode without data or layout (a device's number in ``rdev``)."""
    if kind not in SPECIAL_TYPES:
        raise fs_error(FsCode.INVALID_ARGUMENT, f"mknod makes FIFOs, sockets and devices, not type {int(kind)}")
    if not 0 <= rdev < 1 << 63 or (rdev and kind not in DEVICE_TYPES):
        raise fs_error(FsCode.INVALID_ARGUMENT, "a device number (below 2^63) belongs to a device node only")
    if kind in DEVICE_TYPES and not tx.caller.is_root:
        raise fs_error(FsCode.NOT_PERMITTED, f"mknod {at.path}: only root makes device nodes (as CAP_MKNOD)")
    r = tx.paths.resolve(at, follow_last=False)
    parent = new_parent(tx, r, at.path)
    tx.quotas.charge(tx.quotas.chain(parent), dinodes=1)
    inode = Inode(
        inode_id=inode_id,
        type=kind,
        mode=mode & 0o7777,
        uid=tx.caller.uid,
        gid=tx.caller.gid,
        nlink=1,
        atime_ns=tx.now_ns,
        mtime_ns=tx.now_ns,
        ctime_ns=tx.now_ns,
        rdev=rdev,
    )
    tx.insert(inode)
    tx.link(parent.inode_id, r.name, inode)
    return inode


def hardlink(tx: Tx, old: PathAt, new: PathAt) -> Inode:
    """Give a file another name."""
    src = tx.paths.existing(old, follow_last=False).inode
    assert src is not None
    if src.is_dir:
        raise fs_error(FsCode.NOT_PERMITTED, f"{old.path}: hard link to a directory")
    if src.nlink >= MAX_LINKS:
        raise fs_error(FsCode.TOO_MANY_LINKS, f"{old.path}: too many links")
    r = tx.paths.resolve(new, follow_last=False)
    parent = new_parent(tx, r, new.path)
    tx.link(parent.inode_id, r.name, src)
    tx.update(src.inode_id, nlink=src.nlink + 1, ctime_ns=tx.now_ns)
    return src.with_(nlink=src.nlink + 1, ctime_ns=tx.now_ns)


def _removable(tx: Tx, r: Resolved, what: str) -> tuple[Inode, Inode]:
    if r.inode is None:
        raise fs_error(FsCode.NOT_FOUND, f"no such file or directory: {what}")
    if r.parent is None:
        raise fs_error(FsCode.BUSY if r.name != ".." else FsCode.INVALID_ARGUMENT, f"cannot remove {what or '/'}")
    if r.name in (".", ".."):
        raise fs_error(FsCode.INVALID_ARGUMENT, f"cannot remove {what}")
    require(tx.caller, r.parent, W | X, f"remove {what}")
    check_sticky(tx.caller, r.parent, r.inode, f"remove {what}")
    return r.inode, r.parent


def remove(
    tx: Tx,
    at: PathAt,
    recursive: bool,
    to_trash: bool,
    retention_s: float,
    trash_id: str,
    expect_dir: bool | None = None,
) -> str:
    """Unlink/rmdir, or move to the trash. Returns the trash id ("" when unlinked)."""
    r = tx.paths.resolve(at, follow_last=False)
    inode, parent = _removable(tx, r, at.path)
    if expect_dir is True and not inode.is_dir:
        raise fs_error(FsCode.NOT_DIRECTORY, f"{at.path}: not a directory")
    if expect_dir is False and inode.is_dir:
        raise fs_error(FsCode.IS_DIRECTORY, f"{at.path}: is a directory")
    if inode.is_dir and not recursive and tx.has_children(inode.inode_id):
        raise fs_error(FsCode.NOT_EMPTY, f"{at.path}: directory not empty")
    chain = tx.quotas.chain(parent)
    if recursive or to_trash:
        path = join(tx.paths.path_of(parent), r.name)
        dbytes, dinodes = tx.subtree_usage(inode) if chain else (0, 0)
        tx.quotas.charge(chain, dbytes=-dbytes, dinodes=-dinodes, enforce=False)
        tx.unlink_entry(parent.inode_id, r.name)
        if inode.is_dir:
            tx.update(inode.inode_id, parent_id=0, ctime_ns=tx.now_ns)
        tx.session.execute(
            sa.insert(trash).values(
                trash_id=trash_id,
                inode_id=inode.inode_id,
                type=int(inode.type),
                uid=tx.caller.uid,
                original_path=path,
                removed_at_ns=tx.now_ns,
                expires_at_ns=tx.now_ns + int(retention_s * 1e9),
            )
        )
        return trash_id
    _uncharge_entry(tx, chain, inode)
    tx.unlink_entry(parent.inode_id, r.name)
    tx.drop_link(inode)
    return ""


def _uncharge_entry(tx: Tx, chain: list[QuotaRow], inode: Inode) -> None:
    """An entry of ``inode`` goes: its usage leaves the quotas with its last link (a folder has one name).

    Any inode but a folder may have several names (link(2) does not follow a symlink), and a link adds no usage.
    """
    if inode.is_dir or inode.nlink <= 1:
        tx.quotas.charge(chain, dbytes=-inode.length if inode.is_file else 0, dinodes=-1, enforce=False)


def rename(tx: Tx, src: PathAt, dst: PathAt, no_replace: bool) -> Inode:  # noqa: PLR0912
    """Move an entry to another name, as the rename system call; usage moves between quota trees."""
    rs = tx.paths.resolve(src, follow_last=False)
    moved, sparent = _removable(tx, rs, src.path)
    rd = tx.paths.resolve(dst, follow_last=False)
    if rd.parent is None:
        raise fs_error(FsCode.BUSY if rd.name != ".." else FsCode.INVALID_ARGUMENT, f"cannot rename onto {dst.path}")
    check_name(rd.name)
    dparent = rd.parent
    require(tx.caller, dparent, W | X, f"rename into {dst.path}")
    target = rd.inode
    if target is not None and target.inode_id == moved.inode_id:
        return moved  # the same file: nothing to do (POSIX)
    if target is not None:
        if no_replace:
            raise fs_error(FsCode.EXISTS, f"{dst.path}: file exists")
        check_sticky(tx.caller, dparent, target, f"replace {dst.path}")
        if moved.is_dir and not target.is_dir:
            raise fs_error(FsCode.NOT_DIRECTORY, f"{dst.path}: not a directory")
        if not moved.is_dir and target.is_dir:
            raise fs_error(FsCode.IS_DIRECTORY, f"{dst.path}: is a directory")
        if target.is_dir and tx.has_children(target.inode_id):
            raise fs_error(FsCode.NOT_EMPTY, f"{dst.path}: directory not empty")
    if moved.is_dir:
        if dparent.inode_id != sparent.inode_id:
            require(tx.caller, moved, W, f"move directory {src.path}")  # its ".." changes
        above = tx.paths.ancestors(dparent)
        if moved.inode_id in above:
            raise fs_error(FsCode.RENAME_LOOP, f"cannot move {src.path} into itself ({dst.path})")
        if len(above) > MAX_DIR_DEPTH:
            raise fs_error(FsCode.NAME_TOO_LONG, f"{dst.path}: directories nest at most {MAX_DIR_DEPTH} levels deep")
    src_chain, dst_chain = tx.quotas.chain(sparent), tx.quotas.chain(dparent)
    if target is not None:
        _uncharge_entry(tx, dst_chain, target)
        tx.unlink_entry(dparent.inode_id, rd.name)
        tx.drop_link(target)
    src_ids = {q.inode_id for q in src_chain}
    dst_ids = {q.inode_id for q in dst_chain}
    if src_ids != dst_ids:
        dbytes, dinodes = tx.subtree_usage(moved)
        tx.quotas.charge([q for q in dst_chain if q.inode_id not in src_ids], dbytes=dbytes, dinodes=dinodes)
        tx.quotas.charge(
            [q for q in src_chain if q.inode_id not in dst_ids], dbytes=-dbytes, dinodes=-dinodes, enforce=False
        )
    tx.unlink_entry(sparent.inode_id, rs.name)
    tx.link(dparent.inode_id, rd.name, moved)
    values: dict[str, Any] = {"ctime_ns": tx.now_ns}
    if moved.is_dir:
        values["parent_id"] = dparent.inode_id
    tx.update(moved.inode_id, **values)
    return moved.with_(**values)


def list_dir(
    tx: Tx, at: PathAt, page_size: int, after: str, with_inodes: bool, cache: ListingCache | None = None
) -> tuple[list[DirEntry], str]:
    """A page of a directory's entries by name (with their inodes when asked), and the name to list after next.

    A names-only page comes from ``cache`` when it holds the page at the directory's ``entries_version`` as this
    transaction reads it (the walk and the permission checks are made every time), and is put there otherwise: the
    version and the entries are read in one snapshot, so the page is right whatever becomes of this (read) transaction.
    """
    d = tx.paths.existing(at, follow_last=True).inode
    assert d is not None
    if not d.is_dir:
        raise fs_error(FsCode.NOT_DIRECTORY, f"{at.path}: not a directory")
    # the entries' attributes are what a stat of each would show, which needs search permission on the folder
    require(tx.caller, d, R | X if with_inodes else R, f"list {at.path}" + (" with attributes" if with_inodes else ""))
    if not with_inodes:
        key = (d.inode_id, d.entries_version, after, page_size)
        known = cache.get(key) if cache is not None else None
        if known is not None:
            return known
        sql = _RAW_LIST_AFTER if after else _RAW_LIST
        rows = tx.fetch_all(sql, (d.inode_id, after, page_size + 1) if after else (d.inode_id, page_size + 1))
        names: list[DirEntry] = [(r[0], r[1], inode_type_of(r[2]), None) for r in rows[:page_size]]
        last = rows[page_size - 1][0] if len(rows) > page_size else ""
        if cache is not None:
            cache.put(key, names, last)
        return names, last
    sql = _RAW_SCAN_AFTER if after else _RAW_SCAN
    full = tx.fetch_all(sql, (d.inode_id, after, page_size + 1) if after else (d.inode_id, page_size + 1))
    out: list[DirEntry] = []
    for row in full[:page_size]:
        node = inode_of_tuple(row[1:])
        out.append((row[0], node.inode_id, node.type, node))
    return out, (full[page_size - 1][0] if len(full) > page_size else "")


def truncate_check(tx: Tx, at: PathAt, session_id: str) -> Inode:
    """Whether the caller may truncate the file: its inode."""
    r = tx.paths.existing(at, follow_last=True)
    inode = r.inode
    assert inode is not None
    if inode.is_dir:
        raise fs_error(FsCode.IS_DIRECTORY, f"{at.path}: is a directory")
    if not inode.is_file:
        raise fs_error(FsCode.INVALID_ARGUMENT, f"{at.path}: not a regular file")
    if not session_id:
        require(tx.caller, inode, W, f"truncate {at.path}")
    else:
        require_session_owner(tx.caller, _session(tx, inode.inode_id, session_id).uid)
    return inode


_RAW_FORGET_TRUNCATE = raw_sql("DELETE FROM meta_truncates WHERE inode_id = ?")
_RAW_NOTE_TRUNCATE = raw_sql("INSERT INTO meta_truncates (inode_id, length, started_at_ns) VALUES (?, ?, ?)")
_RAW_TRUNCATE_DONE = raw_sql("DELETE FROM meta_truncates WHERE inode_id = ? AND length = ?")


def record_truncate(tx: Tx, inode_id: int, length: int) -> None:
    """Note a shrinking truncate before storage cuts its chunks (finished from here if a crash cuts it short)."""
    tx.execute(_RAW_FORGET_TRUNCATE, (inode_id,))
    tx.execute(_RAW_NOTE_TRUNCATE, (inode_id, length, tx.now_ns))


def pending_truncates(tx: Tx, started_before_ns: int, limit: int = 100) -> list[tuple[int, int]]:
    """(inode id, length) of the truncates noted before ``started_before_ns`` and never committed."""
    q = sa.select(truncates.c.inode_id, truncates.c.length).where(truncates.c.started_at_ns < started_before_ns)
    return [(int(r.inode_id), int(r.length)) for r in tx.session.execute(q.limit(limit))]


def forget_truncate(tx: Tx, inode_id: int) -> None:
    """Drop a noted truncate whose file is gone."""
    tx.execute(_RAW_FORGET_TRUNCATE, (inode_id,))


def truncate_commit(tx: Tx, at: PathAt, length: int, session_id: str, cut: bool = True) -> Inode:
    """Commit a truncate's new length (storage already cut the chunks); its note (``record_truncate``) goes.

    ``cut``: storage held bytes past the new end (they are gone now): the file's open write sessions are stamped
    (``Tx.mark_cut``); a truncate that only extends the file, or cuts nothing, leaves their reports counting.
    """
    inode = truncate_check(tx, at, session_id)
    tx.execute(_RAW_TRUNCATE_DONE, (inode.inode_id, length))
    r = tx.paths.existing(at, follow_last=True)
    chain = tx.quotas.chain(tx.paths.folder_of(r))
    if length > inode.length:
        tx.quotas.charge(chain, dbytes=length - inode.length)
    else:
        tx.quotas.charge(chain, dbytes=length - inode.length, enforce=False)
    tx.shrink_reported(inode.inode_id, length)
    if cut or length < inode.length:
        tx.mark_cut(inode.inode_id)
    values = {"length": length, "mtime_ns": tx.now_ns, "ctime_ns": tx.now_ns}
    tx.update(inode.inode_id, **values)
    return inode.with_(**values)


def chmod_opened(tx: Tx, inode: Inode, mode: int, path: str) -> Inode:
    """chmod(2) of a file just opened in the same transaction.

    Create's ``set_mode``; nothing when it has the mode already.
    """
    mode = checked_mode(tx.caller, inode, mode, path)
    if mode == inode.mode:
        return inode
    tx.update(inode.inode_id, mode=mode, ctime_ns=tx.now_ns)
    return inode.with_(mode=mode, ctime_ns=tx.now_ns)


def set_attr(tx: Tx, at: PathAt, follow_last: bool, ch: AttrChange) -> Inode:
    """SetAttr: chmod, chown, times, a directory's default layout."""
    inode = tx.paths.existing(at, follow_last=follow_last).inode
    assert inode is not None
    c = tx.caller
    values: dict[str, Any] = {}
    if ch.mode is not None:
        values["mode"] = checked_mode(c, inode, ch.mode, at.path)
    values.update(checked_owner(c, inode, ch.uid, ch.gid, at.path))
    if ch.atime_ns is not None or ch.mtime_ns is not None:
        require_owner(c, inode, f"set times of {at.path}")
    if (ch.atime_now or ch.mtime_now) and not c.is_root and c.uid != inode.uid:
        require(c, inode, W, f"touch {at.path}")
    if ch.atime_ns is not None or ch.atime_now:
        values["atime_ns"] = tx.now_ns if ch.atime_now else ch.atime_ns
    if ch.mtime_ns is not None or ch.mtime_now:
        values["mtime_ns"] = tx.now_ns if ch.mtime_now else ch.mtime_ns
        if inode.is_file:
            tx.pin_times(inode.inode_id)
    if ch.layout is not None:
        if not inode.is_dir:
            raise fs_error(FsCode.NOT_DIRECTORY, f"{at.path}: only directories have a default layout")
        require_owner(c, inode, f"set the layout of {at.path}")
        if ch.layout.chunk_size:
            check_chunk_size(ch.layout.chunk_size)
        values.update(
            chain_table_id=ch.layout.chain_table_id, chunk_size=ch.layout.chunk_size, stripe_size=ch.layout.stripe_size
        )
    if values:
        values["ctime_ns"] = tx.now_ns
        tx.update(inode.inode_id, **values)
    return inode.with_(**values)


def realpath(tx: Tx, at: PathAt) -> tuple[str, int]:
    """The absolute path a path resolves to, and the inode id."""
    r = tx.paths.existing(at, follow_last=True)
    inode = r.inode
    assert inode is not None
    if inode.is_dir:
        return tx.paths.path_of(inode), inode.inode_id
    if r.parent is None:  # a file addressed by its own inode: through an entry the caller may search
        return tx.paths.reachable_path(inode), inode.inode_id
    return join(tx.paths.path_of(r.parent), r.name), inode.inode_id


def statfs(tx: Tx) -> tuple[int, int]:
    """(bytes in files, number of inodes): a scan of every inode (not a small read)."""
    session = tx.session
    used = session.execute(
        sa.select(sa.func.coalesce(sa.func.sum(inodes.c.length), 0)).where(inodes.c.type == int(InodeType.FILE))
    ).scalar_one()
    total = session.execute(sa.select(sa.func.count()).select_from(inodes)).scalar_one()
    return int(used), int(total)


# ---- quotas ----


def get_quota(tx: Tx, at: PathAt) -> list[tuple[QuotaRow, str]]:
    """The quotas over a path, nearest first, with their folders' paths."""
    r = tx.paths.existing(at, follow_last=True)
    inode = r.inode
    assert inode is not None
    base = inode if inode.is_dir else tx.paths.folder_of(r)
    chain = tx.quotas.chain(base) if base is not None else []
    return [(q, _path_or_id(tx, q.inode_id)) for q in chain]


def _path_or_id(tx: Tx, inode_id: int) -> str:
    inode = tx.get(inode_id)
    try:
        return tx.paths.path_of(inode) if inode is not None else f"<inode {inode_id}>"
    except FsError:
        return f"<inode {inode_id}>"


def set_quota(tx: Tx, at: PathAt, max_bytes: int, max_inodes: int) -> tuple[QuotaRow, str]:
    """Set (or with 0 and 0 remove) a directory's quota, counting the tree's usage."""
    inode = tx.paths.existing(at, follow_last=True).inode
    assert inode is not None
    if not inode.is_dir:
        raise fs_error(FsCode.NOT_DIRECTORY, f"{at.path}: quotas are set on directories")
    tx.session.execute(sa.delete(quotas).where(quotas.c.inode_id == inode.inode_id))
    if not max_bytes and not max_inodes:
        return QuotaRow(inode.inode_id, 0, 0, 0, 0, 0), tx.paths.path_of(inode)
    used_bytes, used_inodes = tx.subtree_usage(inode)
    # Sessions opened before the quota keep writing unreserved (they were not charged); new ones reserve.
    reserved = 0
    row = QuotaRow(inode.inode_id, max_bytes, max_inodes, used_bytes, used_inodes, reserved)
    tx.session.execute(sa.insert(quotas).values(**row.__dict__))
    return row, tx.paths.path_of(inode)


def list_quotas(tx: Tx) -> list[tuple[QuotaRow, str]]:
    """Every quota, with its folder's path."""
    rows = tx.session.execute(sa.select(quotas).order_by(quotas.c.inode_id)).all()
    return [(QuotaRow(**r._mapping), _path_or_id(tx, r.inode_id)) for r in rows]
