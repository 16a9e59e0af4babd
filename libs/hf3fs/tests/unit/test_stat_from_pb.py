"""``Stat.from_pb`` fills the frozen dataclass in place: the same ``Stat`` the constructor makes, every field set."""

from __future__ import annotations

import dataclasses

import pytest

from fireflyer.meta.v1 import meta_pb2 as pb
from hf3fs.entries import Stat


def _inode(kind: pb.InodeType.ValueType) -> pb.Inode:
    return pb.Inode(
        inode_id=11, type=kind, mode=0o640, uid=12, gid=13, nlink=14, atime_ns=15, mtime_ns=16, ctime_ns=17,
        length_bytes=18, symlink_target="../t", num_write_sessions=19, rdev=20,
        layout=pb.Layout(chain_table_id=21, chunk_size_bytes=22, stripe_size=23),
    )  # fmt: skip


def test_a_stat_from_an_inode_message_is_the_one_the_constructor_makes() -> None:
    got = Stat.from_pb(_inode(pb.INODE_TYPE_FILE))
    made = Stat(
        inode_id=11, type="file", mode=0o640, uid=12, gid=13, nlink=14, size=18, atime_ns=15, mtime_ns=16, ctime_ns=17,
        symlink_target="../t", chunk_size=22, stripe_size=23, chain_table_id=21, write_sessions=19, rdev=20,
    )  # fmt: skip
    assert got == made and hash(got) == hash(made) and repr(got) == repr(made)
    assert set(vars(got)) == {f.name for f in dataclasses.fields(Stat)}  # no field left to a default it never got
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.mode = 0  # type: ignore[misc]  # still frozen
    assert dataclasses.replace(got, mode=0o600).mode == 0o600 and got.st_mode == 0o100640


def test_an_unknown_type_and_no_layout_read_as_unknown_and_zero() -> None:
    got = Stat.from_pb(pb.Inode(inode_id=5, type=pb.INODE_TYPE_UNSPECIFIED))
    assert (got.type, got.chunk_size, got.stripe_size, got.chain_table_id, got.size) == ("unknown", 0, 0, 0, 0)
    assert got == Stat(inode_id=5, type="unknown", mode=0, uid=0, gid=0, nlink=0, size=0, atime_ns=0, mtime_ns=0,
                       ctime_ns=0)  # fmt: skip
