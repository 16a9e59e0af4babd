"""Read-only transaction bodies: Stat (one path or a batch), directory listings, RealPath and StatFs."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from ff_meta.core.errors import FsCode, FsError, fs_error
from ff_meta.core.model import DirEntry, Inode, InodeType, PathAt, inode_type_of
from ff_meta.core.paths import join
from ff_meta.core.perms import R, X, require
from ff_meta.store.listing import ListingCache
from ff_meta.store.schema import inodes
from ff_meta.store.tx import SELECT_INODE_COLS, Tx, inode_of_tuple, raw_sql

_SCAN = f"SELECT d.name, {SELECT_INODE_COLS} FROM meta_dirents d JOIN meta_inodes i ON i.inode_id = d.inode_id "
_RAW_SCAN = raw_sql(_SCAN + "WHERE d.parent_id = ? ORDER BY d.name LIMIT ?")
_RAW_SCAN_AFTER = raw_sql(_SCAN + "WHERE d.parent_id = ? AND d.name > ? ORDER BY d.name LIMIT ?")
_RAW_LIST = raw_sql("SELECT name, inode_id, type FROM meta_dirents WHERE parent_id = ? ORDER BY name LIMIT ?")
_RAW_LIST_AFTER = raw_sql(
    "SELECT name, inode_id, type FROM meta_dirents WHERE parent_id = ? AND name > ? ORDER BY name LIMIT ?"
)


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
