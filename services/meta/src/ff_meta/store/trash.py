"""The trash and the GC queue: transaction bodies over meta's tables.

The trash (removed trees kept until they expire, restorable by their owner) and the queue of removed files
whose chunks storage must still delete: transaction bodies over meta's tables, as ``fsops``.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import sqlalchemy as sa

from ff_meta.core.errors import FsCode, fs_error
from ff_meta.core.model import GcJob, Inode, InodeType, PathAt, TrashRow
from ff_meta.core.paths import join
from ff_meta.store.fsops.namespace import new_parent
from ff_meta.store.schema import gc_queue, trash
from ff_meta.store.tx import Tx, raw_sql

# ---- trash ----


def new_trash_id() -> str:
    """A new trash entry's id."""
    return uuid.uuid4().hex


def list_trash(tx: Tx, all_users: bool, page_size: int, after: str) -> tuple[list[TrashRow], str]:
    """A page of the caller's trash entries (everyone's for an admin who asks)."""
    q = sa.select(trash)
    if not (all_users and tx.caller.is_root):
        q = q.where(trash.c.uid == tx.caller.uid)
    if after:
        q = q.where(trash.c.trash_id > after)
    rows = tx.session.execute(q.order_by(trash.c.trash_id).limit(page_size + 1)).all()
    out = [
        TrashRow(r.trash_id, r.inode_id, InodeType(r.type), r.uid, r.original_path, r.removed_at_ns, r.expires_at_ns)
        for r in rows[:page_size]
    ]
    return out, (out[-1].trash_id if len(rows) > page_size else "")


def trash_row(tx: Tx, trash_id: str) -> TrashRow:
    """A trash entry the caller owns (an admin: any); ENOENT otherwise."""
    r = tx.session.execute(sa.select(trash).where(trash.c.trash_id == trash_id)).first()
    if r is None or (r.uid != tx.caller.uid and not tx.caller.is_root):
        raise fs_error(FsCode.NOT_FOUND, f"no trash entry {trash_id!r}")
    return TrashRow(r.trash_id, r.inode_id, InodeType(r.type), r.uid, r.original_path, r.removed_at_ns, r.expires_at_ns)


def restore_trash(tx: Tx, trash_id: str, to: PathAt | None) -> tuple[Inode, str]:
    """Put a trash entry back (where it was, or at ``to``): its inode and path."""
    entry = trash_row(tx, trash_id)
    dest = to if to is not None and to.path else PathAt(0, entry.original_path)
    r = tx.paths.resolve(dest, follow_last=False)
    parent = new_parent(tx, r, dest.path)
    inode = tx.must(entry.inode_id)
    dbytes, dinodes = tx.subtree_usage(inode)
    tx.quotas.charge(tx.quotas.chain(parent), dbytes=dbytes, dinodes=dinodes)
    tx.link(parent.inode_id, r.name, inode)
    if inode.is_dir:
        tx.update(inode.inode_id, parent_id=parent.inode_id, ctime_ns=tx.now_ns)
    tx.session.execute(sa.delete(trash).where(trash.c.trash_id == trash_id))
    return tx.must(inode.inode_id), join(tx.paths.path_of(parent), r.name)


def trash_ids(tx: Tx, ids: Sequence[str], expired_only: bool, everyone: bool = False) -> list[str]:
    """Ids of the caller's entries among ``ids`` (all when none is given), at most 1,000."""
    q = sa.select(trash.c.trash_id)
    if not everyone:
        q = q.where(trash.c.uid == tx.caller.uid) if not tx.caller.is_root or not ids else q
    if ids:
        q = q.where(trash.c.trash_id.in_(list(ids)))
    if expired_only:
        q = q.where(trash.c.expires_at_ns <= tx.now_ns)
    return [r.trash_id for r in tx.session.execute(q.limit(1000))]


TRASH_STEP_INODES = 500


def delete_trash_entry(tx: Tx, trash_id: str, budget: int = TRASH_STEP_INODES) -> tuple[int, bool]:
    """One step of deleting a trash entry: (inodes freed, whether the entry is gone)."""
    r = tx.session.execute(sa.select(trash).where(trash.c.trash_id == trash_id)).first()
    if r is None:
        return 0, True
    inode = tx.get(r.inode_id)
    freed, done = tx.delete_tree_step(inode, budget) if inode is not None else (0, True)
    if done:
        tx.session.execute(sa.delete(trash).where(trash.c.trash_id == trash_id))
    return freed, done


# ---- GC queue ----

_RAW_GC_DONE = raw_sql("DELETE FROM meta_gc_queue WHERE inode_id = ?")


def gc_batch(tx: Tx, ready_before: float, limit: int = 32) -> list[GcJob]:
    """The next files whose chunks to remove, those tried least first: of those queued before ``ready_before``.

    (Unix seconds: a file queued later may still have a writable capability out, ``Background.run_gc``.)
    """
    rows = tx.session.execute(
        sa.select(gc_queue)
        .where(gc_queue.c.enqueued_at <= ready_before)
        .order_by(gc_queue.c.attempts, gc_queue.c.enqueued_at)
        .limit(limit)
    )
    return [GcJob(r.inode_id, r.chain_table_id, r.stripe_size, r.chain_begin, r.shuffle_seed, r.attempts) for r in rows]


def gc_done(tx: Tx, inode_ids: Sequence[int]) -> None:
    """Storage removed these files' chunks: they leave the queue.

    On the cursor (a few statements by key: on SQLite an inline write on the event loop, one per GC round; through the
    ORM session each was a trip to the group writer's thread, which held the write lock from the calls meanwhile).
    """
    for inode_id in inode_ids:
        tx.execute(_RAW_GC_DONE, (inode_id,))


def gc_failed(tx: Tx, inode_id: int) -> None:
    """Storage could not: tried again later, after the others."""
    tx.session.execute(
        sa.update(gc_queue).where(gc_queue.c.inode_id == inode_id).values(attempts=gc_queue.c.attempts + 1)
    )
