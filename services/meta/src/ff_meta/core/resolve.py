"""Path resolution and inode addressing (pure), against ``NamespaceRows``.

Walking a path with search permission on every directory, symlinks, ``..``, and the rule that an inode id gives no
access a path would not. Against ``NamespaceRows``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ff_meta.core.errors import FsCode, fs_error
from ff_meta.core.model import ROOT_INODE_ID, Inode, InodeType, PathAt
from ff_meta.core.paths import MAX_COMPONENTS_WALKED, MAX_DIR_DEPTH, MAX_SYMLINK_HOPS, join, split_path
from ff_meta.core.perms import Caller, X, allowed, allowed_bits, require
from ff_meta.core.rows import AncestorRow, NamespaceRows

# One query walks down at most this many directories.
MAX_FAST_DEPTH = 16
# Inode addressing of a file looks at most this many of its entries for one the caller may reach.
MAX_LINKS_CHECKED = 16


@dataclass
class Resolved:
    """Where a path leads.

    The inode (None: the last entry is missing), the directory holding the last entry (None for the root or an inode
    addressed by itself) and that entry's name.
    """

    inode: Inode | None
    parent: Inode | None = None
    name: str = ""


@dataclass
class PathResolver:
    """The caller's path lookups in one transaction.

    With what they learnt (directories the caller may pass, inodes it may reach, with ``cache_walks`` the walks down)
    remembered for the transaction's next ones.
    """

    rows: NamespaceRows
    caller: Caller
    # Read-only batches (BatchStat) remember the directory walks of their paths: files of one folder, or the
    # same symlinks, are walked once.
    cache_walks: bool = False
    _passable: set[int] = field(default_factory=set)  # directories a lookup may pass (X here and above)
    _reachable: set[int] = field(default_factory=set)  # inodes check_reachable let through
    _walks: dict[tuple[int, tuple[str, ...]], Inode] = field(default_factory=dict)

    def must(self, inode_id: int) -> Inode:
        """The inode; ENOENT when there is none."""
        inode = self.rows.get(inode_id)
        if inode is None:
            raise fs_error(FsCode.NOT_FOUND, f"inode {inode_id} does not exist")
        return inode

    def existing(self, at: PathAt, *, follow_last: bool) -> Resolved:
        """``resolve``, ENOENT when the last entry is missing."""
        r = self.resolve(at, follow_last=follow_last)
        if r.inode is None:
            raise fs_error(FsCode.NOT_FOUND, f"no such file or directory: {at.path}")
        return r

    def resolve(  # noqa: PLR0912
        self,
        at: PathAt,
        *,
        follow_last: bool,
        hops: int = 0,
        reached: bool = False,
        walked: int = 0,
    ) -> Resolved:
        """Walk a path to where it leads.

        Walk ``at`` (search permission on every directory walked).

        A lookup that starts at an inode (a relative path or the inode itself) is refused as a path lookup from the root
        would be: see ``check_reachable``; ``reached`` skips that for a directory this transaction already walked to.
        ``walked``: components of the symlink expansions before this one (``MAX_COMPONENTS_WALKED``).
        """
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
        entry: Inode | None = None
        entry_known = False  # the walk down looked up the last component too (``entry``)
        while begin < len(parts) - 1:
            # Fast path: the directories down to the last component, up to MAX_FAST_DEPTH of them per query, and the
            # last component with the query that reaches its directory (a plain name, when walks are not reused).
            chunk = parts[begin : min(begin + MAX_FAST_DEPTH, len(parts) - 1)]
            reaches_last = begin + len(chunk) == len(parts) - 1 and parts[-1] != ".." and not self.cache_walks
            then = parts[-1] if reaches_last else None
            down = self._walk_dirs(cur_id, chunk, parts[:begin], then) if ".." not in chunk else None
            if down is None:
                break
            cur, entry = down
            cur_id, begin, entry_known = cur.inode_id, begin + len(chunk), then is not None
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
            child = entry if last and entry_known else self.rows.lookup(cur.inode_id, comp)
            if child is None:
                if last:
                    return Resolved(None, cur, comp)
                raise fs_error(FsCode.NOT_FOUND, f"no such file or directory: {'/'.join(parts[: i + 1])}")
            if child.is_symlink and (follow_last or not last):
                if hops >= MAX_SYMLINK_HOPS:
                    raise fs_error(FsCode.SYMLINK_LOOP, "too many levels of symbolic links")
                rest = "/".join([child.symlink_target, *parts[i + 1 :]])
                return self.resolve(
                    PathAt(cur.inode_id, rest), follow_last=follow_last, hops=hops + 1, reached=True, walked=walked
                )
            if last:
                return Resolved(child, cur, comp)
            cur = child
        raise AssertionError("unreachable")

    def _walk_dirs(
        self, start: int, names: list[str], what: list[str], then: str | None = None
    ) -> tuple[Inode, Inode | None] | None:
        """Several directories down in one query, or None.

        The directory ``names`` lead to from directory ``start``, with search permission checked on
        ``start`` and every directory before the last (``what``: the components walked before ``start``, for
        the error), and with ``then`` the inode the entry ``then`` of that directory names (None: none; its search
        permission is the caller's to check); None when one is missing or is not a directory (then the caller walks
        step by step, which finds the exact error or follows symlinks).
        """
        key = (start, tuple(names))
        if self.cache_walks and key in self._walks:
            return self._walks[key], None
        found = self.rows.walk_dirs(start, names, then)
        if found is None:
            return None
        above, last, entry = found
        if not last.is_dir or any(d.type != InodeType.DIRECTORY for d in above):
            return None
        for k, d in enumerate(above):
            if not allowed_bits(self.caller, X, uid=d.uid, gid=d.gid, mode=d.mode, is_dir=True):
                raise fs_error(FsCode.ACCESS_DENIED, f"permission denied: search {'/'.join(what + names[:k]) or '/'}")
        if self.cache_walks:
            self._walks[key] = last
        return last, entry

    # ---- the way up: inode addressing, paths, depth ----

    def ancestry(self, dir_id: int) -> list[AncestorRow]:
        """A directory and every directory above it.

        Nearest first, ending at the root (or where a tree in the trash was cut off).

        Raises:
            FsInvalid: the tree is deeper than ``MAX_DIR_DEPTH`` there (ENAMETOOLONG).
        """
        rows = list(self.rows.ancestry(dir_id, MAX_DIR_DEPTH + 2))  # one past the deepest allowed: seen as such
        if len(rows) > MAX_DIR_DEPTH + 1 or (len(rows) == MAX_DIR_DEPTH + 1 and rows[-1].inode_id != ROOT_INODE_ID):
            raise fs_error(FsCode.NAME_TOO_LONG, f"directory tree deeper than {MAX_DIR_DEPTH} levels")
        return rows

    def ancestors(self, dir_inode: Inode) -> list[int]:
        """The directory and every directory above it up to the root."""
        return [r.inode_id for r in self.ancestry(dir_inode.inode_id)]

    def depth_of(self, dir_id: int) -> int:
        """How many levels below the root a directory is (the root: 0)."""
        return len(self.ancestry(dir_id)) - 1

    def _passable_why(self, dir_id: int) -> FsCode | None:
        """Why a lookup may not pass through a directory (None: it may).

        None when a path lookup of the caller may pass through directory ``dir_id`` (search permission on it
        and on every directory above it); else why not: NOT_FOUND (not in the namespace) or ACCESS_DENIED.
        """
        if dir_id in self._passable:
            return None
        rows = self.ancestry(dir_id)
        if not rows or rows[-1].inode_id != ROOT_INODE_ID:
            return FsCode.NOT_FOUND
        for row in reversed(rows):  # from the root down: every directory passed is remembered
            node = Inode(inode_id=row.inode_id, type=InodeType(row.type), mode=row.mode, uid=row.uid, gid=row.gid)
            if not node.is_dir or not allowed(self.caller, node, X):
                return FsCode.ACCESS_DENIED
            self._passable.add(node.inode_id)
        return None

    def _reachable_link(self, inode: Inode) -> tuple[FsCode | None, tuple[int, str] | None]:
        """An entry of a file that the caller may reach, or why there is none.

        For a file or symlink: (None, (parent id, name)) of an entry naming it whose directory the caller
        may pass through, else (why not, None). A file no entry names (removed while open, or in the trash)
        is reachable by its owner only, without an entry.
        """
        links = self.rows.links(inode.inode_id, MAX_LINKS_CHECKED)
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
        """Refuse inode addressing where a path lookup would be refused.

        Inode addressing (FUSE, relative paths): refused where a path lookup from the root would be, so that
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
        """The absolute path of an inode, through names the caller may search.

        See ``check_reachable``; for a file with several links, one the caller may search.
        """
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
            links = self.rows.links(inode.inode_id, 1)
            if not links:
                raise fs_error(FsCode.NOT_FOUND, f"inode {inode.inode_id} is not in the namespace")
            return join(self.path_of(self.must(int(links[0][0]))), str(links[0][1]))
        rows = self.ancestry(inode.inode_id)
        names = [r.name for r in rows[:-1]]
        if not rows or rows[-1].inode_id != ROOT_INODE_ID or any(n is None for n in names):
            raise fs_error(FsCode.NOT_FOUND, f"inode {inode.inode_id} is not in the namespace")
        return "/" + "/".join(reversed(names))  # type: ignore[arg-type]

    def folder_of(self, r: Resolved) -> Inode | None:
        """The folder whose quotas a file's bytes count against.

        The one it was reached through, or, for a file addressed by its own inode (no path), the folder of its first
        name (None: no name is left).
        """
        if r.parent is not None or r.inode is None or r.inode.is_dir:
            return r.parent
        links = self.rows.links(r.inode.inode_id, 1)
        return None if not links else self.must(int(links[0][0]))
