"""Rows of ``meta_inodes`` become the same ``Inode`` the constructor makes, and ``inode_pb`` answers each type as the
proto documents it (no store: the row-to-Inode path is filled in place, see ``ff_meta.store.tx.inode_of_tuple``); what
the servicer builds once (``StatResponses``, ``ListResponses``, ``caller``) is what it would build anew."""

from __future__ import annotations

import dataclasses

import pytest

from ff_meta.core.model import Inode, InodeType
from ff_meta.core.perms import Caller
from ff_meta.ops.types import DirPage
from ff_meta.store.tx import _COLS, inode_of_tuple
from ff_meta.wire import ListResponses, StatResponses, caller, inode_pb
from ff_rpc.auth import Principal, Role, set_current_principal
from fireflyer.meta.v1 import meta_pb2 as pb

pytestmark = pytest.mark.unit


def _row(kind: InodeType) -> tuple[object, ...]:
    values: dict[str, object] = {f.name: 7 + k for k, f in enumerate(dataclasses.fields(Inode))}
    values.update(type=int(kind), symlink_target="../t" if kind is InodeType.SYMLINK else "")
    return tuple(values[c] for c in _COLS)


@pytest.mark.parametrize("kind", list(InodeType))
def test_a_row_gives_the_inode_the_constructor_gives(kind: InodeType) -> None:
    row = _row(kind)
    made = Inode(**{**dict(zip(_COLS, row, strict=True)), "type": kind})
    got = inode_of_tuple(row)
    assert got == made and hash(got) == hash(made) and got.type is kind
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.mode = 0  # type: ignore[misc]  # still frozen
    assert got.with_(mode=0o600).mode == 0o600 and got.mode == made.mode


def test_a_row_of_an_unknown_type_is_refused() -> None:
    with pytest.raises(ValueError):
        inode_of_tuple(tuple(99 if c == "type" else v for c, v in zip(_COLS, _row(InodeType.FILE), strict=True)))
    with pytest.raises(ValueError):
        inode_of_tuple(_row(InodeType.FILE)[:-1])  # a column short


@pytest.mark.parametrize("kind", list(InodeType))
def test_inode_pb_answers_each_type(kind: InodeType) -> None:
    node = inode_of_tuple(_row(kind))
    msg = inode_pb(node, sessions=2)
    is_dir = kind is InodeType.DIRECTORY
    assert (msg.type, msg.inode_id, msg.num_write_sessions) == (int(kind), node.inode_id, 2)
    assert msg.nlink == (max(2, node.nlink + 1) if is_dir else node.nlink)
    assert msg.parent_inode_id == (node.parent_id if is_dir else 0)
    assert msg.symlink_target == ("../t" if kind is InodeType.SYMLINK else "")
    assert msg.HasField("layout") == (is_dir or kind is InodeType.FILE)
    if msg.HasField("layout"):
        assert (msg.layout.chain_table_id, msg.layout.chunk_size_bytes, msg.layout.shuffle_seed) == (
            node.chain_table_id,
            node.chunk_size,
            node.shuffle_seed,
        )
    assert pb.DirEntry(name="x", inode=msg).inode == msg


def test_a_stat_answer_is_built_once_per_inode_object() -> None:
    stats = StatResponses(max_entries=2)
    node = inode_of_tuple(_row(InodeType.FILE))
    first = stats.response(node, 0)
    assert first.inode == inode_pb(node, 0)
    assert stats.response(node, 0) is first  # the read cache's same answer: the same message
    with_sessions = stats.response(node, 3)  # the same inode with another count: built again, and right
    assert with_sessions is not first and with_sessions.inode.num_write_sessions == 3
    equal = inode_of_tuple(_row(InodeType.FILE))  # an equal inode read again: its own message, equal
    assert stats.response(equal, 0) is not first and stats.response(equal, 0) == first
    others = [inode_of_tuple(_row(InodeType.DIRECTORY)) for _ in range(2)]
    kept = stats.response(others[0], 0)
    stats.response(others[1], 0)  # a third inode in a cache of two: the oldest went
    assert stats.response(others[1], 0).inode == inode_pb(others[1], 0)
    assert stats.response(others[0], 0) is kept and stats.response(node, 0) is not first


def test_a_listing_page_is_built_once_per_entries_list() -> None:
    entries = [(f"f{k}", 100 + k, int(InodeType.FILE), None) for k in range(3)]
    listings = ListResponses(max_entries=5)
    first = listings.response(DirPage(entries, ""))
    assert [e.name for e in first.entries] == ["f0", "f1", "f2"] and first.next_page_token == ""
    assert listings.response(DirPage(entries, "")) is first
    assert listings.response(DirPage(entries, "f2")) is not first  # another last name: another page token
    assert listings.response(DirPage(list(entries), "")) is not first  # equal names from another list: built again
    big = [(f"g{k}", 200 + k, int(InodeType.FILE), None) for k in range(6)]  # over the bound alone: not kept
    assert listings.response(DirPage(big, "")) is not listings.response(DirPage(big, ""))


def test_the_caller_of_a_principal_is_made_once_and_follows_the_principal() -> None:
    alice = Principal(uid=1000, name="alice", gids=(1000, 7))
    admin = Principal(uid=1, name="root-ish", role=Role.ADMIN)
    set_current_principal(alice)
    try:
        made = caller()
        assert made == Caller(1000, (1000, 7), "alice", False) and caller() is made
        set_current_principal(admin)
        assert caller() == Caller(1, (), "root-ish", True)
        set_current_principal(Principal(uid=1000, name="alice", gids=(1000,)))  # another principal: its own caller
        assert caller() == Caller(1000, (1000,), "alice", False)
    finally:
        set_current_principal(None)
