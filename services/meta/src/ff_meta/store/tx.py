"""The transaction of a file-system operation (``Tx``: the caller, the clock, the rows it reads and writes)
and the value types the operations take and return.

Hot-path rows go straight through the DB-API cursor of the transaction's connection with the raw SQL here
(``raw_sql``: SQLite's and psycopg's parameter styles); the rest through the ORM session. A ``Tx`` without a
session (meta's inline SQLite writer and readers) has only the cursor: a helper that needs the session
raises ``NeedsOrm``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from ff_meta.core.errors import FsCode, fs_error
from ff_meta.core.model import ROOT_INODE_ID, Inode, InodeType
from ff_meta.core.paths import MAX_DIR_DEPTH, MAX_SYMLINK_HOPS, join, split_path
from ff_meta.core.perms import Caller, X, allowed, allowed_bits, require
from ff_meta.store.schema import dirents, gc_queue, inodes

MAX_LINKS = 65000
MIN_CHUNK = 64 * 1024
MAX_CHUNK = 64 * 1024 * 1024
_COLS = [c.name for c in inodes.columns]


@dataclass(frozen=True)
class PathAt:
    parent_id: int
    path: str


@dataclass(frozen=True)
class LayoutSpec:
    chain_table_id: int = 0
    chunk_size: int = 0
    stripe_size: int = 0


@dataclass(frozen=True)
class Defaults:
    """What new files get when no directory up the tree says otherwise, and the chain tables known now."""

    layout: LayoutSpec
    tables: dict[int, tuple[int, int]]  # table id -> (version, number of chains)
    lease_s: float


@dataclass
class Resolved:
    inode: Inode | None
    parent: Inode | None = None
    name: str = ""


@dataclass(frozen=True)
class SessionInfo:
    session_id: str
    client_id: str
    inode_id: int
    write_limit: int
    lease_s: float


@dataclass(frozen=True)
class QuotaRow:
    inode_id: int
    max_bytes: int
    max_inodes: int
    used_bytes: int
    used_inodes: int
    reserved_bytes: int


@dataclass(frozen=True)
class TrashRow:
    trash_id: str
    inode_id: int
    type: InodeType
    uid: int
    original_path: str
    removed_at_ns: int
    expires_at_ns: int


@dataclass(frozen=True)
class GcJob:
    inode_id: int
    chain_table_id: int
    stripe_size: int
    chain_begin: int
    shuffle_seed: int
    attempts: int


def raw_sql(sql: str) -> tuple[str, str]:
    """The statement for qmark (SQLite) and format (psycopg) parameter styles."""
    return sql, sql.replace("?", "%s")


SELECT_INODE_COLS = ", ".join(f"i.{c}" for c in _COLS)
_RAW_GET = raw_sql(f"SELECT {SELECT_INODE_COLS} FROM meta_inodes i WHERE i.inode_id = ?")
_RAW_FIRST_NAME_FOLDER = raw_sql(
    "SELECT parent_id FROM meta_dirents WHERE inode_id = ? ORDER BY parent_id, name LIMIT 1"
)
_RAW_LOOKUP = raw_sql(f"SELECT {SELECT_INODE_COLS} FROM meta_dirents d JOIN meta_inodes i ON i.inode_id = d.inode_id "
                   "WHERE d.parent_id = ? AND d.name = ?")  # fmt: skip
_TYPE_AT = _COLS.index("type")
_RAW_INSERT_INODE = raw_sql(f"INSERT INTO meta_inodes ({', '.join(_COLS)}) VALUES ({', '.join('?' * len(_COLS))})")
_RAW_INSERT_DIRENT = raw_sql("INSERT INTO meta_dirents (parent_id, name, inode_id, type) VALUES (?, ?, ?, ?)")
_RAW_ANY_QUOTA = raw_sql("SELECT inode_id FROM meta_quotas LIMIT 1")
_RAW_UNLINK = raw_sql("DELETE FROM meta_dirents WHERE parent_id = ? AND name = ?")
_RAW_ENTRY_TYPE = raw_sql("SELECT type FROM meta_dirents WHERE parent_id = ? AND name = ?")
_RAW_ENTRIES_CHANGED = raw_sql(
    "UPDATE meta_inodes SET mtime_ns = ?, ctime_ns = ?, nlink = nlink + ? WHERE inode_id = ?"
)
_RAW_ANY_CHILD = raw_sql("SELECT name FROM meta_dirents WHERE parent_id = ? LIMIT 1")
_RAW_SHRINK_REPORTED = raw_sql(
    "UPDATE meta_sessions SET reported_length = ? WHERE inode_id = ? AND reported_length > ?"
)
_RAW_DELETE_SESSION = raw_sql("DELETE FROM meta_sessions WHERE session_id = ?")
_RAW_ANY_SESSION = raw_sql("SELECT session_id FROM meta_sessions WHERE inode_id = ? LIMIT 1")
_RAW_COUNT_SESSIONS = raw_sql("SELECT COUNT(*) FROM meta_sessions WHERE inode_id = ? AND lease_expires_at > ?")
_RAW_LINKS = raw_sql("SELECT parent_id, name FROM meta_dirents WHERE inode_id = ? ORDER BY parent_id, name LIMIT ?")
# A directory and the directories above it, nearest first, up to the root (or to where a tree in the trash
# was cut off: parent 0), at most ``depth`` + 1 rows; each with its entry's name (NULL for the root).
_RAW_ANCESTRY = raw_sql(
    "WITH RECURSIVE up(inode_id, depth) AS (SELECT CAST(? AS BIGINT), 0 UNION ALL "
    "SELECT i.parent_id, up.depth + 1 FROM up JOIN meta_inodes i ON i.inode_id = up.inode_id "
    f"WHERE up.inode_id <> {ROOT_INODE_ID} AND up.depth < CAST(? AS INTEGER)) "
    "SELECT i.inode_id, i.type, i.mode, i.uid, i.gid, i.parent_id, d.name FROM up "
    "JOIN meta_inodes i ON i.inode_id = up.inode_id "
    "LEFT JOIN meta_dirents d ON d.parent_id = i.parent_id AND d.inode_id = i.inode_id ORDER BY up.depth"
)
_RAW_PIN_TIMES = raw_sql("UPDATE meta_sessions SET times_set_at_ns = ? WHERE inode_id = ?")
MAX_LINKS_CHECKED = 16
_COL_SET = frozenset(_COLS)
# QuotaRow's fields, in its order; usage never goes below 0 (a portable MAX(0, x) for SQLite and PostgreSQL).
_QUOTA_COLS = ("inode_id", "max_bytes", "max_inodes", "used_bytes", "used_inodes", "reserved_bytes")
_RAW_CHARGE = raw_sql(
    "UPDATE meta_quotas SET used_bytes = CASE WHEN used_bytes + ? < 0 THEN 0 ELSE used_bytes + ? END, "
    "used_inodes = used_inodes + ?, "
    "reserved_bytes = CASE WHEN reserved_bytes + ? < 0 THEN 0 ELSE reserved_bytes + ? END WHERE inode_id = ?"
)
_RAW_SESSION_OWNER = raw_sql("SELECT inode_id, client_id, write_limit FROM meta_sessions WHERE session_id = ?")
_RAW_INSERT_SESSION = raw_sql(
    "INSERT INTO meta_sessions (session_id, client_id, inode_id, uid, write_limit, reported_length, "
    "lease_expires_at, quota_ids) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)


@functools.cache
def _quota_rows_sql(count: int) -> tuple[str, str]:
    return raw_sql(f"SELECT {', '.join(_QUOTA_COLS)} FROM meta_quotas WHERE inode_id IN ({', '.join('?' * count)})")


@functools.cache
def _update_sql(columns: tuple[str, ...]) -> tuple[str, str]:
    """``UPDATE meta_inodes SET <columns> WHERE inode_id = ?`` (column names come from code, checked first)."""
    return raw_sql(f"UPDATE meta_inodes SET {', '.join(f'{c} = ?' for c in columns)} WHERE inode_id = ?")


MAX_FAST_DEPTH = 16


_PERM_COLS = ("inode_id", "type", "mode", "uid", "gid")


@functools.cache
def _walk_sql(depth: int) -> tuple[str, str]:
    """One query for a directory and the ``depth`` directories below it along given names: ``_PERM_COLS`` of
    each but the last, every column of the last (only it becomes an ``Inode``: building one per directory
    cost more than the query)."""
    aliases = ["r", *(f"i{k}" for k in range(depth))]
    cols = [", ".join(f"{a}.{c}" for c in _PERM_COLS) for a in aliases[:-1]]
    cols.append(", ".join(f"{aliases[-1]}.{c}" for c in _COLS))
    joins, conds, prev = [], [], "r"
    for k in range(depth):
        joins.append(f"JOIN meta_dirents d{k} ON d{k}.parent_id = {prev}.inode_id "
                     f"JOIN meta_inodes i{k} ON i{k}.inode_id = d{k}.inode_id")  # fmt: skip
        conds.append(f"d{k}.name = ?")
        prev = f"i{k}"
    return raw_sql(f"SELECT {', '.join(cols)} FROM meta_inodes r {' '.join(joins)} "
                f"WHERE r.inode_id = ? AND {' AND '.join(conds)}")  # fmt: skip


def inode_of_tuple(row: tuple[Any, ...]) -> Inode:
    values = dict(zip(_COLS, row, strict=True))
    values["type"] = InodeType(row[_TYPE_AT])
    return Inode(**values)


def inode_of(row: Any) -> Inode:
    m = row._mapping
    return Inode(**{c: m[c] for c in _COLS if c != "type"}, type=InodeType(m["type"]))


def _values(inode: Inode) -> dict[str, Any]:
    return {c: (int(inode.type) if c == "type" else getattr(inode, c)) for c in _COLS}


class NeedsOrm(RuntimeError):
    """A transaction body running on a bare DB-API cursor reached a helper that needs the ORM session: the
    caller rolls back and runs the body again in an ordinary ``Store.run``."""


class NeedsThread(NeedsOrm):
    """A transaction body running on the event loop walked more rows than ``Tx.loop_budget`` allows (a batch
    of deep paths, symlinks into deep trees): the caller rolls back and runs it again in a worker thread."""


# One path resolution may walk at most this many components, symlink expansions included (40 hops of
# 2,048-component targets would otherwise be 80,000 lookups for one Stat): ELOOP beyond. One transaction
# (a BatchStat of 10,000 paths) may spend at most MAX_WALK_COST on walking paths (a lookup costs 1; one
# query for up to 16 directories down, 1 + 1 per 2; the directories above an inode, 1 + 1 per 16 rows):
# ELOOP for what comes after, so that no request costs more than a few seconds.
MAX_COMPONENTS_WALKED = 4096
MAX_WALK_COST = 1 << 16


@dataclass
class Tx:
    """One transaction with the caller and the clock of the call."""

    orm: Session | None
    caller: Caller
    now_ns: int
    _has_quotas: bool | None = field(default=None)
    _conn: Connection | None = field(default=None)
    _cursor: Any = field(default=None)
    _qmark: bool = field(default=True)
    # Directories a path lookup of this caller may pass through (search permission on each and on every
    # directory above it), learnt in this transaction.
    _passable: set[int] = field(default_factory=set)
    _reachable: set[int] = field(default_factory=set)  # inodes check_reachable let through
    # What the transaction may still spend walking paths (see MAX_WALK_COST) on the event loop; None: no
    # limit (it runs in a thread). Past it: NeedsThread.
    loop_budget: int | None = field(default=None)
    _walk_left: int = field(default=MAX_WALK_COST)
    # Read-only batches (BatchStat) remember the directory walks of their paths: files of one folder, or the
    # same symlinks, are walked once.
    cache_walks: bool = field(default=False)
    _walks: dict[tuple[int, tuple[str, ...]], Inode] = field(default_factory=dict)

    def _spend(self, cost: int) -> None:
        self._walk_left -= cost
        if self._walk_left < 0:
            raise fs_error(FsCode.SYMLINK_LOOP, "the request walks too many path components (symlinks?)")
        if self.loop_budget is not None:
            self.loop_budget -= cost
            if self.loop_budget < 0:
                raise NeedsThread("too long for the event loop")

    # ---- rows ----

    @property
    def session(self) -> Session:
        if self.orm is None:
            raise NeedsOrm("this transaction runs on a bare DB-API cursor: only the cursor helpers work")
        return self.orm

    @property
    def conn(self) -> Connection:
        """The transaction's connection: Core statements on it skip the ORM session's overhead."""
        if self._conn is None:
            self._conn = self.session.connection()
        return self._conn

    def _fetch(self, sql: tuple[str, str], params: tuple[Any, ...], fetch: bool = True) -> tuple[Any, ...] | None:
        """One row of a hot-path query, straight through the DB-API cursor of this transaction's connection
        (SQLAlchemy's per-statement machinery costs several times the query itself)."""
        if self._cursor is None:
            self._qmark = self.conn.dialect.paramstyle == "qmark"
            self._cursor = self.conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        self._cursor.execute(sql[0] if self._qmark else sql[1], params)
        if not fetch:
            return None
        row: tuple[Any, ...] | None = self._cursor.fetchone()
        return row

    def fetch_all(self, sql: tuple[str, str], params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        self._fetch(sql, params, fetch=False)
        return list(self._cursor.fetchall())

    def get(self, inode_id: int) -> Inode | None:
        row = self._fetch(_RAW_GET, (inode_id,))
        return inode_of_tuple(row) if row is not None else None

    def must(self, inode_id: int) -> Inode:
        inode = self.get(inode_id)
        if inode is None:
            raise fs_error(FsCode.NOT_FOUND, f"inode {inode_id} does not exist")
        return inode

    def lookup(self, parent_id: int, name: str) -> Inode | None:
        self._spend(1)
        row = self._fetch(_RAW_LOOKUP, (parent_id, name))
        return inode_of_tuple(row) if row is not None else None

    def insert(self, inode: Inode) -> None:
        values = _values(inode)
        self._fetch(_RAW_INSERT_INODE, tuple(values[c] for c in _COLS), fetch=False)

    def update(self, inode_id: int, **values: Any) -> None:
        unknown = set(values) - _COL_SET
        if unknown or not values:
            raise ValueError(f"not columns of meta_inodes: {sorted(unknown) or 'none given'}")
        self._fetch(_update_sql(tuple(values)), (*values.values(), inode_id), fetch=False)

    def link(self, parent_id: int, name: str, inode: Inode) -> None:
        self._fetch(_RAW_INSERT_DIRENT, (parent_id, name, inode.inode_id, int(inode.type)), fetch=False)
        self._entries_changed(parent_id, 1 if inode.is_dir else 0)

    def unlink_entry(self, parent_id: int, name: str) -> None:
        row = self._fetch(_RAW_ENTRY_TYPE, (parent_id, name))
        self._fetch(_RAW_UNLINK, (parent_id, name), fetch=False)
        if row is not None:
            self._entries_changed(parent_id, -1 if row[0] == InodeType.DIRECTORY else 0)

    def _entries_changed(self, dir_id: int, dsubdirs: int) -> None:
        """A directory's entries changed (POSIX: its mtime and ctime move); its link count follows its
        subdirectories (each one's ".." names it)."""
        self._fetch(_RAW_ENTRIES_CHANGED, (self.now_ns, self.now_ns, dsubdirs, dir_id), fetch=False)

    def has_children(self, dir_id: int) -> bool:
        return self._fetch(_RAW_ANY_CHILD, (dir_id,)) is not None

    def has_sessions(self, inode_id: int) -> bool:
        return self._fetch(_RAW_ANY_SESSION, (inode_id,)) is not None

    def count_sessions(self, inode_id: int) -> int:
        """Write sessions of the inode whose lease holds (a lapsed one waits for collection, not counted)."""
        row = self._fetch(_RAW_COUNT_SESSIONS, (inode_id, self.now_ns / 1e9))
        return int(row[0]) if row is not None else 0

    # ---- paths ----

    def resolve(self, at: PathAt, *, follow_last: bool, hops: int = 0, reached: bool = False,  # noqa: PLR0912
                walked: int = 0) -> Resolved:  # fmt: skip
        """Walk ``at`` (search permission on every directory walked). A lookup that starts at an inode (a
        relative path or the inode itself) is refused as a path lookup from the root would be: see
        ``check_reachable``; ``reached`` skips that for a directory this transaction already walked to.
        ``walked``: components of the symlink expansions before this one (``MAX_COMPONENTS_WALKED``)."""
        absolute, parts = split_path(at.path)
        walked += len(parts)
        if walked > MAX_COMPONENTS_WALKED:
            raise fs_error(FsCode.SYMLINK_LOOP, f"path resolution past {MAX_COMPONENTS_WALKED} components")
        start = ROOT_INODE_ID if absolute or at.parent_id in (0, ROOT_INODE_ID) else at.parent_id
        begin = 0
        cur: Inode | None = None
        start_inode: Inode | None = None
        if start != ROOT_INODE_ID and not reached:
            start_inode = self.must(start)
            self.check_reachable(start_inode)
        cur_id = start
        while begin < len(parts) - 1:
            # Fast path: the directories down to the last component, up to MAX_FAST_DEPTH of them per query.
            chunk = parts[begin : min(begin + MAX_FAST_DEPTH, len(parts) - 1)]
            down = self._walk_dirs(cur_id, chunk, parts[:begin]) if ".." not in chunk else None
            if down is None:
                break
            cur, cur_id, begin = down, down.inode_id, begin + len(chunk)
        if cur is None:
            cur = start_inode or self.must(start)
            if not parts:
                return Resolved(cur)
            if not cur.is_dir:
                raise fs_error(FsCode.NOT_DIRECTORY, f"inode {cur.inode_id} is not a directory")
        for i in range(begin, len(parts)):
            comp = parts[i]
            last = i == len(parts) - 1
            if not cur.is_dir:
                raise fs_error(FsCode.NOT_DIRECTORY, f"{'/'.join(parts[:i])!r} is not a directory")
            require(self.caller, cur, X, f"search {'/'.join(parts[:i]) or '/'}")
            if comp == "..":
                parent = self.must(cur.parent_id or ROOT_INODE_ID)
                if last:
                    return Resolved(parent, None, "..")
                cur = parent
                continue
            child = self.lookup(cur.inode_id, comp)
            if child is None:
                if last:
                    return Resolved(None, cur, comp)
                raise fs_error(FsCode.NOT_FOUND, f"no such file or directory: {'/'.join(parts[: i + 1])}")
            if child.is_symlink and (follow_last or not last):
                if hops >= MAX_SYMLINK_HOPS:
                    raise fs_error(FsCode.SYMLINK_LOOP, "too many levels of symbolic links")
                rest = "/".join([child.symlink_target, *parts[i + 1 :]])
                return self.resolve(PathAt(cur.inode_id, rest), follow_last=follow_last, hops=hops + 1, reached=True,
                                    walked=walked)  # fmt: skip
            if last:
                return Resolved(child, cur, comp)
            cur = child
        raise AssertionError("unreachable")

    def _walk_dirs(self, start: int, names: list[str], what: list[str]) -> Inode | None:
        """The directory ``names`` lead to from directory ``start``, with search permission checked on
        ``start`` and every directory before the last (``what``: the components walked before ``start``, for
        the error); None when one is missing or is not a directory (then the caller walks step by step,
        which finds the exact error or follows symlinks)."""
        key = (start, tuple(names))
        if self.cache_walks and key in self._walks:
            return self._walks[key]
        self._spend(1 + len(names) // 2)
        row = self._fetch(_walk_sql(len(names)), (start, *names))
        if row is None:
            return None
        width = len(_PERM_COLS)
        last = inode_of_tuple(row[len(names) * width :])
        above = [row[k * width : (k + 1) * width] for k in range(len(names))]
        if not last.is_dir or any(d[1] != InodeType.DIRECTORY for d in above):
            return None
        for k, (_, _, mode, uid, gid) in enumerate(above):
            if not allowed_bits(self.caller, X, uid=uid, gid=gid, mode=mode, is_dir=True):
                raise fs_error(FsCode.ACCESS_DENIED, f"permission denied: search {'/'.join(what + names[:k]) or '/'}")
        if self.cache_walks:
            self._walks[key] = last
        return last

    def existing(self, at: PathAt, *, follow_last: bool) -> Resolved:
        r = self.resolve(at, follow_last=follow_last)
        if r.inode is None:
            raise fs_error(FsCode.NOT_FOUND, f"no such file or directory: {at.path}")
        return r

    # ---- the way up: inode addressing, paths, depth ----

    def ancestry(self, dir_id: int) -> list[tuple[Any, ...]]:
        """``(inode_id, type, mode, uid, gid, parent_id, name)`` of a directory and of every directory above it,
        nearest first, ending at the root (or where a tree in the trash was cut off). One query.

        Raises:
            FsInvalid: the tree is deeper than ``MAX_DIR_DEPTH`` there (ENAMETOOLONG).
        """
        rows = self.fetch_all(_RAW_ANCESTRY, (dir_id, MAX_DIR_DEPTH + 1))
        self._spend(1 + len(rows) // 16)
        if len(rows) > MAX_DIR_DEPTH + 1 or (len(rows) == MAX_DIR_DEPTH + 1 and rows[-1][0] != ROOT_INODE_ID):
            raise fs_error(FsCode.NAME_TOO_LONG, f"directory tree deeper than {MAX_DIR_DEPTH} levels")
        return rows

    def depth_of(self, dir_id: int) -> int:
        """How many levels below the root a directory is (the root: 0)."""
        return len(self.ancestry(dir_id)) - 1

    def _passable_why(self, dir_id: int) -> FsCode | None:
        """None when a path lookup of the caller may pass through directory ``dir_id`` (search permission on it
        and on every directory above it); else why not: NOT_FOUND (not in the namespace) or ACCESS_DENIED."""
        if dir_id in self._passable:
            return None
        rows = self.ancestry(dir_id)
        if not rows or rows[-1][0] != ROOT_INODE_ID:
            return FsCode.NOT_FOUND
        for row in reversed(rows):  # from the root down: every directory passed is remembered
            node = Inode(inode_id=row[0], type=InodeType(row[1]), mode=row[2], uid=row[3], gid=row[4])
            if not node.is_dir or not allowed(self.caller, node, X):
                return FsCode.ACCESS_DENIED
            self._passable.add(node.inode_id)
        return None

    def _reachable_link(self, inode: Inode) -> tuple[FsCode | None, tuple[int, str] | None]:
        """For a file or symlink: (None, (parent id, name)) of an entry naming it whose directory the caller
        may pass through, else (why not, None). A file no entry names (removed while open, or in the trash)
        is reachable by its owner only, without an entry."""
        links = self.fetch_all(_RAW_LINKS, (inode.inode_id, MAX_LINKS_CHECKED))
        if not links:
            return (None if self.caller.is_root or inode.uid == self.caller.uid else FsCode.NOT_FOUND), None
        why = FsCode.NOT_FOUND
        for parent_id, name in links:
            w = None if self.caller.is_root else self._passable_why(int(parent_id))
            if w is None:
                return None, (int(parent_id), str(name))
            if w is FsCode.ACCESS_DENIED:
                why = w
        return why, None

    def check_reachable(self, inode: Inode) -> None:
        """Inode addressing (FUSE, relative paths): refused where a path lookup from the root would be, so that
        knowing an inode id gives no access that a path would not (POSIX: search permission on every
        directory above). Root passes.

        Raises:
            FsDenied: some directory above is not searchable by the caller (EACCES).
            FsNotFound: the inode is not in the namespace (in the trash, or a removed file of another user).
        """
        if self.caller.is_root or inode.inode_id == ROOT_INODE_ID or inode.inode_id in self._reachable:
            return
        if inode.is_dir:
            why = self._passable_why(inode.parent_id) if inode.parent_id else FsCode.NOT_FOUND
        else:
            why = self._reachable_link(inode)[0]
        if why is not None:
            raise fs_error(why, f"inode {inode.inode_id}: no path to it that the caller may search")
        self._reachable.add(inode.inode_id)

    def reachable_path(self, inode: Inode) -> str:
        """The absolute path of an inode the caller may reach (see ``check_reachable``); for a file with
        several links, one the caller may search."""
        self.check_reachable(inode)
        if inode.is_dir:
            return self.path_of(inode)
        _, link = self._reachable_link(inode)
        if link is None:
            raise fs_error(FsCode.NOT_FOUND, f"inode {inode.inode_id} is not in the namespace")
        parent_id, name = link
        return join(self.path_of(self.must(parent_id)), name)

    def path_of(self, inode: Inode) -> str:
        """The absolute path of a directory, or of a file through one of its entries (no permission check)."""
        if not inode.is_dir:
            links = self.fetch_all(_RAW_LINKS, (inode.inode_id, 1))
            if not links:
                raise fs_error(FsCode.NOT_FOUND, f"inode {inode.inode_id} is not in the namespace")
            return join(self.path_of(self.must(int(links[0][0]))), str(links[0][1]))
        rows = self.ancestry(inode.inode_id)
        names = [r[6] for r in rows[:-1]]
        if not rows or rows[-1][0] != ROOT_INODE_ID or any(n is None for n in names):
            raise fs_error(FsCode.NOT_FOUND, f"inode {inode.inode_id} is not in the namespace")
        return "/" + "/".join(reversed(names))

    def ancestors(self, dir_inode: Inode) -> list[int]:
        """The directory and every directory above it up to the root."""
        return [int(r[0]) for r in self.ancestry(dir_inode.inode_id)]

    # ---- quotas ----

    def any_quota(self) -> bool:
        if self._has_quotas is None:
            self._has_quotas = self._fetch(_RAW_ANY_QUOTA, ()) is not None
        return self._has_quotas

    def folder_of(self, r: Resolved) -> Inode | None:
        """The folder whose quotas a file's bytes count against: the one it was reached through, or, for a file
        addressed by its own inode (no path), the folder of its first name (None: no name is left)."""
        if r.parent is not None or r.inode is None or r.inode.is_dir:
            return r.parent
        row = self._fetch(_RAW_FIRST_NAME_FOLDER, (r.inode.inode_id,))
        return None if row is None else self.must(int(row[0]))

    def quota_chain(self, dir_inode: Inode | None) -> list[QuotaRow]:
        """Quotas of ``dir_inode`` and its ancestors, nearest first."""
        if dir_inode is None or not self.any_quota():
            return []
        return self.quota_chain_of(self.ancestors(dir_inode))

    def quota_chain_of(self, dir_ids: Sequence[int]) -> list[QuotaRow]:
        """The quotas (as they are now) of those of ``dir_ids`` that have one, in the order given."""
        if not dir_ids or not self.any_quota():
            return []
        rows = {q.inode_id: q for q in self._quota_rows(dir_ids)}
        return [rows[i] for i in dir_ids if i in rows]

    def _quota_rows(self, ids: Sequence[int]) -> list[QuotaRow]:
        if not ids:
            return []
        return [QuotaRow(*row) for row in self.fetch_all(_quota_rows_sql(len(ids)), tuple(ids))]

    def charge(self, chain: Sequence[QuotaRow], *, dbytes: int = 0, dinodes: int = 0, dreserved: int = 0,
               enforce: bool = True) -> None:  # fmt: skip
        """Add usage to every quota of ``chain``; growth past a limit is EDQUOT (nothing charged)."""
        for q in chain:
            if not enforce:
                break
            if dinodes > 0 and q.max_inodes and q.used_inodes + dinodes > q.max_inodes:
                raise fs_error(FsCode.QUOTA_EXCEEDED, f"inode quota of directory {q.inode_id} exceeded "
                                                      f"({q.used_inodes}/{q.max_inodes})")  # fmt: skip
            grow = dbytes + dreserved
            if grow > 0 and q.max_bytes and q.used_bytes + q.reserved_bytes + grow > q.max_bytes:
                raise fs_error(FsCode.QUOTA_EXCEEDED, f"byte quota of directory {q.inode_id} exceeded "
                                                      f"({q.used_bytes + q.reserved_bytes}+{grow}"
                                                      f"/{q.max_bytes})")  # fmt: skip
        for q in chain:
            self._fetch(_RAW_CHARGE, (dbytes, dbytes, dinodes, dreserved, dreserved, q.inode_id), fetch=False)

    def quota_ids_of(self, ids: str) -> list[QuotaRow]:
        wanted = [int(x) for x in ids.split(",") if x]
        return self._quota_rows(wanted) if wanted else []

    # ---- write sessions ----

    def session_owner(self, session_id: str) -> tuple[int, str, int | None] | None:
        """(inode id, client id, write limit) of an open write session."""
        row = self._fetch(_RAW_SESSION_OWNER, (session_id,))
        return None if row is None else (int(row[0]), str(row[1]), None if row[2] is None else int(row[2]))

    def insert_session(self, session_id: str, client_id: str, inode: Inode, write_limit: int | None,
                       expires_at: float, chain: Sequence[QuotaRow]) -> None:  # fmt: skip
        quota_ids = ",".join(str(q.inode_id) for q in chain)
        self._fetch(_RAW_INSERT_SESSION, (session_id, client_id, inode.inode_id, self.caller.uid, write_limit,
                                          inode.length, expires_at, quota_ids), fetch=False)  # fmt: skip

    def delete_session(self, session_id: str) -> None:
        """Through the cursor, as ``insert_session``: a Close then runs on the inline writer, no ORM session."""
        self._fetch(_RAW_DELETE_SESSION, (session_id,), fetch=False)

    def shrink_reported(self, inode_id: int, length: int) -> None:
        """No write session of the inode reports more than ``length`` (a truncate), through the cursor."""
        self._fetch(_RAW_SHRINK_REPORTED, (length, inode_id, length), fetch=False)

    def pin_times(self, inode_id: int) -> None:
        """An explicit mtime was just set: the file's open write sessions report no earlier write time over it
        (see ``fsops.finish_length``)."""
        self._fetch(_RAW_PIN_TIMES, (self.now_ns, inode_id), fetch=False)

    def subtree_usage(self, root: Inode) -> tuple[int, int]:
        """(bytes, inodes) of a tree: file lengths and every inode, the root included."""
        if not root.is_dir:
            return (root.length if root.is_file else 0), 1
        total_bytes, total_inodes = 0, 1
        frontier = [root.inode_id]
        while frontier:
            rows = self.session.execute(
                sa.select(inodes.c.inode_id, inodes.c.type, inodes.c.length)
                .join(dirents, dirents.c.inode_id == inodes.c.inode_id).where(dirents.c.parent_id.in_(frontier[:500]))
            ).all()  # fmt: skip
            frontier = frontier[500:]
            for r in rows:
                total_inodes += 1
                if r.type == InodeType.FILE:
                    total_bytes += r.length
                elif r.type == InodeType.DIRECTORY:
                    frontier.append(r.inode_id)
        return total_bytes, total_inodes

    # ---- removal ----

    def drop_link(self, inode: Inode) -> None:
        """One entry of ``inode`` is gone: free what is no longer referenced (files go to the GC queue)."""
        if inode.is_dir or inode.is_symlink:
            self.session.execute(sa.delete(inodes).where(inodes.c.inode_id == inode.inode_id))
            return
        nlink = max(0, inode.nlink - 1)
        if nlink > 0 or self.has_sessions(inode.inode_id):
            self.update(inode.inode_id, nlink=nlink, ctime_ns=self.now_ns)
            return
        self.free_file(inode)

    def free_file(self, inode: Inode) -> None:
        self.session.execute(sa.delete(inodes).where(inodes.c.inode_id == inode.inode_id))
        if inode.chain_table_id and inode.stripe_size:
            exists = self.session.execute(
                sa.select(gc_queue.c.inode_id).where(gc_queue.c.inode_id == inode.inode_id)
            ).first()
            if exists is None:
                self.session.execute(sa.insert(gc_queue).values(
                    inode_id=inode.inode_id, chain_table_id=inode.chain_table_id, stripe_size=inode.stripe_size,
                    chain_begin=inode.chain_begin, shuffle_seed=inode.shuffle_seed, enqueued_at=self.now_ns / 1e9,
                    attempts=0,
                ))  # fmt: skip

    def delete_tree_step(self, root: Inode, budget: int) -> tuple[int, bool]:
        """Delete at most ``budget`` inodes of a detached tree (trash), deepest first, so that a huge tree goes
        in many small transactions and is consistent between them. Returns (freed, whether the root is gone)."""
        if not root.is_dir:
            self.drop_link(root)
            return 1, True
        freed = 0
        path: list[tuple[Inode, str]] = [(root, "")]
        while path and freed < budget:
            d, name = path[-1]
            sub = self.session.execute(
                _children(d.inode_id).where(dirents.c.type == int(InodeType.DIRECTORY)).limit(1)
            ).first()
            if sub is not None:
                path.append((inode_of(sub), sub.entry_name))
                continue
            room = budget - freed
            rows = self.session.execute(_children(d.inode_id).limit(room)).all()
            for r in rows:
                self.unlink_entry(d.inode_id, r.entry_name)
                self.drop_link(inode_of(r))
                freed += 1
            if freed >= budget:
                break  # the directory itself (now maybe empty) goes in the next step
            path.pop()
            if path:
                self.unlink_entry(path[-1][0].inode_id, name)
            self.session.execute(sa.delete(inodes).where(inodes.c.inode_id == d.inode_id))
            freed += 1
            if not path:
                return freed, True
        return freed, False


def _children(dir_id: int) -> sa.Select[Any]:
    """Entries of a directory with their inodes (``entry_name`` is the entry's name)."""
    q = sa.select(inodes, dirents.c.name.label("entry_name"))
    return q.join(dirents, dirents.c.inode_id == inodes.c.inode_id).where(dirents.c.parent_id == dir_id)
