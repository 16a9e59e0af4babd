"""Hostile input for meta (issue 17): every RPC with boundary and oversized values, each answered with its
intended status, within a bounded time and memory, and meta serving after each; a deep ``mkdir -p`` under a
directory quota is linear and does not hold the event loop (another client's Stat answers meanwhile)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

import hf3fs
from ff_rpc import RpcError
from ff_testing.hostile import MALFORMED_MESSAGES, call_raw, client_method, peak_rss_kib
from fireflyer.meta.v1 import meta_pb2 as pb

from .conftest import MetaCluster

U64_MAX = (1 << 64) - 1
MAX_REQUEST_S = 10.0  # generous: the test machine is shared and loaded; hostile calls used to take 20-120 s
MAX_GROWTH_KIB = 256 * 1024
OK = grpc.StatusCode.OK
INVALID, NOT_FOUND = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
DENIED, EXHAUSTED = grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.RESOURCE_EXHAUSTED
FAILED = grpc.StatusCode.FAILED_PRECONDITION


def call(fs: hf3fs.FileSystem, method: str, request: Any) -> tuple[grpc.StatusCode, Any]:
    try:
        return OK, fs._run(fs._meta.call(lambda m: getattr(m, client_method(method)), request))
    except RpcError as err:
        return err.code, None


def at(path: str = "", inode_id: int = 0) -> pb.PathAt:
    return pb.PathAt(parent_inode_id=inode_id, path=path)


@dataclass
class Case:
    name: str
    method: str
    request: Any
    want: grpc.StatusCode
    check: Callable[[Any], bool] | None = None


def _cases(home: str, file_id: int, session: pb.WriteSession) -> list[Case]:
    long_name = f"{home}/" + "n" * 256
    long_path = "/" + "/".join(["d" * 200] * 21)  # 4,221 bytes
    sid = session.session_id
    # fmt: off
    return [
        Case("stat name 256 bytes", "Stat", pb.StatRequest(path=at(long_name)), INVALID),
        Case("stat path > 4096", "Stat", pb.StatRequest(path=at(long_path)), INVALID),
        Case("stat NUL", "Stat", pb.StatRequest(path=at(f"{home}/a\0b")), INVALID),
        Case("stat id 2^64-1", "Stat", pb.StatRequest(path=at(inode_id=U64_MAX)), NOT_FOUND),
        Case("stat id 2^63", "Stat", pb.StatRequest(path=at(inode_id=1 << 63)), NOT_FOUND),
        Case("stat id 2^63-1", "Stat", pb.StatRequest(path=at(inode_id=(1 << 63) - 1)), NOT_FOUND),
        Case("batch 10,001", "BatchStat", pb.BatchStatRequest(paths=[at(home)] * 10_001), INVALID),
        Case(
            "batch 10,000 repeated",
            "BatchStat",
            pb.BatchStatRequest(paths=[at(inode_id=file_id)] * 10_000, include_read_capability=True),
            OK,
            lambda r: (
                len(r.results) == 10_000
                and all(x.inode.inode_id == file_id and x.read_capability.token for x in r.results)
            ),
        ),
        Case(
            "batch bad ids",
            "BatchStat",
            pb.BatchStatRequest(paths=[at(inode_id=U64_MAX), at(home)]),
            OK,
            lambda r: [x.error for x in r.results] == [pb.FS_ERROR_NOT_FOUND, 0],
        ),
        Case("list id 2^64-1", "List", pb.ListRequest(path=at(inode_id=U64_MAX)), NOT_FOUND),
        Case("list page 2^32-1", "List", pb.ListRequest(path=at(home), page_size=(1 << 32) - 1), OK),
        Case("list bad token", "List", pb.ListRequest(path=at(home), page_token="__4="), INVALID),
        Case("open id 2^64-1", "Open", pb.OpenRequest(path=at(inode_id=U64_MAX)), NOT_FOUND),
        Case("open mode 99", "Open", pb.OpenRequest(path=at(inode_id=file_id), open_mode=99), INVALID),  # type: ignore[arg-type]
        Case(
            "open session id 65",
            "Open",
            pb.OpenRequest(path=at(inode_id=file_id), open_mode=pb.OPEN_MODE_WRITE, session_id="s" * 65, client_id="c"),
            INVALID,
        ),
        Case("create name 256", "Create", pb.CreateRequest(path=at(long_name)), INVALID),
        Case(
            "create chunk 2^64-1",
            "Create",
            pb.CreateRequest(path=at(f"{home}/c1"), layout=pb.Layout(chain_table_id=1, chunk_size_bytes=U64_MAX)),
            INVALID,
        ),
        Case(
            "create unknown table",
            "Create",
            pb.CreateRequest(path=at(f"{home}/c2"), layout=pb.Layout(chain_table_id=999)),
            INVALID,
        ),
        Case("mkdirs path > 4096", "Mkdirs", pb.MkdirsRequest(path=at(long_path), recursive=True), INVALID),
        Case(
            "mkdirs unknown table",
            "Mkdirs",
            pb.MkdirsRequest(path=at(f"{home}/d1"), layout=pb.Layout(chain_table_id=4242)),
            INVALID,
        ),
        Case("symlink target 4097", "Symlink", pb.SymlinkRequest(path=at(f"{home}/l"), target="t" * 4097), INVALID),
        Case(
            "hardlink id 2^64-1",
            "HardLink",
            pb.HardLinkRequest(old_path=at(inode_id=U64_MAX), new_path=at(f"{home}/h")),
            NOT_FOUND,
        ),
        Case(
            "remove retention 1e300",
            "Remove",
            pb.RemoveRequest(path=at(f"{home}/f"), to_trash=True, trash_retention_s=1e300),
            INVALID,
        ),
        Case(
            "remove retention NaN",
            "Remove",
            pb.RemoveRequest(path=at(f"{home}/f"), to_trash=True, trash_retention_s=float("nan")),
            INVALID,
        ),
        Case("close id 2^64-1", "Close", pb.CloseRequest(inode_id=U64_MAX, session_id=sid), NOT_FOUND),
        Case(
            "close written 2^64-1",
            "Close",
            pb.CloseRequest(inode_id=file_id, session_id=sid, written_length_bytes=U64_MAX),
            INVALID,
        ),
        Case(
            "batchclose 1,025 items",
            "BatchClose",
            pb.BatchCloseRequest(closes=[pb.CloseRequest(inode_id=file_id, session_id=sid)] * 1025),
            INVALID,
        ),
        Case(
            "batchclose bad items alone",
            "BatchClose",
            pb.BatchCloseRequest(closes=[
                pb.CloseRequest(inode_id=U64_MAX, session_id=sid),
                pb.CloseRequest(inode_id=file_id, session_id=sid, written_length_bytes=U64_MAX),
                pb.CloseRequest(inode_id=file_id, session_id="not-a-session"),
            ]),
            OK,
            lambda r: [x.error for x in r.results] == [pb.FS_ERROR_NOT_FOUND, pb.FS_ERROR_INVALID_ARGUMENT,
                                                       pb.FS_ERROR_UNSPECIFIED],
        ),
        Case(
            "batchcreate 1,025 items",
            "BatchCreate",
            pb.BatchCreateRequest(creates=[pb.CreateRequest(path=at(f"{home}/new"), mode=0o644)] * 1025),
            INVALID,
        ),
        Case(
            "batchcreate 1,024 bad names",
            "BatchCreate",
            pb.BatchCreateRequest(creates=[pb.CreateRequest(path=at(long_name), mode=0o644)] * 1024),
            OK,
            lambda r: {x.error for x in r.results} == {pb.FS_ERROR_NAME_TOO_LONG},
        ),
        Case(
            "batchcreate bad items alone",
            "BatchCreate",
            pb.BatchCreateRequest(creates=[
                pb.CreateRequest(path=at(f"{home}/r"), open_mode=pb.OPEN_MODE_WRITE, session_id="s",
                                 client_id="c", reserve_bytes=1 << 62),
                pb.CreateRequest(path=at(f"{home}/r"), reserve_bytes=5),
                pb.CreateRequest(path=at(inode_id=1 << 63, path="x")),
                pb.CreateRequest(path=at(f"{home}/f"), exclusive=True),
            ]),
            OK,
            lambda r: [x.error for x in r.results] == [pb.FS_ERROR_INVALID_ARGUMENT] * 2 + [
                pb.FS_ERROR_NOT_FOUND, pb.FS_ERROR_EXISTS],
        ),
        Case("sync id 2^63", "Sync", pb.SyncRequest(inode_id=1 << 63), NOT_FOUND),
        Case(
            "sync written 2^63",
            "Sync",
            pb.SyncRequest(inode_id=file_id, session_id=sid, written_length_bytes=1 << 63),
            INVALID,
        ),
        Case(
            "renew 10,001",
            "RenewSessions",
            pb.RenewSessionsRequest(
                client_id=session.client_id, sessions=[pb.SessionReport(session_id=sid, inode_id=file_id)] * 10_001
            ),
            INVALID,
        ),
        Case(
            "renew id 2^64-1",
            "RenewSessions",
            pb.RenewSessionsRequest(
                client_id=session.client_id, sessions=[pb.SessionReport(session_id=sid, inode_id=U64_MAX)]
            ),
            OK,
            lambda r: list(r.lost_session_ids) == [sid],
        ),
        Case(
            "reserve 2^64-1",
            "ReserveSpace",
            pb.ReserveSpaceRequest(inode_id=file_id, session_id=sid, write_limit_bytes=U64_MAX),
            INVALID,
        ),
        Case(
            "reserve id 2^64-1", "ReserveSpace", pb.ReserveSpaceRequest(inode_id=U64_MAX, session_id=sid), NOT_FOUND
        ),
        Case(
            "rename name 256", "Rename", pb.RenameRequest(src_path=at(f"{home}/f"), dst_path=at(long_name)), INVALID
        ),
        Case("truncate 2^64-1", "Truncate", pb.TruncateRequest(path=at(f"{home}/f"), length_bytes=U64_MAX), INVALID),
        Case("setattr mode 2^32-1", "SetAttr", pb.SetAttrRequest(path=at(f"{home}/f"), mode=(1 << 32) - 1), INVALID),
        Case("setattr uid", "SetAttr", pb.SetAttrRequest(path=at(f"{home}/f"), uid=(1 << 32) - 1), DENIED),
        Case(
            "setattr unknown table",
            "SetAttr",
            pb.SetAttrRequest(path=at(home), layout=pb.Layout(chain_table_id=77)),
            INVALID,
        ),
        Case("realpath id 2^64-1", "Realpath", pb.RealpathRequest(path=at(inode_id=U64_MAX)), NOT_FOUND),
        Case(
            "realpath file by inode",
            "Realpath",
            pb.RealpathRequest(path=at(inode_id=file_id)),
            OK,
            lambda r: r.path == f"{home}/f",
        ),
        Case("getquota id 2^63", "GetQuota", pb.GetQuotaRequest(path=at(inode_id=1 << 63)), NOT_FOUND),
        Case("setquota by a user", "SetQuota", pb.SetQuotaRequest(path=at(home), max_bytes=U64_MAX), DENIED),
        Case("listtrash page 2^32-1", "ListTrash", pb.ListTrashRequest(page_size=(1 << 32) - 1), OK),
        Case("listtrash all users", "ListTrash", pb.ListTrashRequest(all_users=True), DENIED),
        Case(
            "restore id 10,000 chars",
            "RestoreTrashEntry",
            pb.RestoreTrashEntryRequest(trash_id="x" * 10_000),
            NOT_FOUND,
        ),
        Case("emptytrash 1,001 ids", "EmptyTrash", pb.EmptyTrashRequest(trash_ids=["x"] * 1001), INVALID),
        Case(
            "emptytrash 1,000 unknown",
            "EmptyTrash",
            pb.EmptyTrashRequest(trash_ids=[str(i) for i in range(1000)]),
            OK,
            lambda r: r.num_deleted == 0,
        ),
    ]
    # fmt: on


@pytest.fixture
def open_file(fs: hf3fs.FileSystem, home: str) -> Iterator[tuple[int, pb.WriteSession]]:
    with fs.open(f"{home}/f", "wb") as f:
        f.write(b"payload")
    code, opened = call(fs, "Open", pb.OpenRequest(path=at(f"{home}/f"), open_mode=pb.OPEN_MODE_WRITE,
                                                   session_id=uuid.uuid4().hex, client_id=fs.client_id))  # fmt: skip
    assert code is OK
    yield opened.inode.inode_id, opened.session
    call(fs, "Close", pb.CloseRequest(inode_id=opened.inode.inode_id, session_id=opened.session.session_id))


def test_every_rpc_with_hostile_values(cluster: MetaCluster, fs: hf3fs.FileSystem, home: str,
                                       open_file: tuple[int, pb.WriteSession]) -> None:  # fmt: skip
    file_id, session = open_file
    pid = cluster.meta[0].proc.pid  # type: ignore[union-attr]
    base_kib = peak_rss_kib(pid)
    wrong: dict[str, str] = {}
    for case in _cases(home, file_id, session):
        start = time.monotonic()
        code, resp = call(fs, case.method, case.request)
        took = time.monotonic() - start
        if code is not case.want or (case.check is not None and not case.check(resp)):
            wrong[case.name] = f"{code.name} (want {case.want.name})"
        assert took < MAX_REQUEST_S, f"{case.name} took {took:.1f} s"
        assert peak_rss_kib(pid) - base_kib < MAX_GROWTH_KIB, f"{case.name}: meta's memory grew past 256 MiB"
        assert fs.stat(home).inode_id, f"meta stopped serving after {case.name}"
    assert not wrong, wrong
    # Nothing the refused calls named changed.
    assert sorted(fs.listdir(home)) == ["f"]
    with fs.open(f"{home}/f", "rb") as f:
        assert f.read() == b"payload"


def test_malformed_bytes_are_invalid_arguments(cluster: MetaCluster, fs: hf3fs.FileSystem) -> None:
    async def each() -> list[grpc.StatusCode]:
        async with grpc.aio.insecure_channel(cluster.meta[0].address) as channel:
            return [(await call_raw(channel, f"/fireflyer.meta.v1.MetaService/{method}", [raw],
                                    token=cluster.tokens["alice"])).code
                    for method in ("Stat", "Mkdirs", "Close") for raw in MALFORMED_MESSAGES]  # fmt: skip

    assert set(asyncio.run(each())) == {INVALID}
    assert fs.stat("/").inode_id == 1


def _stat_latencies(cluster: MetaCluster, stop: threading.Event, out: list[float]) -> None:
    with cluster.connect("bob") as bob:
        while not stop.is_set():
            start = time.monotonic()
            bob.stat("/")
            out.append(time.monotonic() - start)
            time.sleep(0.02)  # pacing, not synchronisation: about 50 Stats a second


def _stats_answered(latencies: list[float], count: int, timeout_s: float = 30.0) -> None:
    """Wait until the watcher has ``count`` answers (it is stating before the call and after it)."""
    deadline = time.monotonic() + timeout_s
    while len(latencies) < count:
        assert time.monotonic() < deadline, "the other client's Stats did not start"
        time.sleep(0.01)


def _while_stating(cluster: MetaCluster, fs: hf3fs.FileSystem, method: str,
                   request: Any) -> tuple[grpc.StatusCode, Any, float, list[float]]:  # fmt: skip
    """(status, response, seconds) of one call, and how long another client's Stats took meanwhile."""
    stop = threading.Event()
    latencies: list[float] = []
    watcher = threading.Thread(target=_stat_latencies, args=(cluster, stop, latencies))
    watcher.start()
    try:
        _stats_answered(latencies, 3)
        start = time.monotonic()
        code, resp = call(fs, method, request)
        took = time.monotonic() - start
        _stats_answered(latencies, len(latencies) + 3)
    finally:
        stop.set()
        watcher.join()
    assert latencies
    return code, resp, took, latencies


def _deep_mkdirs_while_stating(cluster: MetaCluster, fs: hf3fs.FileSystem, base: str, levels: int,
                               inode_id: int = 0) -> tuple[float, list[float], pb.Inode]:  # fmt: skip
    path = "/".join(["a"] * levels)
    request = pb.MkdirsRequest(path=at(path if inode_id else f"{base}/{path}", inode_id), mode=0o755, recursive=True)
    code, resp, took, latencies = _while_stating(cluster, fs, "Mkdirs", request)
    assert code is OK, code
    return took, latencies, resp.inode


def test_deep_mkdirs_under_a_quota_is_linear_and_leaves_meta_serving(
    cluster: MetaCluster, fs: hf3fs.FileSystem, admin_fs: hf3fs.FileSystem, home: str
) -> None:
    """2,000 components (4,011 bytes) under a directory quota: used to take 21-32 s on the event loop."""
    admin_fs.set_quota(home, max_inodes=100_000)
    took, latencies, deepest = _deep_mkdirs_while_stating(cluster, fs, home, 2000)
    assert took < 30.0, f"deep mkdir -p took {took:.1f} s"
    assert latencies and max(latencies) < 2.0, f"Stat waited {max(latencies):.2f} s during the deep mkdir -p"
    assert _used_inodes(admin_fs, home) == 2001
    # From the deepest directory by inode: again 2,000 levels (4,002 deep), then the depth limit.
    took, latencies, deeper = _deep_mkdirs_while_stating(cluster, fs, home, 2000, deepest.inode_id)
    assert took < 30.0 and max(latencies) < 2.0
    code, _ = call(fs, "Mkdirs", pb.MkdirsRequest(path=at("/".join(["b"] * 100), deeper.inode_id), recursive=True))
    assert code is INVALID  # ENAMETOOLONG: directories nest at most 4096 deep
    assert _used_inodes(admin_fs, home) == 4001
    start = time.monotonic()
    code, resp = call(fs, "Stat", pb.StatRequest(path=at(inode_id=deeper.inode_id)))
    assert code is OK and resp.inode.inode_id == deeper.inode_id and time.monotonic() - start < MAX_REQUEST_S
    with cluster.connect("bob") as bob:
        code, _ = call(bob, "Stat", pb.StatRequest(path=at(inode_id=deeper.inode_id)))
    assert code is OK  # every level is 0755: bob may search them all
    fs.rmtree(home)  # to the trash, one transaction (the fixture's EmptyTrash of 4,001 levels took 18-104 s)


def _used_inodes(fs: hf3fs.FileSystem, path: str) -> int:
    quota = fs.get_quota(path)
    assert quota is not None
    return quota.used_inodes


def test_symlinks_through_a_deep_tree_cost_a_bounded_walk(cluster: MetaCluster, fs: hf3fs.FileSystem,
                                                          home: str) -> None:  # fmt: skip
    """40 symlinks, each naming the next through a 1,000-level tree: one Stat would walk 40,000 components
    (on the event loop before); it stops with ELOOP past 8,192, and a batch of 64 of them runs off the loop
    within a bounded cost while another client's Stat is answered."""
    deep = home + "/" + "/".join(["a"] * 1000)
    fs.makedirs(deep)
    with fs.open(f"{deep}/f", "wb") as f:
        f.write(b"end")
    for i in range(40):
        fs.symlink(f"{deep}/l{i + 1}" if i < 39 else f"{deep}/f", f"{deep}/l{i}")
    assert fs.stat(f"{deep}/l39").size == 3  # a short chain still resolves
    start = time.monotonic()
    code, _ = call(fs, "Stat", pb.StatRequest(path=at(f"{deep}/l0"), follow_last_symlink=True))
    assert code is FAILED and time.monotonic() - start < MAX_REQUEST_S  # ELOOP
    request = pb.BatchStatRequest(paths=[at(f"{deep}/l{i % 32}") for i in range(64)], follow_last_symlink=True)
    code, resp, took, latencies = _while_stating(cluster, fs, "BatchStat", request)
    assert code is OK and [r.error for r in resp.results] == [pb.FS_ERROR_SYMLINK_LOOP] * 64
    assert took < MAX_REQUEST_S, f"the batch took {took:.1f} s"
    assert max(latencies) < 2.0, f"Stat waited {max(latencies):.2f} s during the batch"
