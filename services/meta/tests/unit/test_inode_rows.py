"""Rows of ``meta_inodes`` become the same ``Inode`` the constructor makes, and ``inode_pb`` answers each type as the
proto documents it (no store: the row-to-Inode path is filled in place, see ``ff_meta.store.tx.inode_of_tuple``)."""

from __future__ import annotations

import dataclasses

import pytest

from ff_meta.core.model import Inode, InodeType
from ff_meta.store.tx import _COLS, inode_of_tuple
from ff_meta.wire import inode_pb
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
