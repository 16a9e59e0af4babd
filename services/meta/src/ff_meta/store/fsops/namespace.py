"""Namespace mutations: inode ids, Mkdirs, symlinks, special files, hard links, Remove, Rename and SetAttr."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from ff_meta.core.errors import FsCode, fs_error
from ff_meta.core.layout import check_chunk_size
from ff_meta.core.model import (
    DEVICE_TYPES,
    ROOT_INODE_ID,
    SPECIAL_TYPES,
    AttrChange,
    Inode,
    InodeType,
    LayoutSpec,
    PathAt,
    QuotaRow,
)
from ff_meta.core.paths import MAX_DIR_DEPTH, check_name, join, split_path
from ff_meta.core.perms import W, X, check_sticky, checked_mode, checked_owner, require, require_owner
from ff_meta.core.resolve import Resolved
from ff_meta.store.schema import trash
from ff_meta.store.tx import MAX_LINKS, Tx, raw_sql

_RAW_NEXT_ID = raw_sql("SELECT value FROM meta_counters WHERE name = 'next_inode_id'")
_RAW_SET_NEXT_ID = raw_sql("UPDATE meta_counters SET value = ? WHERE name = 'next_inode_id'")


def allocate_ids(tx: Tx, count: int) -> int:
    """Reserve ``count`` consecutive inode ids; returns the first."""
    [(first,)] = tx.fetch_all(_RAW_NEXT_ID, ())
    tx.execute(_RAW_SET_NEXT_ID, (int(first) + count,))
    return int(first)


def new_parent(tx: Tx, r: Resolved, what: str) -> Inode:
    """The directory a new entry goes in; the name checked; W and X on it."""
    if r.inode is not None:
        raise fs_error(FsCode.EXISTS, f"{what}: file exists")
    if r.parent is None:
        raise fs_error(FsCode.EXISTS, f"{what}: file exists")
    check_name(r.name)
    require(tx.caller, r.parent, W | X, f"create in {what}")
    return r.parent


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


def new_inode(tx: Tx, inode_id: int, kind: InodeType, mode: int, **fields: Any) -> Inode:
    """A new inode of ``kind``, the caller's, made now, with one link and ``mode``'s permission bits.

    ``fields``: the rest (layout, length, symlink target, device number).
    """
    now = tx.now_ns
    return Inode(
        inode_id=inode_id,
        type=kind,
        mode=mode & 0o7777,
        uid=tx.caller.uid,
        gid=tx.caller.gid,
        nlink=1,
        atime_ns=now,
        mtime_ns=now,
        ctime_ns=now,
        **fields,
    )


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
    inode = new_inode(
        tx,
        inode_id,
        InodeType.DIRECTORY,
        mode,
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
    inode = new_inode(
        tx,
        inode_id,
        InodeType.SYMLINK,
        0o777,
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
    inode = new_inode(tx, inode_id, kind, mode, rdev=rdev)
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
