"""Files by path: Create and Open, a chmod in the same Create, and truncates (check, note, commit)."""

from __future__ import annotations

import sqlalchemy as sa

from ff_meta.core.errors import FsCode, fs_error
from ff_meta.core.layout import choose_layout
from ff_meta.core.model import Defaults, Inode, InodeType, LayoutSpec, PathAt, QuotaRow
from ff_meta.core.perms import R, W, checked_mode, require, require_session_owner
from ff_meta.store.fsops.namespace import new_inode, new_parent
from ff_meta.store.fsops.sessions import session_row
from ff_meta.store.schema import sessions, truncates
from ff_meta.store.tx import Tx, raw_sql


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
    inode = new_inode(tx, inode_id, InodeType.FILE, mode, **choose_layout(parent, layout, defaults, inode_id))
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


_RAW_SESSION_HOLDER = raw_sql("SELECT inode_id, client_id, uid FROM meta_sessions WHERE session_id = ?")


def held_by_session(tx: Tx, at: PathAt, session_id: str, client_id: str) -> Inode | None:
    """The file ``at`` addresses by its inode, when ``session_id`` is the caller's (and this client's) session on it.

    A write open that names such a session is allowed by it, as the session's writes, Truncate and Close are: a
    descriptor's capability refresh, whatever the file's mode or path says now (POSIX keeps an open descriptor's
    access; git writes its packs through descriptors of files it created 0444). None otherwise: then the open is
    checked as any other.
    """
    if not session_id or at.path or not at.parent_id:
        return None
    rows = tx.fetch_all(_RAW_SESSION_HOLDER, (session_id,))
    if not rows:
        return None
    inode_id, holder_client, uid = rows[0]
    if int(inode_id) != at.parent_id or holder_client != client_id or not (tx.caller.is_root or uid == tx.caller.uid):
        return None
    inode = tx.get(at.parent_id)
    return inode if inode is not None and inode.is_file else None


def chmod_opened(tx: Tx, inode: Inode, mode: int, path: str) -> Inode:
    """chmod(2) of a file just opened in the same transaction.

    Create's ``set_mode``; nothing when it has the mode already.
    """
    mode = checked_mode(tx.caller, inode, mode, path)
    if mode == inode.mode:
        return inode
    tx.update(inode.inode_id, mode=mode, ctime_ns=tx.now_ns)
    return inode.with_(mode=mode, ctime_ns=tx.now_ns)


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
        require_session_owner(tx.caller, session_row(tx, inode.inode_id, session_id).uid)
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
    if length < inode.length:
        _reserve_again(tx, inode, length)
    tx.shrink_reported(inode.inode_id, length)
    if cut or length < inode.length:
        tx.mark_cut(inode.inode_id)
    values = {"length": length, "mtime_ns": tx.now_ns, "ctime_ns": tx.now_ns}
    tx.update(inode.inode_id, **values)
    return inode.with_(**values)


def _reserve_again(tx: Tx, inode: Inode, length: int) -> None:
    """A cut to ``length``: each open write session's quotas reserve again what it freed below the session's limit.

    The session may write up to its limit (its IoCapability names it, and its client reserves nothing below it):
    that room stays its own, not free for another writer too. Its Close gives back what it leaves unused.
    """
    q = sa.select(sessions.c.write_limit, sessions.c.quota_ids).where(sessions.c.inode_id == inode.inode_id)
    for limit, quota_ids in tx.session.execute(q):
        freed = min(inode.length, int(limit)) - length if limit is not None else 0
        if freed > 0:
            tx.quotas.charge(tx.quotas.of_ids(quota_ids), dreserved=freed, enforce=False)
