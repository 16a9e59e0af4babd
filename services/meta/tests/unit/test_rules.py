"""Meta's path, permission and quota rules (``core.resolve``, ``core.quota``) over rows in a dict: no database.

The tree (uid 1000 is alice, 1001 bob, both in no shared group):

    /            1777 root
    /pub         0755 alice      /pub/f   0644 alice   (a second name of /a/s/f)
    /a           0700 alice      /a/s     0755 alice   /a/s/f   0644 alice
    /a/s/up -> ../..             /gone    a file of alice's no entry names (removed while open)
    /t           a directory of alice's in the trash (parent 0)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import pytest

from ff_meta.core import resolve as resolve_module
from ff_meta.core.errors import FsCode, FsError
from ff_meta.core.layout import choose_layout
from ff_meta.core.model import NO_LIMIT, ROOT_INODE_ID, Defaults, Inode, InodeType, LayoutSpec, PathAt, QuotaRow
from ff_meta.core.perms import Caller, checked_mode, checked_owner, require_session_owner
from ff_meta.core.quota import QuotaBook, check_charge, headroom, quota_room
from ff_meta.core.resolve import PathResolver
from ff_meta.core.rows import AncestorRow, DirBits

pytestmark = pytest.mark.unit

ALICE = Caller(1000, (1000,), "alice")
BOB = Caller(1001, (1001,), "bob")
ROOT = Caller(0, (0,), "root", is_root=True)
A, S, PUB, F, UP, GONE, T, DEEP = 10, 11, 12, 13, 14, 15, 16, 17


class DictRows:
    """``NamespaceRows`` and ``QuotaRows`` over dicts, as ``store.tx.Tx`` answers them over SQL."""

    def __init__(self) -> None:
        self.inodes: dict[int, Inode] = {}
        self.entries: dict[tuple[int, str], int] = {}
        self.quotas: dict[int, QuotaRow] = {}

    def add(self, inode: Inode, parent: int = 0, name: str = "") -> Inode:
        self.inodes[inode.inode_id] = inode
        if parent:
            self.entries[(parent, name)] = inode.inode_id
        return inode

    def get(self, inode_id: int) -> Inode | None:
        return self.inodes.get(inode_id)

    def lookup(self, parent_id: int, name: str) -> Inode | None:
        child = self.entries.get((parent_id, name))
        return None if child is None else self.inodes[child]

    def walk_dirs(
        self, start_id: int, names: Sequence[str], then: str | None = None
    ) -> tuple[list[DirBits], Inode, Inode | None] | None:
        above, cur = [], self.inodes[start_id]
        for name in names:
            above.append(DirBits(cur.inode_id, int(cur.type), cur.mode, cur.uid, cur.gid))
            nxt = self.lookup(cur.inode_id, name)
            if nxt is None:
                return None
            cur = nxt
        return above, cur, (None if then is None else self.lookup(cur.inode_id, then))

    def ancestry(self, dir_id: int, limit: int) -> list[AncestorRow]:
        out: list[AncestorRow] = []
        cur = self.inodes.get(dir_id)
        while cur is not None and len(out) < limit:
            name = next((n for (p, n), i in self.entries.items() if p == cur.parent_id and i == cur.inode_id), None)
            out.append(AncestorRow(cur.inode_id, int(cur.type), cur.mode, cur.uid, cur.gid, cur.parent_id, name))
            if cur.inode_id == ROOT_INODE_ID:
                break
            cur = self.inodes.get(cur.parent_id)
        return out

    def links(self, inode_id: int, limit: int) -> list[tuple[int, str]]:
        return sorted(k for k, i in self.entries.items() if i == inode_id)[:limit]

    def any_quota(self) -> bool:
        return bool(self.quotas)

    def quota_rows(self, ids: Sequence[int]) -> list[QuotaRow]:
        return [self.quotas[i] for i in ids if i in self.quotas]

    def add_usage(self, quota_id: int, *, dbytes: int, dinodes: int, dreserved: int) -> None:
        q = self.quotas[quota_id]
        self.quotas[quota_id] = dataclasses.replace(
            q, used_bytes=max(0, q.used_bytes + dbytes), used_inodes=q.used_inodes + dinodes,
            reserved_bytes=max(0, q.reserved_bytes + dreserved))  # fmt: skip


def directory(inode_id: int, mode: int, uid: int, parent: int) -> Inode:
    return Inode(inode_id=inode_id, type=InodeType.DIRECTORY, mode=mode, uid=uid, gid=uid, parent_id=parent)


def file(inode_id: int, uid: int = 1000, mode: int = 0o644) -> Inode:
    return Inode(inode_id=inode_id, type=InodeType.FILE, mode=mode, uid=uid, gid=uid)


@pytest.fixture
def rows() -> DictRows:
    r = DictRows()
    r.add(directory(ROOT_INODE_ID, 0o1777, 0, ROOT_INODE_ID))
    r.add(directory(PUB, 0o755, 1000, ROOT_INODE_ID), ROOT_INODE_ID, "pub")
    r.add(directory(A, 0o700, 1000, ROOT_INODE_ID), ROOT_INODE_ID, "a")
    r.add(directory(S, 0o755, 1000, A), A, "s")
    r.add(file(F), S, "f")
    r.entries[(PUB, "f")] = F
    r.add(Inode(inode_id=UP, type=InodeType.SYMLINK, mode=0o777, uid=1000, gid=1000, symlink_target="../.."), S, "up")
    r.add(file(GONE))
    r.add(directory(T, 0o755, 1000, 0))
    return r


def outcome(fn: Callable[[], object]) -> object:
    try:
        return fn()
    except FsError as err:
        return err.fs_code


@pytest.mark.parametrize(("caller", "path", "follow", "expect"), [
    (ALICE, "/a/s/f", True, F),
    (ALICE, "/a/./s/../s/f", True, F),
    (ALICE, "/a/" + "/".join(["s", "up", "a"] * 40) + "/s/f", True, F),  # 40 hops: the limit
    (ALICE, "/a/s/up/pub/f", True, F),  # a symlink in the middle, relative target
    (ALICE, "/a/s/up", False, UP),
    (ALICE, "/..", True, ROOT_INODE_ID),  # the root is its own parent
    (ALICE, "/a/s/f/x", True, FsCode.NOT_DIRECTORY),
    (ALICE, "/a/nope/x", True, FsCode.NOT_FOUND),
    (BOB, "/a/s/f", True, FsCode.ACCESS_DENIED),  # /a is 0700: no search for bob
    (BOB, "/pub/f", True, F),  # the same file through a folder bob may search
    (ROOT, "/a/s/f", True, F),
    (ALICE, "/a/" + "/".join(["s", "up", "a"] * 41) + "/s/f", True, FsCode.SYMLINK_LOOP),  # 41 hops
])  # fmt: skip
def test_resolve(rows: DictRows, caller: Caller, path: str, follow: bool, expect: object) -> None:
    got = outcome(lambda: PathResolver(rows, caller).existing(PathAt(0, path), follow_last=follow).inode)
    assert (got.inode_id if isinstance(got, Inode) else got) == expect


def test_a_missing_last_entry_resolves_to_its_folder_and_name(rows: DictRows) -> None:
    r = PathResolver(rows, ALICE).resolve(PathAt(0, "/a/s/new"), follow_last=True)
    assert (r.inode, r.parent.inode_id if r.parent else None, r.name) == (None, S, "new")


@pytest.mark.parametrize(("caller", "start", "path", "expect"), [
    (ALICE, S, "f", F),  # relative to an inode alice may reach
    (BOB, S, "f", FsCode.ACCESS_DENIED),  # issue 16: a folder below one bob may not search
    (BOB, PUB, "f", F),
    (BOB, F, "", F),  # the file itself: one of its names is in a folder bob may search
    (BOB, T, "", FsCode.NOT_FOUND),  # in the trash: not in the namespace
    (ALICE, T, "", FsCode.NOT_FOUND),
    (ROOT, T, "", T),
    (ALICE, GONE, "", GONE),  # removed while open: its owner only
    (BOB, GONE, "", FsCode.NOT_FOUND),
    (ALICE, 999, "", FsCode.NOT_FOUND),
])  # fmt: skip
def test_inode_addressing_gives_no_access_a_path_would_not(rows: DictRows, caller: Caller, start: int, path: str,
                                                           expect: object) -> None:  # fmt: skip
    got = outcome(lambda: PathResolver(rows, caller).existing(PathAt(start, path), follow_last=True).inode)
    assert (got.inode_id if isinstance(got, Inode) else got) == expect


def test_reachable_path_takes_a_name_the_caller_may_search(rows: DictRows) -> None:
    assert PathResolver(rows, ALICE).reachable_path(rows.inodes[F]) == "/a/s/f"  # the first name, by folder id
    assert PathResolver(rows, BOB).reachable_path(rows.inodes[F]) == "/pub/f"
    assert PathResolver(rows, BOB).path_of(rows.inodes[S]) == "/a/s"  # no permission check in path_of
    del rows.entries[(PUB, "f")]
    assert outcome(lambda: PathResolver(rows, BOB).reachable_path(rows.inodes[F])) is FsCode.ACCESS_DENIED


def test_a_tree_deeper_than_the_limit_is_name_too_long(rows: DictRows, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resolve_module, "MAX_DIR_DEPTH", 3)
    rows.add(directory(DEEP, 0o755, 1000, S), S, "d")  # /a/s/d: depth 3
    paths = PathResolver(rows, ALICE)
    assert paths.depth_of(DEEP) == 3 and paths.ancestors(rows.inodes[DEEP]) == [DEEP, S, A, ROOT_INODE_ID]
    rows.add(directory(DEEP + 1, 0o755, 1000, DEEP), DEEP, "e")  # depth 4
    assert outcome(lambda: paths.depth_of(DEEP + 1)) is FsCode.NAME_TOO_LONG


def quota(inode_id: int, max_bytes: int = 0, max_inodes: int = 0, used: int = 0, inodes: int = 0,
          reserved: int = 0) -> QuotaRow:  # fmt: skip
    return QuotaRow(inode_id, max_bytes, max_inodes, used, inodes, reserved)


@pytest.mark.parametrize(("chain", "change", "expect"), [
    ([quota(A, max_bytes=100, used=60)], {"dbytes": 40}, None),
    ([quota(A, max_bytes=100, used=60)], {"dbytes": 41}, FsCode.QUOTA_EXCEEDED),
    ([quota(A, max_bytes=100, used=60, reserved=30)], {"dreserved": 11}, FsCode.QUOTA_EXCEEDED),  # reserved counts
    ([quota(A, max_bytes=100, used=60, reserved=30)], {"dbytes": 20, "dreserved": -20}, None),  # out of a reservation
    ([quota(A, max_bytes=100, used=500)], {"dbytes": -10}, None),  # shrinking never fails
    ([quota(A, max_inodes=2, inodes=2)], {"dinodes": 1}, FsCode.QUOTA_EXCEEDED),
    ([quota(A, max_inodes=2, inodes=2)], {"dinodes": -1}, None),
    ([quota(S), quota(A, max_inodes=5, inodes=5)], {"dinodes": 1}, FsCode.QUOTA_EXCEEDED),  # any quota above
    ([], {"dbytes": 1 << 60}, None),
])  # fmt: skip
def test_check_charge(chain: list[QuotaRow], change: dict[str, int], expect: FsCode | None) -> None:
    assert outcome(lambda: check_charge(chain, **change)) is expect


def test_room_and_headroom_are_the_tightest_byte_quota() -> None:
    chain = [quota(S, max_inodes=9), quota(A, max_bytes=100, used=30, reserved=20), quota(1, max_bytes=1000)]
    assert quota_room(chain) == (50, A) and quota_room(chain, reserved=60) == (0, A)
    assert headroom(chain) == 50 and headroom([quota(S, max_inodes=9)]) == NO_LIMIT
    assert quota_room([quota(S, max_inodes=9)]) is None


def test_the_quota_book_charges_the_chain_nearest_first_all_or_nothing(rows: DictRows) -> None:
    rows.quotas = {A: quota(A, max_bytes=100, max_inodes=10), ROOT_INODE_ID: quota(ROOT_INODE_ID, max_inodes=3)}
    book = QuotaBook(rows, PathResolver(rows, ALICE))
    chain = book.chain(rows.inodes[S])
    assert [q.inode_id for q in chain] == [A, ROOT_INODE_ID]
    book.charge(chain, dbytes=50, dinodes=3)
    assert (rows.quotas[A].used_bytes, rows.quotas[A].used_inodes, rows.quotas[ROOT_INODE_ID].used_inodes) == (50, 3, 3)
    refused = outcome(lambda: book.charge(book.chain(rows.inodes[S]), dinodes=1))
    assert refused is FsCode.QUOTA_EXCEEDED and rows.quotas[A].used_inodes == 3  # the root's limit: nothing charged
    book.charge(book.chain(rows.inodes[S]), dbytes=-80, dinodes=1, enforce=False)  # removals are not refused
    assert (rows.quotas[A].used_bytes, rows.quotas[ROOT_INODE_ID].used_inodes) == (0, 4)
    assert [q.inode_id for q in book.of_ids(f"{ROOT_INODE_ID},{A}")] == [ROOT_INODE_ID, A]
    assert QuotaBook(DictRows(), PathResolver(rows, ALICE)).chain(rows.inodes[S]) == []  # no quota anywhere


FILE = Inode(inode_id=F, type=InodeType.FILE, mode=0o644, uid=1000, gid=1000)


@pytest.mark.parametrize(("caller", "mode", "expect"), [
    (ALICE, 0o600, 0o600),
    (ALICE, 0o2755, 0o2755),  # her own group: set-group-ID kept
    (Caller(1000, (1002,), "alice elsewhere"), 0o2755, 0o755),  # not in the file's group: dropped (Linux)
    (ROOT, 0o2755, 0o2755),
    (BOB, 0o777, FsCode.NOT_PERMITTED),  # not the owner
    (ALICE, 0o17777, FsCode.INVALID_ARGUMENT),
])  # fmt: skip
def test_chmod_rules(caller: Caller, mode: int, expect: object) -> None:
    assert outcome(lambda: checked_mode(caller, FILE, mode, "/f")) == expect


@pytest.mark.parametrize(("caller", "uid", "gid", "expect"), [
    (ROOT, 1001, 1001, {"uid": 1001, "gid": 1001}),
    (ROOT, 1000, None, {}),  # no change
    (ALICE, 1000, None, {}),  # "changing" the owner to herself
    (ALICE, 1001, None, FsCode.NOT_PERMITTED),  # giving a file away: root only
    (Caller(1000, (1000, 1005), "alice"), None, 1005, {"gid": 1005}),  # one of her groups
    (ALICE, None, 1005, FsCode.NOT_PERMITTED),  # not her group
    (BOB, None, 1001, FsCode.NOT_PERMITTED),  # not the owner
])  # fmt: skip
def test_chown_rules(caller: Caller, uid: int | None, gid: int | None, expect: object) -> None:
    assert outcome(lambda: checked_owner(caller, FILE, uid, gid, "/f")) == expect


@pytest.mark.parametrize(("caller", "expect"), [(ALICE, None), (ROOT, None), (BOB, FsCode.ACCESS_DENIED)])
def test_a_write_session_is_its_owners(caller: Caller, expect: FsCode | None) -> None:
    assert outcome(lambda: require_session_owner(caller, 1000)) is expect


DEFAULTS = Defaults(LayoutSpec(1, 1 << 20, 16), {1: (3, 6), 2: (1, 4)}, 30.0)
NO_LAYOUT_DIR = directory(PUB, 0o755, 1000, ROOT_INODE_ID)
LAYOUT_DIR = dataclasses.replace(NO_LAYOUT_DIR, chain_table_id=2, chunk_size=1 << 16, stripe_size=2)


@pytest.mark.parametrize(("parent", "asked", "expect"), [
    (NO_LAYOUT_DIR, None, (1, 3, 1 << 20, 6)),  # the defaults, the stripe capped by the table's 6 chains
    (LAYOUT_DIR, None, (2, 1, 1 << 16, 2)),  # the directory's
    (LAYOUT_DIR, LayoutSpec(1, 0, 3), (1, 3, 1 << 20, 3)),  # the asked table; the default chunk size
    (LAYOUT_DIR, LayoutSpec(0, 1 << 22, 0), (2, 1, 1 << 22, 2)),  # only a chunk size asked: the directory's table
    (NO_LAYOUT_DIR, LayoutSpec(7, 0, 0), FsCode.INVALID_ARGUMENT),  # a table that does not exist
    (NO_LAYOUT_DIR, LayoutSpec(1, 1000, 0), FsCode.INVALID_ARGUMENT),  # not a power of two
])  # fmt: skip
def test_layout_of_a_new_file(parent: Inode, asked: LayoutSpec | None, expect: object) -> None:
    got = outcome(lambda: choose_layout(parent, asked, DEFAULTS, inode_id=13))
    if isinstance(got, dict):
        got = (got["chain_table_id"], got["chain_table_version"], got["chunk_size"], got["stripe_size"])
        assert choose_layout(parent, asked, DEFAULTS, inode_id=13)["chain_begin"] == 13 % (6 if got[0] == 1 else 4)
    assert got == expect
    no_default = Defaults(DEFAULTS.layout, {2: (1, 4)}, 30.0)  # the default table is gone: ENOSPC, not EINVAL
    assert outcome(lambda: choose_layout(NO_LAYOUT_DIR, None, no_default, 13)) is FsCode.NO_SPACE
