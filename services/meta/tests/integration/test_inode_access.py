"""Access by inode id (issue 16, defect 2): every meta RPC that takes an inode id, called by bob against
alice's private tree, is refused and changes nothing; alice, an admin, and bob where bob may search still
get their answers."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

import hf3fs
from ff_rpc import RpcError
from ff_testing.hostile import client_method
from fireflyer.meta.v1 import meta_pb2 as pb

from .conftest import MetaCluster

REFUSED = {grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.NOT_FOUND}
CONTENT = bytes(range(256)) * 80  # 20,480 bytes


def call(fs: hf3fs.FileSystem, method: str, request: Any) -> Any:
    """The response, or the status code the call failed with."""
    try:
        return fs._run(fs._meta.call(lambda m: getattr(m, client_method(method)), request))
    except RpcError as err:
        return err.code


def by_inode(inode_id: int, path: str = "") -> pb.PathAt:
    return pb.PathAt(parent_inode_id=inode_id, path=path)


@dataclass
class PrivateTree:
    """alice's ``home/private`` (0700) with ``sub/`` and ``sub/f`` (open for writing by alice: ``session``)."""

    home: str
    private: str
    private_id: int
    sub_id: int
    file: str
    file_id: int
    session: pb.WriteSession


@pytest.fixture
def tree(fs: hf3fs.FileSystem, home: str) -> Iterator[PrivateTree]:
    fs.chmod(home, 0o755)
    private = f"{home}/private"
    fs.mkdir(private, 0o700)
    fs.mkdir(f"{private}/sub", 0o755)
    with fs.open(f"{private}/sub/f", "wb", perm=0o644) as f:
        f.write(CONTENT)
    opened = call(fs, "Open", pb.OpenRequest(path=pb.PathAt(path=f"{private}/sub/f"), open_mode=pb.OPEN_MODE_WRITE,
                                             session_id=uuid.uuid4().hex, client_id=fs.client_id))  # fmt: skip
    assert isinstance(opened, pb.OpenResponse)
    yield PrivateTree(home, private, fs.stat(private).inode_id, fs.stat(f"{private}/sub").inode_id,
                      f"{private}/sub/f", fs.stat(f"{private}/sub/f").inode_id, opened.session)  # fmt: skip
    call(fs, "Close", pb.CloseRequest(inode_id=opened.inode.inode_id, session_id=opened.session.session_id))


def _attack_requests(t: PrivateTree, bob_dir: str, bob_trash_id: str) -> dict[str, tuple[str, Any]]:
    """Every RPC that takes an inode id (in a PathAt or as a field), aimed at alice's private tree."""
    f, sub = t.file_id, t.sub_id
    sid = t.session.session_id
    return {
        "Stat file": ("Stat", pb.StatRequest(path=by_inode(f), follow_last_symlink=True)),
        "Stat in dir": ("Stat", pb.StatRequest(path=by_inode(sub, "f"), follow_last_symlink=True)),
        "Stat dir": ("Stat", pb.StatRequest(path=by_inode(sub))),
        "List": ("List", pb.ListRequest(path=by_inode(sub), include_inodes=True)),
        "List private": ("List", pb.ListRequest(path=by_inode(t.private_id))),
        "Open read": ("Open", pb.OpenRequest(path=by_inode(f), open_mode=pb.OPEN_MODE_READ)),
        "Open write": (
            "Open",
            pb.OpenRequest(path=by_inode(f), open_mode=pb.OPEN_MODE_WRITE, session_id="bob1", client_id="bob"),
        ),
        "Create": ("Create", pb.CreateRequest(path=by_inode(sub, "new"), mode=0o644)),
        "Create existing": ("Create", pb.CreateRequest(path=by_inode(sub, "f"), mode=0o644)),
        "Mkdirs": ("Mkdirs", pb.MkdirsRequest(path=by_inode(sub, "d/e"), mode=0o755, recursive=True)),
        "Symlink": ("Symlink", pb.SymlinkRequest(path=by_inode(sub, "ln"), target="f")),
        "Mknod": ("Mknod", pb.MknodRequest(path=by_inode(sub, "fifo"), type=pb.INODE_TYPE_FIFO, mode=0o644)),
        "HardLink": ("HardLink", pb.HardLinkRequest(old_path=by_inode(f), new_path=pb.PathAt(path=f"{bob_dir}/l"))),
        "Remove": ("Remove", pb.RemoveRequest(path=by_inode(sub, "f"))),
        "Remove to trash": ("Remove", pb.RemoveRequest(path=by_inode(sub, "f"), to_trash=True)),
        "Rename": ("Rename", pb.RenameRequest(src_path=by_inode(sub, "f"), dst_path=pb.PathAt(path=f"{bob_dir}/m"))),
        "Truncate": ("Truncate", pb.TruncateRequest(path=by_inode(f), length_bytes=1)),
        "SetAttr": ("SetAttr", pb.SetAttrRequest(path=by_inode(f), mtime_ns=0)),
        "SetAttr touch": ("SetAttr", pb.SetAttrRequest(path=by_inode(f), mtime_now=True)),
        "Realpath file": ("Realpath", pb.RealpathRequest(path=by_inode(f))),
        "Realpath dir": ("Realpath", pb.RealpathRequest(path=by_inode(sub))),
        "GetQuota": ("GetQuota", pb.GetQuotaRequest(path=by_inode(sub))),
        "SetQuota": ("SetQuota", pb.SetQuotaRequest(path=by_inode(sub), max_inodes=1)),
        "Restore into": (
            "RestoreTrashEntry",
            pb.RestoreTrashEntryRequest(trash_id=bob_trash_id, path=by_inode(sub, "r")),
        ),
        "Sync": ("Sync", pb.SyncRequest(inode_id=f, written_length_bytes=99999999, mtime_ns=0)),
        "Sync with alice's session": (
            "Sync",
            pb.SyncRequest(inode_id=f, session_id=sid, written_length_bytes=99999999, mtime_ns=0),
        ),
        "Close": ("Close", pb.CloseRequest(inode_id=f, written_length_bytes=99999999, mtime_ns=0)),
        "Close unknown session": (
            "Close",
            pb.CloseRequest(inode_id=f, session_id="nope", written_length_bytes=99999999, mtime_ns=0),
        ),
        "Close with alice's session": (
            "Close",
            pb.CloseRequest(inode_id=f, session_id=sid, written_length_bytes=99999999, mtime_ns=0),
        ),
        "ReserveSpace with alice's session": (
            "ReserveSpace",
            pb.ReserveSpaceRequest(inode_id=f, session_id=sid, write_limit_bytes=1 << 40),
        ),
    }


REFUSED_ITEM = {pb.FS_ERROR_ACCESS_DENIED, pb.FS_ERROR_NOT_FOUND}


def _batch_attacks(bob: hf3fs.FileSystem, t: PrivateTree) -> dict[str, Any]:
    """BatchCreate and BatchClose items aimed at alice's private tree (each item must be refused alone)."""
    f, sid = t.file_id, t.session.session_id
    write = {"open_mode": pb.OPEN_MODE_WRITE, "client_id": "bob"}
    return {
        "BatchCreate": call(bob, "BatchCreate", pb.BatchCreateRequest(creates=[
            pb.CreateRequest(path=by_inode(t.sub_id, "new"), mode=0o644),
            pb.CreateRequest(path=by_inode(t.sub_id, "f"), mode=0o644, truncate=True, session_id="bob2", **write),
            pb.CreateRequest(path=by_inode(t.sub_id, "w"), mode=0o644, session_id="bob3", reserve_bytes=9, **write),
        ])),
        "BatchClose": call(bob, "BatchClose", pb.BatchCloseRequest(closes=[
            pb.CloseRequest(inode_id=f, written_length_bytes=99999999, mtime_ns=0),
            pb.CloseRequest(inode_id=f, session_id="nope", written_length_bytes=99999999, mtime_ns=0),
            pb.CloseRequest(inode_id=f, session_id=sid, written_length_bytes=99999999, mtime_ns=0),
        ])),
    }  # fmt: skip


def test_bob_cannot_reach_alices_private_tree_by_inode(cluster: MetaCluster, fs: hf3fs.FileSystem,
                                                       tree: PrivateTree) -> None:  # fmt: skip
    before = fs.stat(tree.file)
    listing = sorted(fs.listdir(f"{tree.private}/sub"))
    with cluster.connect("bob") as bob:
        bob_dir = f"/bob-{uuid.uuid4().hex[:8]}"
        bob.mkdir(bob_dir)
        bob.mkdir(f"{bob_dir}/gone")
        trashed = call(bob, "Remove", pb.RemoveRequest(path=pb.PathAt(path=f"{bob_dir}/gone"), to_trash=True))
        outcomes = {name: call(bob, method, req)
                    for name, (method, req) in _attack_requests(tree, bob_dir, trashed.trash_id).items()}  # fmt: skip
        batch = call(bob, "BatchStat", pb.BatchStatRequest(
            paths=[by_inode(tree.file_id), by_inode(tree.sub_id, "f"), by_inode(tree.sub_id)],
            follow_last_symlink=True, include_read_capability=True))  # fmt: skip
        batches = _batch_attacks(bob, tree)
        renew = call(bob, "RenewSessions", pb.RenewSessionsRequest(client_id=fs.client_id, sessions=[
            pb.SessionReport(session_id=tree.session.session_id, inode_id=tree.file_id,
                             written_length_bytes=99999999)]))  # fmt: skip
        bob.rmtree(bob_dir, trash=False)
    wrong = {name: type(got).__name__ for name, got in outcomes.items()
             if not (isinstance(got, grpc.StatusCode) and got in REFUSED)}  # fmt: skip
    assert not wrong, f"answered instead of refused: {wrong}"
    assert [r.error for r in batch.results] == [pb.FS_ERROR_ACCESS_DENIED] * 3
    assert not any(r.HasField("read_capability") or r.HasField("inode") for r in batch.results)
    assert list(renew.lost_session_ids) == [tree.session.session_id]
    wrong_items = {name: [pb.FsError.Name(r.error) for r in resp.results] for name, resp in batches.items()
                   if not all(r.error in REFUSED_ITEM and not r.HasField(field) for r in resp.results
                              for field in ("inode", "response") if field in r.DESCRIPTOR.fields_by_name)}  # fmt: skip
    assert not wrong_items, f"batch items answered instead of refused: {wrong_items}"
    # Nothing changed: length, times, content, entries; alice's session still works.
    after = fs.stat(tree.file)
    assert (
        (after.size, after.mtime_ns, after.mode)
        == (before.size, before.mtime_ns, before.mode)
        == (len(CONTENT), before.mtime_ns, 0o644)
    )
    assert sorted(fs.listdir(f"{tree.private}/sub")) == listing == ["f"]
    with fs.open(tree.file, "rb") as f:
        assert f.read() == CONTENT
    synced = call(fs, "Sync", pb.SyncRequest(inode_id=tree.file_id, session_id=tree.session.session_id))
    assert synced.inode.length_bytes == len(CONTENT)


def test_realpath_over_a_range_of_ids_reveals_no_private_path(cluster: MetaCluster, fs: hf3fs.FileSystem,
                                                              tree: PrivateTree) -> None:  # fmt: skip
    ids = [tree.private_id, tree.sub_id, tree.file_id]
    found: list[str] = []
    with cluster.connect("bob") as bob:
        for inode_id in range(min(ids) - 2, max(ids) + 3):
            resp = call(bob, "Realpath", pb.RealpathRequest(path=by_inode(inode_id)))
            if isinstance(resp, pb.RealpathResponse):
                found.append(resp.path)
            else:
                assert resp in REFUSED
    assert not [p for p in found if p.startswith(tree.private + "/")], found


def _answers(fs: hf3fs.FileSystem, t: PrivateTree) -> dict[str, Any]:
    return {
        "stat": call(fs, "Stat", pb.StatRequest(path=by_inode(t.file_id))).inode.length_bytes,
        "stat in dir": call(fs, "Stat", pb.StatRequest(path=by_inode(t.sub_id, "f"))).inode.inode_id,
        "list": [e.name for e in call(fs, "List", pb.ListRequest(path=by_inode(t.sub_id))).entries],
        "open": call(fs, "Open", pb.OpenRequest(path=by_inode(t.file_id))).io_capability.inode_id,
        "realpath": call(fs, "Realpath", pb.RealpathRequest(path=by_inode(t.file_id))).path,
        "realpath dir": call(fs, "Realpath", pb.RealpathRequest(path=by_inode(t.sub_id))).path,
        "sync": call(fs, "Sync", pb.SyncRequest(inode_id=t.file_id)).inode.length_bytes,
    }


def test_owner_and_admin_still_reach_the_tree_by_inode(fs: hf3fs.FileSystem, admin_fs: hf3fs.FileSystem,
                                                       tree: PrivateTree) -> None:  # fmt: skip
    want = {"stat": len(CONTENT), "stat in dir": tree.file_id, "list": ["f"], "open": tree.file_id,
            "realpath": tree.file, "realpath dir": f"{tree.private}/sub", "sync": len(CONTENT)}  # fmt: skip
    assert _answers(fs, tree) == want
    assert _answers(admin_fs, tree) == want


def test_bob_reaches_what_he_may_search(cluster: MetaCluster, fs: hf3fs.FileSystem, tree: PrivateTree) -> None:
    """A folder bob may search but not read (0711): files in it by inode, not its listing; a hard link in a
    public folder makes alice's private file reachable (through that link, as a path would)."""
    shared = f"{tree.home}/shared"
    fs.mkdir(shared, 0o711)
    with fs.open(f"{shared}/pub", "wb", perm=0o644) as f:
        f.write(b"public")
    fs.link(tree.file, f"{tree.home}/linked")
    pub_id, shared_id = fs.stat(f"{shared}/pub").inode_id, fs.stat(shared).inode_id
    with cluster.connect("bob") as bob:
        assert call(bob, "Stat", pb.StatRequest(path=by_inode(pub_id))).inode.length_bytes == 6
        assert call(bob, "Stat", pb.StatRequest(path=by_inode(shared_id, "pub"))).inode.inode_id == pub_id
        assert call(bob, "Open", pb.OpenRequest(path=by_inode(pub_id))).io_capability.inode_id == pub_id
        assert call(bob, "Realpath", pb.RealpathRequest(path=by_inode(pub_id))).path == f"{shared}/pub"
        assert call(bob, "List", pb.ListRequest(path=by_inode(shared_id))) == grpc.StatusCode.PERMISSION_DENIED
        assert call(bob, "Sync", pb.SyncRequest(inode_id=pub_id)).inode.length_bytes == 6  # a reader's fsync
        assert call(bob, "Sync", pb.SyncRequest(inode_id=pub_id, written_length_bytes=99)).inode.length_bytes == 6
        # alice's private file through its public link: the link's path, never the private one
        assert call(bob, "Stat", pb.StatRequest(path=by_inode(tree.file_id))).inode.length_bytes == len(CONTENT)
        assert call(bob, "Realpath", pb.RealpathRequest(path=by_inode(tree.file_id))).path == f"{tree.home}/linked"
    fs.remove(f"{tree.home}/linked")
    with cluster.connect("bob") as bob:
        assert call(bob, "Stat", pb.StatRequest(path=by_inode(tree.file_id))) == grpc.StatusCode.PERMISSION_DENIED
    assert fs.stat(f"{shared}/pub").size == 6


def test_a_folder_bob_may_read_but_not_search_lists_names_without_their_attributes(
    cluster: MetaCluster, fs: hf3fs.FileSystem, home: str
) -> None:
    """POSIX: read permission on a folder lists its names; stat-ing an entry needs search permission. A listing
    with the entries' attributes (``include_inodes``: scandir, the mount's readdirplus) showed bob the size, owner
    and times of every file in a 0704 folder, which he cannot stat; now it is refused and the names alone come."""
    fs.chmod(home, 0o755)
    folder = f"{home}/readable"
    fs.mkdir(folder, 0o704)
    with fs.open(f"{folder}/secret-size", "wb", perm=0o600) as f:
        f.write(b"s" * 12345)
    with cluster.connect("bob") as bob:
        names = call(bob, "List", pb.ListRequest(path=pb.PathAt(path=folder)))
        assert [e.name for e in names.entries] == ["secret-size"]
        with_attrs = pb.ListRequest(path=pb.PathAt(path=folder), include_inodes=True)
        assert call(bob, "List", with_attrs) == grpc.StatusCode.PERMISSION_DENIED
        assert call(bob, "Stat", pb.StatRequest(path=pb.PathAt(path=f"{folder}/secret-size"))) in REFUSED
    mine = call(fs, "List", pb.ListRequest(path=pb.PathAt(path=folder), include_inodes=True))
    assert [e.inode.length_bytes for e in mine.entries] == [12345]  # alice may search her folder
