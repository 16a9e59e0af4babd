"""Quota errors at write time (issue 16, defect 5, meta's side): ReserveSpace grants all or nothing, or with
``partial`` as much as the directory quota allows, and says how much is left, so a client can cut a write
short where the quota ends and report EDQUOT from the writing call instead of the close."""

from __future__ import annotations

import uuid
from typing import Any

import grpc

import hf3fs
from ff_rpc import RpcError
from ff_testing.hostile import client_method
from fireflyer.meta.v1 import meta_pb2 as pb

MiB = 1 << 20


def call(fs: hf3fs.FileSystem, method: str, request: Any) -> Any:
    try:
        return fs._run(fs._meta.call(lambda m: getattr(m, client_method(method)), request))
    except RpcError as err:
        return err.code


def test_partial_reservation_stops_at_the_quota(fs: hf3fs.FileSystem, admin_fs: hf3fs.FileSystem, home: str) -> None:
    admin_fs.set_quota(home, max_bytes=3 * MiB)
    with fs.open(f"{home}/existing", "wb") as f:
        f.write(b"e" * MiB)
    opened = call(fs, "Create", pb.CreateRequest(path=pb.PathAt(path=f"{home}/f"), mode=0o644,
                                                 open_mode=pb.OPEN_MODE_WRITE, session_id=uuid.uuid4().hex,
                                                 client_id=fs.client_id))  # fmt: skip
    sid, inode_id = opened.session.session_id, opened.inode.inode_id
    assert opened.session.write_limit_bytes == 0

    def reserve(want: int, partial: bool) -> Any:
        return call(fs, "ReserveSpace", pb.ReserveSpaceRequest(inode_id=inode_id, session_id=sid,
                                                               write_limit_bytes=want, partial=partial))  # fmt: skip

    assert reserve(5 * MiB, partial=False) == grpc.StatusCode.RESOURCE_EXHAUSTED  # all or nothing: nothing
    first = reserve(MiB // 2, partial=False)
    assert (first.write_limit_bytes, first.available_bytes) == (MiB // 2, 3 * MiB // 2)
    cut = reserve(5 * MiB, partial=True)
    assert (cut.write_limit_bytes, cut.available_bytes) == (2 * MiB, 0)  # where the quota ends
    assert reserve(2 * MiB + 1, partial=True) == grpc.StatusCode.RESOURCE_EXHAUSTED
    again = reserve(MiB, partial=True)  # below the limit held: answered as is
    assert (again.write_limit_bytes, again.available_bytes) == (2 * MiB, 0)
    quota = fs.get_quota(home)
    assert quota is not None and quota.used_bytes == 3 * MiB  # 1 MiB written + 2 MiB reserved
    closed = call(fs, "Close", pb.CloseRequest(inode_id=inode_id, session_id=sid))
    assert closed.inode.length_bytes == 0
    quota = fs.get_quota(home)
    assert quota is not None and quota.used_bytes == MiB  # the unused reservation went back


def test_no_byte_quota_grants_everything(fs: hf3fs.FileSystem, admin_fs: hf3fs.FileSystem, home: str) -> None:
    admin_fs.set_quota(home, max_inodes=100)
    opened = call(fs, "Create", pb.CreateRequest(path=pb.PathAt(path=f"{home}/f"), mode=0o644,
                                                 open_mode=pb.OPEN_MODE_WRITE, session_id=uuid.uuid4().hex,
                                                 client_id=fs.client_id))  # fmt: skip
    limit, available = fs._run(fs._meta.reserve_space(opened.inode.inode_id, opened.session.session_id, 1 << 40,
                                                      partial=True))  # fmt: skip
    assert (limit, available) == (1 << 40, (1 << 64) - 1)
    call(fs, "Close", pb.CloseRequest(inode_id=opened.inode.inode_id, session_id=opened.session.session_id))


def test_a_file_addressed_by_its_inode_counts_against_its_folders_quota(
    fs: hf3fs.FileSystem, admin_fs: hf3fs.FileSystem, home: str
) -> None:
    """Opening for writing or truncating a file by its inode id (no path: as the mount does for an open handle)
    charged no quota at all: a 4 MiB folder held an 8 MiB file and counted 1 byte."""
    admin_fs.set_quota(home, max_bytes=4 * MiB)
    with fs.open(f"{home}/f", "wb") as f:
        f.write(b"x")
    inode_id = fs.stat(f"{home}/f").inode_id
    by_inode = pb.PathAt(parent_inode_id=inode_id)
    opened = call(fs, "Open", pb.OpenRequest(path=by_inode, open_mode=pb.OPEN_MODE_WRITE,
                                             session_id=uuid.uuid4().hex, client_id=fs.client_id))  # fmt: skip
    sid = opened.session.session_id
    assert opened.session.write_limit_bytes < 4 * MiB  # a quota applies: writes must reserve
    refused = call(fs, "ReserveSpace", pb.ReserveSpaceRequest(inode_id=inode_id, session_id=sid,
                                                              write_limit_bytes=8 * MiB))  # fmt: skip
    assert refused == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert call(fs, "Close", pb.CloseRequest(inode_id=inode_id, session_id=sid)).inode.length_bytes == 1
    truncated = call(fs, "Truncate", pb.TruncateRequest(path=by_inode, length_bytes=8 * MiB))
    assert truncated == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert fs.stat(f"{home}/f").size == 1
    assert call(fs, "Truncate", pb.TruncateRequest(path=by_inode, length_bytes=2 * MiB)).inode.length_bytes == 2 * MiB
    quota = fs.get_quota(home)
    assert quota is not None and quota.used_bytes == 2 * MiB
