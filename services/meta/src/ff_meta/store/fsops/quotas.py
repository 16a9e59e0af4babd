"""Directory quotas as transaction bodies: those over a path, set (or remove) one, list them all."""

from __future__ import annotations

import sqlalchemy as sa

from ff_meta.core.errors import FsCode, FsError, fs_error
from ff_meta.core.model import PathAt, QuotaRow
from ff_meta.store.schema import quotas
from ff_meta.store.tx import Tx


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
