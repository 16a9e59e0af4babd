"""The transaction of a file-system operation.

``Tx``: the caller, the clock, the rows it reads and writes.

It implements ``core.rows`` (the rows meta's rules work on) and carries those rules for the transaction: ``tx.paths``
(``core.resolve.PathResolver``) and ``tx.quotas`` (``core.quota.QuotaBook``).

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

from ff_meta.core.model import ROOT_INODE_ID, Inode, InodeType, QuotaRow, inode_type_of
from ff_meta.core.paths import WalkBudget
from ff_meta.core.perms import Caller
from ff_meta.core.quota import QuotaBook, quota_ids_text
from ff_meta.core.resolve import PathResolver
from ff_meta.core.rows import AncestorRow, DirBits
from ff_meta.store.schema import dirents, inodes

MAX_LINKS = 65000
_COLS = [c.name for c in inodes.columns]


def raw_sql(sql: str) -> tuple[str, str]:
    """The statement for qmark (SQLite) and format (psycopg) parameter styles."""
    return sql, sql.replace("?", "%s")


SELECT_INODE_COLS = ", ".join(f"i.{c}" for c in _COLS)
_RAW_GET = raw_sql(f"SELECT {SELECT_INODE_COLS} FROM meta_inodes i WHERE i.inode_id = ?")
_RAW_LOOKUP = raw_sql(
    f"SELECT {SELECT_INODE_COLS} FROM meta_dirents d JOIN meta_inodes i ON i.inode_id = d.inode_id "
    "WHERE d.parent_id = ? AND d.name = ?"
)
_TYPE_AT = _COLS.index("type")
_RAW_INSERT_INODE = raw_sql(f"INSERT INTO meta_inodes ({', '.join(_COLS)}) VALUES ({', '.join('?' * len(_COLS))})")
_RAW_INSERT_DIRENT = raw_sql("INSERT INTO meta_dirents (parent_id, name, inode_id, type) VALUES (?, ?, ?, ?)")
_RAW_ANY_QUOTA = raw_sql("SELECT inode_id FROM meta_quotas LIMIT 1")
_RAW_UNLINK = raw_sql("DELETE FROM meta_dirents WHERE parent_id = ? AND name = ?")
_RAW_DELETE_INODE = raw_sql("DELETE FROM meta_inodes WHERE inode_id = ?")
_RAW_GC_QUEUED = raw_sql("SELECT inode_id FROM meta_gc_queue WHERE inode_id = ?")
_RAW_GC_ENQUEUE = raw_sql(
    "INSERT INTO meta_gc_queue (inode_id, chain_table_id, stripe_size, chain_begin, shuffle_seed, enqueued_at,"
    " attempts) VALUES (?, ?, ?, ?, ?, ?, 0)"
)
_RAW_ENTRY_TYPE = raw_sql("SELECT type FROM meta_dirents WHERE parent_id = ? AND name = ?")
_RAW_ENTRIES_CHANGED = raw_sql(
    "UPDATE meta_inodes SET mtime_ns = ?, ctime_ns = ?, nlink = nlink + ?, entries_version = entries_version + 1 "
    "WHERE inode_id = ?"
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
_RAW_MARK_CUT = raw_sql("UPDATE meta_sessions SET truncated_at_ns = ? WHERE inode_id = ?")
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


_PERM_COLS = ("inode_id", "type", "mode", "uid", "gid")


@functools.cache
def _walk_sql(depth: int, then: bool) -> tuple[str, str]:
    """One query for a directory and several below it.

    The directory and the ``depth`` directories below it along given names: ``_PERM_COLS`` of each but the last, every
    column of the last (only it becomes an ``Inode``: building one per directory cost more than the query); with
    ``then``, every column of the inode one more name names in the last (NULLs when there is no such entry), so that a
    path's walk and its last lookup are one statement. Parameters: (then's name,) start id, the names.
    """
    aliases = ["r", *(f"i{k}" for k in range(depth))]
    cols = [", ".join(f"{a}.{c}" for c in _PERM_COLS) for a in aliases[:-1]]
    cols.append(", ".join(f"{aliases[-1]}.{c}" for c in _COLS))
    joins, conds, prev = [], [], "r"
    for k in range(depth):
        joins.append(
            f"JOIN meta_dirents d{k} ON d{k}.parent_id = {prev}.inode_id "
            f"JOIN meta_inodes i{k} ON i{k}.inode_id = d{k}.inode_id"
        )
        conds.append(f"d{k}.name = ?")
        prev = f"i{k}"
    if then:
        cols.append(", ".join(f"iz.{c}" for c in _COLS))
        joins.append(
            f"LEFT JOIN meta_dirents dz ON dz.parent_id = {prev}.inode_id AND dz.name = ? "
            "LEFT JOIN meta_inodes iz ON iz.inode_id = dz.inode_id"
        )
    return raw_sql(
        f"SELECT {', '.join(cols)} FROM meta_inodes r {' '.join(joins)} WHERE r.inode_id = ? AND {' AND '.join(conds)}"
    )


def inode_of_tuple(row: tuple[Any, ...]) -> Inode:
    """An ``Inode`` from a row of ``meta_inodes``' columns in order.

    Filled in place rather than through the frozen dataclass's ``__init__``, whose ``object.__setattr__`` per field
    was most of a Stat's and a List's CPU in meta (19 fields; a List of 100 inodes built 100); the columns are the
    fields (``test_inode_rows``: the same ``Inode`` as the constructor gives, for every type).
    """
    inode = object.__new__(Inode)
    fields = inode.__dict__
    fields.update(zip(_COLS, row, strict=True))
    fields["type"] = inode_type_of(row[_TYPE_AT])
    return inode


def inode_of(row: Any) -> Inode:
    """An ``Inode`` from an ORM row."""
    m = row._mapping
    return Inode(**{c: m[c] for c in _COLS if c != "type"}, type=InodeType(m["type"]))


def _row_of(inode: Inode) -> tuple[Any, ...]:
    """The ``meta_inodes`` row of an ``Inode``, columns in order (its fields are the columns: ``inode_of_tuple``)."""
    fields = inode.__dict__
    row = [fields[c] for c in _COLS]
    row[_TYPE_AT] = int(row[_TYPE_AT])
    return tuple(row)


class NeedsOrm(RuntimeError):
    """A body on a bare cursor needs the ORM session.

    A transaction body running on a bare DB-API cursor reached a helper that needs the ORM session: the
    caller rolls back and runs the body again in an ordinary ``Store.run``.
    """


class NeedsThread(NeedsOrm):
    """A body on the event loop walked too far.

    A transaction body running on the event loop walked more rows than ``Tx.loop_budget`` allows (a batch
    of deep paths, symlinks into deep trees): the caller rolls back and runs it again in a worker thread.
    """


@dataclass
class Tx:
    """One transaction with the caller and the clock of the call."""

    orm: Session | None
    caller: Caller
    now_ns: int
    _conn: Connection | None = field(default=None)
    _cursor: Any = field(default=None)
    _qmark: bool = field(default=True)
    # What the transaction may still spend walking paths on the event loop; None: no limit (it runs in a
    # thread). Past it: NeedsThread.
    loop_budget: int | None = field(default=None)
    budget: WalkBudget = field(default_factory=WalkBudget)  # the request's, in every execution path (ELOOP)
    paths: PathResolver = field(init=False)
    quotas: QuotaBook = field(init=False)

    def __post_init__(self) -> None:
        self.paths = PathResolver(self, self.caller)
        self.quotas = QuotaBook(self, self.paths)

    def spend(self, cost: int) -> None:
        """Charge a walking query.

        To the request's budget (ELOOP past it) and to the event loop's (``NeedsThread`` past it).
        """
        self.budget.spend(cost)
        if self.loop_budget is not None:
            self.loop_budget -= cost
            if self.loop_budget < 0:
                raise NeedsThread("too long for the event loop")

    # ---- rows ----

    @property
    def session(self) -> Session:
        """The ORM session (``NeedsOrm`` on a bare cursor)."""
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
        """One row of a hot-path query, through the DB-API cursor.

        Straight through the DB-API cursor of this transaction's connection (SQLAlchemy's per-statement machinery costs
        several times the query itself).
        """
        if self._cursor is None:
            self._qmark = self.conn.dialect.paramstyle == "qmark"
            self._cursor = self.conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        self._cursor.execute(sql[0] if self._qmark else sql[1], params)
        if not fetch:
            return None
        row: tuple[Any, ...] | None = self._cursor.fetchone()
        return row

    def execute(self, sql: tuple[str, str], params: tuple[Any, ...]) -> None:
        """A statement that returns no rows, through the cursor (``raw_sql``)."""
        self._fetch(sql, params, fetch=False)

    def fetch_all(self, sql: tuple[str, str], params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        """Every row of a query, through the cursor (``raw_sql``)."""
        self._fetch(sql, params, fetch=False)
        return list(self._cursor.fetchall())

    def get(self, inode_id: int) -> Inode | None:
        """The inode, or None."""
        row = self._fetch(_RAW_GET, (inode_id,))
        return inode_of_tuple(row) if row is not None else None

    def must(self, inode_id: int) -> Inode:
        """The inode; ENOENT when there is none."""
        return self.paths.must(inode_id)

    def lookup(self, parent_id: int, name: str) -> Inode | None:
        """The inode an entry names, or None (a walking step: charged)."""
        self.spend(1)
        row = self._fetch(_RAW_LOOKUP, (parent_id, name))
        return inode_of_tuple(row) if row is not None else None

    def insert(self, inode: Inode) -> None:
        """Insert a new inode's row."""
        self._fetch(_RAW_INSERT_INODE, _row_of(inode), fetch=False)

    def update(self, inode_id: int, **values: Any) -> None:
        """Set columns of an inode's row."""
        unknown = set(values) - _COL_SET
        if unknown or not values:
            raise ValueError(f"not columns of meta_inodes: {sorted(unknown) or 'none given'}")
        self._fetch(_update_sql(tuple(values)), (*values.values(), inode_id), fetch=False)

    def link(self, parent_id: int, name: str, inode: Inode) -> None:
        """Add a directory entry (the directory's times and link count follow)."""
        self._fetch(_RAW_INSERT_DIRENT, (parent_id, name, inode.inode_id, int(inode.type)), fetch=False)
        self._entries_changed(parent_id, 1 if inode.is_dir else 0)

    def unlink_entry(self, parent_id: int, name: str) -> None:
        """Remove a directory entry (the directory's times and link count follow)."""
        row = self._fetch(_RAW_ENTRY_TYPE, (parent_id, name))
        self._fetch(_RAW_UNLINK, (parent_id, name), fetch=False)
        if row is not None:
            self._entries_changed(parent_id, -1 if row[0] == InodeType.DIRECTORY else 0)

    def _entries_changed(self, dir_id: int, dsubdirs: int) -> None:
        """A directory's entries changed.

        POSIX: its mtime and ctime move; its link count follows its subdirectories (each one's ".." names it). Its
        ``entries_version`` moves too: every change of a directory's entries comes here, in its transaction, so a
        listing read at one version is the listing at that version (``ops.listing.ListingCache``).
        """
        self._fetch(_RAW_ENTRIES_CHANGED, (self.now_ns, self.now_ns, dsubdirs, dir_id), fetch=False)

    def has_children(self, dir_id: int) -> bool:
        """Whether the directory has any entry."""
        return self._fetch(_RAW_ANY_CHILD, (dir_id,)) is not None

    def has_sessions(self, inode_id: int) -> bool:
        """Whether the file has any write session (lapsed ones too)."""
        return self._fetch(_RAW_ANY_SESSION, (inode_id,)) is not None

    def count_sessions(self, inode_id: int) -> int:
        """Write sessions of the inode whose lease holds (a lapsed one waits for collection, not counted)."""
        row = self._fetch(_RAW_COUNT_SESSIONS, (inode_id, self.now_ns / 1e9))
        return int(row[0]) if row is not None else 0

    # ---- NamespaceRows and QuotaRows (the rows core's rules read and write) ----

    def walk_dirs(
        self, start_id: int, names: Sequence[str], then: str | None = None
    ) -> tuple[list[DirBits], Inode, Inode | None] | None:
        """See ``NamespaceRows.walk_dirs`` (one query, charged by depth, and as a lookup with ``then``)."""
        if then is None:
            self.spend(1 + len(names) // 2)
            row = self._fetch(_walk_sql(len(names), False), (start_id, *names))
        else:
            self.spend(2 + len(names) // 2)
            row = self._fetch(_walk_sql(len(names), True), (then, start_id, *names))
        if row is None:
            return None
        width = len(_PERM_COLS)
        above = [DirBits._make(row[k * width : (k + 1) * width]) for k in range(len(names))]
        at = len(names) * width
        last = inode_of_tuple(row[at : at + len(_COLS)])
        entry = row[at + len(_COLS) :] if then is not None else None
        return above, last, (inode_of_tuple(entry) if entry and entry[0] is not None else None)

    def ancestry(self, dir_id: int, limit: int) -> list[AncestorRow]:
        """See ``NamespaceRows.ancestry`` (one recursive query)."""
        rows = self.fetch_all(_RAW_ANCESTRY, (dir_id, limit - 1))  # the query's bound is a depth: rows - 1
        self.spend(1 + len(rows) // 16)
        return [AncestorRow._make(r) for r in rows]

    def links(self, inode_id: int, limit: int) -> list[tuple[int, str]]:
        """See ``NamespaceRows.links``."""
        return [(int(p), str(n)) for p, n in self.fetch_all(_RAW_LINKS, (inode_id, limit))]

    def any_quota(self) -> bool:
        """See ``QuotaRows.any_quota``."""
        return self._fetch(_RAW_ANY_QUOTA, ()) is not None

    def quota_rows(self, ids: Sequence[int]) -> list[QuotaRow]:
        """See ``QuotaRows.quota_rows``."""
        if not ids:
            return []
        return [QuotaRow(*row) for row in self.fetch_all(_quota_rows_sql(len(ids)), tuple(ids))]

    def add_usage(self, quota_id: int, *, dbytes: int, dinodes: int, dreserved: int) -> None:
        """See ``QuotaRows.add_usage`` (clamped at 0 in SQL)."""
        self._fetch(_RAW_CHARGE, (dbytes, dbytes, dinodes, dreserved, dreserved, quota_id), fetch=False)

    # ---- write sessions ----

    def session_owner(self, session_id: str) -> tuple[int, str, int | None] | None:
        """(inode id, client id, write limit) of an open write session."""
        row = self._fetch(_RAW_SESSION_OWNER, (session_id,))
        return None if row is None else (int(row[0]), str(row[1]), None if row[2] is None else int(row[2]))

    def insert_session(
        self,
        session_id: str,
        client_id: str,
        inode: Inode,
        write_limit: int | None,
        expires_at: float,
        chain: Sequence[QuotaRow],
    ) -> None:
        """A new write session's row (its quota chain recorded for its reservations)."""
        quota_ids = quota_ids_text(chain)
        self._fetch(
            _RAW_INSERT_SESSION,
            (session_id, client_id, inode.inode_id, self.caller.uid, write_limit, inode.length, expires_at, quota_ids),
            fetch=False,
        )

    def delete_session(self, session_id: str) -> None:
        """Through the cursor, as ``insert_session``: a Close then runs on the inline writer, no ORM session."""
        self._fetch(_RAW_DELETE_SESSION, (session_id,), fetch=False)

    def shrink_reported(self, inode_id: int, length: int) -> None:
        """No write session of the inode reports more than ``length`` (a truncate), through the cursor."""
        self._fetch(_RAW_SHRINK_REPORTED, (length, inode_id, length), fetch=False)

    def mark_cut(self, inode_id: int) -> None:
        """A truncate of the inode was just committed: its open write sessions' reports count no more.

        From now on storage confirms their lengths (see ``fsops.sessions.finish_length``).
        """
        self._fetch(_RAW_MARK_CUT, (self.now_ns, inode_id), fetch=False)

    def pin_times(self, inode_id: int) -> None:
        """An explicit mtime was just set.

        The file's open write sessions report no earlier write time over it (see ``fsops.sessions.finish_length``).
        """
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
                .join(dirents, dirents.c.inode_id == inodes.c.inode_id)
                .where(dirents.c.parent_id.in_(frontier[:500]))
            ).all()
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
        """One entry of ``inode`` is gone: free what is no longer referenced (files go to the GC queue).

        On the cursor (an unlink on the event loop's inline path: through the ORM session it ran twice, ~3x a Create).
        """
        if inode.is_dir:  # (a symlink may have several names, as a file: link(2) does not follow it)
            self._fetch(_RAW_DELETE_INODE, (inode.inode_id,), fetch=False)
            return
        nlink = max(0, inode.nlink - 1)
        if nlink > 0 or self.has_sessions(inode.inode_id):
            self.update(inode.inode_id, nlink=nlink, ctime_ns=self.now_ns)
            return
        self.free_file(inode)

    def free_file(self, inode: Inode) -> None:
        """Delete a file's inode; its chunks join the GC queue (once)."""
        self._fetch(_RAW_DELETE_INODE, (inode.inode_id,), fetch=False)
        if inode.chain_table_id and inode.stripe_size and self._fetch(_RAW_GC_QUEUED, (inode.inode_id,)) is None:
            queued = (inode.inode_id, inode.chain_table_id, inode.stripe_size, inode.chain_begin, inode.shuffle_seed)
            self._fetch(_RAW_GC_ENQUEUE, (*queued, self.now_ns / 1e9), fetch=False)

    def delete_tree_step(self, root: Inode, budget: int) -> tuple[int, bool]:
        """Delete part of a detached tree, deepest first.

        Delete at most ``budget`` inodes of a detached tree (trash), deepest first, so that a huge tree goes
        in many small transactions and is consistent between them. Returns (freed, whether the root is gone).
        """
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
