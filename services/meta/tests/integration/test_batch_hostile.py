"""BatchCreate / BatchClose as the write-back uses them, tried as an unlucky client (issue 16, defect 6): a batch
sent again after a timeout (the client's write-back does that, up to 3 tries) answers the same files and sessions
and reserves quota once, a BatchClose sent again closes nothing twice, and one name twice in a batch is one file."""

from __future__ import annotations

import uuid
from typing import Any

import hf3fs
from ff_testing.hostile import client_method
from fireflyer.meta.v1 import meta_pb2 as pb


def _call(fs: hf3fs.FileSystem, method: str, request: Any) -> Any:
    return fs._run(fs._meta.call(lambda m: getattr(m, client_method(method)), request))


def _create(fs: hf3fs.FileSystem, path: str, reserve: int, session_id: str | None = None) -> pb.CreateRequest:
    return pb.CreateRequest(path=pb.PathAt(path=path), mode=0o644, open_mode=pb.OPEN_MODE_WRITE, truncate=True,
                            session_id=session_id or uuid.uuid4().hex, client_id=fs.client_id,
                            reserve_bytes=reserve)  # fmt: skip


def _errors(results: Any) -> list[str]:
    return [pb.FsError.Name(r.error) for r in results if r.error]


def test_a_batch_create_sent_again_reserves_its_quota_once_and_a_close_sent_again_is_harmless(
    fs: hf3fs.FileSystem, admin_fs: hf3fs.FileSystem, home: str
) -> None:
    admin_fs.set_quota(home, max_bytes=10_000)
    first = pb.BatchCreateRequest(creates=[_create(fs, f"{home}/a", 6000), _create(fs, f"{home}/b", 1000)])
    once = _call(fs, "BatchCreate", first).results
    again = _call(fs, "BatchCreate", first).results  # the retry of a batch that timed out after meta ran it
    assert _errors(once) == _errors(again) == []
    for r1, r2 in zip(once, again, strict=True):
        assert r2.response.inode.inode_id == r1.response.inode.inode_id
        assert r2.response.session.session_id == r1.response.session.session_id
    # reserved once: 7,000 of 10,000, so 3,000 more still fit and 3,001 do not
    fits = _call(fs, "BatchCreate", pb.BatchCreateRequest(creates=[_create(fs, f"{home}/c", 3000),
                                                                  _create(fs, f"{home}/d", 1)])).results  # fmt: skip
    assert _errors(fits) == ["FS_ERROR_QUOTA_EXCEEDED"]
    sessions = [*once, fits[0]]
    close = pb.BatchCloseRequest(closes=[pb.CloseRequest(inode_id=r.response.inode.inode_id,
                                                         session_id=r.response.session.session_id,
                                                         written_length_bytes=0) for r in sessions])  # fmt: skip
    assert _errors(_call(fs, "BatchClose", close).results) == []
    assert _errors(_call(fs, "BatchClose", close).results) == []  # sent again: the sessions are gone, no error
    quota = admin_fs.get_quota(home)
    assert quota is not None and quota.used_bytes == 0  # nothing written: reservations all released
    whole = _call(fs, "BatchCreate", pb.BatchCreateRequest(creates=[_create(fs, f"{home}/e", 10_000)])).results
    assert _errors(whole) == []
    assert sorted(fs.listdir(home)) == ["a", "b", "c", "e"] and fs.stat(f"{home}/a").size == 0


def test_one_name_twice_in_a_batch_create_is_one_file(fs: hf3fs.FileSystem, home: str) -> None:
    twice = [_create(fs, f"{home}/x", 10), _create(fs, f"{home}/x", 20)]
    results = _call(fs, "BatchCreate", pb.BatchCreateRequest(creates=twice)).results
    assert _errors(results) == [] and results[0].response.created and not results[1].response.created
    assert results[0].response.inode.inode_id == results[1].response.inode.inode_id
    assert fs.listdir(home) == ["x"]
