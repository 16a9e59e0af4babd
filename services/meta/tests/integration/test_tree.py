"""A directory tree through the hf3fs client: create, list, stat, rename, remove; files byte-exact."""

from __future__ import annotations

import errno
import os
from typing import Any

import pytest

import hf3fs


def test_tree_created_listed_renamed_removed(fs: hf3fs.FileSystem, home: str) -> None:
    fs.makedirs(f"{home}/a/b/c")
    for name in ("x", "y", "z"):
        with fs.open(f"{home}/a/b/{name}.txt", "w") as f:
            f.write(f"hello {name}\n")
    fs.symlink("b/x.txt", f"{home}/a/link")
    assert fs.listdir(f"{home}/a/b") == ["c", "x.txt", "y.txt", "z.txt"]
    assert sorted(fs.listdir(f"{home}/a")) == ["b", "link"]
    st = fs.stat(f"{home}/a/b/y.txt")
    assert st.is_file() and st.size == len("hello y\n") and st.mode == 0o644
    assert fs.readlink(f"{home}/a/link") == "b/x.txt"
    with fs.open(f"{home}/a/link") as f:  # through the symlink
        assert f.read() == b"hello x\n"
    walked = list(fs.walk(f"{home}/a"))
    assert walked[0] == (f"{home}/a", ["b"], ["link"])
    assert (f"{home}/a/b", ["c"], ["x.txt", "y.txt", "z.txt"]) in walked

    fs.rename(f"{home}/a/b", f"{home}/a/renamed")
    assert not fs.exists(f"{home}/a/b")
    assert fs.listdir(f"{home}/a/renamed") == ["c", "x.txt", "y.txt", "z.txt"]
    with fs.open(f"{home}/a/renamed/z.txt", "r") as f:
        assert f.read() == "hello z\n"
    assert fs.realpath(f"{home}/a/./renamed/../renamed/c") == f"{home}/a/renamed/c"

    with pytest.raises(OSError) as exc:
        fs.rmdir(f"{home}/a/renamed")
    assert exc.value.errno == errno.ENOTEMPTY
    fs.remove(f"{home}/a/renamed/x.txt")
    assert fs.listdir(f"{home}/a/renamed") == ["c", "y.txt", "z.txt"]
    trash_id = fs.rmtree(f"{home}/a")
    assert fs.listdir(home) == []
    assert any(e.entry_id == trash_id and e.original_path == f"{home}/a" for e in fs.trash_list())
    restored = fs.trash_restore(trash_id)
    assert restored == f"{home}/a" and fs.listdir(f"{home}/a/renamed") == ["c", "y.txt", "z.txt"]
    fs.rmtree(f"{home}/a", trash=False)
    assert fs.listdir(home) == []


def test_file_modes_and_seek(fs: hf3fs.FileSystem, home: str) -> None:
    path = f"{home}/f.bin"
    with fs.open(path, "xb") as f:
        f.write(b"0123456789")
    with pytest.raises(FileExistsError):
        fs.open(path, "xb")
    with fs.open(path, "ab") as f:
        f.write(b"abc")
    with fs.open(path, "r+b") as f:
        f.seek(2)
        f.write(b"XY")
        f.seek(0)
        assert f.read() == b"01XY456789abc"
        f.seek(-3, os.SEEK_END)
        assert f.read(2) == b"ab"
        f.truncate(5)
    assert fs.stat(path).size == 5
    with fs.open(path, "rb") as f:
        assert f.read() == b"01XY4"
    with fs.open(path, "wb") as f:  # O_TRUNC
        f.write(b"new")
    with fs.open(path) as f:
        assert f.read() == b"new"
    fs.truncate(path, 1 << 20)  # sparse growth reads zeros
    with fs.open(path) as f:
        data = f.read()
    assert len(data) == 1 << 20 and data[:3] == b"new" and not any(data[3:])


def test_large_file_byte_exact_across_chains(fs: hf3fs.FileSystem, home: str) -> None:
    size = 100 * 1024 * 1024
    data = os.urandom(size // 4) * 4
    path = f"{home}/big.bin"
    with fs.open(path, "wb") as f:
        f.write(data)
    st = fs.stat(path)
    assert st.size == size and st.stripe_size >= 2, st
    with fs.open(path, "rb") as f:
        back = f.read()
    assert back == data
    # Ranges across chunk boundaries, in one batch.
    ranges = [(path, 0, 10), (path, (1 << 20) - 5, 10), (path, size - 7, 100)]
    got = fs.read_batch(ranges)
    assert got == [data[0:10], data[(1 << 20) - 5 : (1 << 20) + 5], data[size - 7 :]]


def test_concurrent_creates_each_answered_alone(fs: hf3fs.FileSystem, home: str) -> None:
    """Writes that meta commits together (one SQLite transaction, a savepoint each): a failing one (EEXIST)
    changes nothing and does not fail the others."""
    import threading
    from collections import Counter

    outcomes: Counter[str] = Counter()
    lock = threading.Lock()

    def worker(t: int) -> None:
        for k in range(20):
            for path in (f"{home}/shared{k}", f"{home}/own{t}-{k}"):
                try:
                    fs.create(path, exclusive=True)
                    result = "created"
                except FileExistsError:
                    result = "exists"
                with lock:
                    outcomes[result] += 1

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert outcomes == {"created": 20 + 6 * 20, "exists": 5 * 20}
    names = fs.listdir(home)
    assert len(names) == len(set(names)) == 20 + 6 * 20


def test_capability_renewed_before_it_expires(fs: hf3fs.FileSystem, home: str) -> None:
    path = f"{home}/long-lived.bin"
    with fs.open(path, "wb", buffering=0) as w:
        w.write(b"a" * 10)
        old = w._cap
        w.cap_expires_at_ns = 1  # as if it were about to expire
        fs.rename(path, f"{home}/renamed.bin")  # the handle re-opens by inode, not by name
        w.write(b"b" * 10)
        assert w._cap != old and w.cap_expires_at_ns > 1
    with fs.open(f"{home}/renamed.bin", "rb", buffering=0) as r:
        r.cap_expires_at_ns = 1
        assert r.read() == b"a" * 10 + b"b" * 10


def test_unlink_and_rmdir_check_the_type_in_meta_in_one_call(
    fs: hf3fs.FileSystem, home: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """unlink of a folder is EISDIR, rmdir of a file ENOTDIR, nothing removed, and each is one meta call (the
    client sent a Stat first to tell them apart: the FUSE mount's unlink of SQLite's journal paid it each
    transaction)."""
    fs.makedirs(f"{home}/d")
    fs.create(f"{home}/f")
    fs.symlink("d", f"{home}/link")  # unlink removes the symlink, not the folder it names
    calls: list[str] = []
    real_call = fs._meta_call

    class Namer:
        def __getattr__(self, name: str) -> str:
            return name

    def counted(select: Any, request: Any, path: str | None = None) -> Any:
        calls.append(select(Namer()))
        return real_call(select, request, path)

    monkeypatch.setattr(fs, "_meta_call", counted)
    with pytest.raises(IsADirectoryError):
        fs.remove(f"{home}/d")
    with pytest.raises(NotADirectoryError):
        fs.rmdir(f"{home}/f")
    with pytest.raises(NotADirectoryError):
        fs.rmdir(f"{home}/link")
    with pytest.raises(FileNotFoundError):
        fs.remove(f"{home}/missing")
    assert calls == ["remove"] * 4  # MetaServiceClient.remove: the Remove RPC
    monkeypatch.undo()
    assert sorted(fs.listdir(home)) == ["d", "f", "link"]
    fs.remove(f"{home}/link")
    fs.remove(f"{home}/f")
    fs.rmdir(f"{home}/d")
    assert fs.listdir(home) == []


def test_create_with_set_mode_chmods_an_existing_file_as_its_owner(
    fs: hf3fs.FileSystem, home: str, cluster: Any
) -> None:
    """CreateRequest.set_mode (the mount's write-back of a tar-style file chmod-ed after its create): the owner's
    open for writing also sets the mode, a mode without owner write included, in one call; anyone else's is
    refused and nothing changes; a new file is made with it."""
    from fireflyer.meta.v1 import meta_pb2 as pb

    def create(client: hf3fs.FileSystem, path: str, set_mode: int) -> Any:
        return client._meta_call(lambda m: m.create, pb.CreateRequest(
            path=pb.PathAt(path=path), mode=0o600, open_mode=pb.OPEN_MODE_WRITE, session_id=os.urandom(8).hex(),
            client_id=client.client_id, set_mode=set_mode), path)  # fmt: skip

    fs.chmod(home, 0o777)
    fs.create(f"{home}/tar", 0o600, exclusive=True)
    resp = create(fs, f"{home}/tar", 0o444)
    assert resp.inode.mode & 0o7777 == 0o444 and resp.HasField("session") and not resp.created
    assert fs.stat(f"{home}/tar").mode == 0o444
    fs.chmod(f"{home}/tar", 0o666)
    with cluster.connect("bob") as bob, pytest.raises(PermissionError):
        create(bob, f"{home}/tar", 0o600)
    assert fs.stat(f"{home}/tar").mode == 0o666
    resp = create(fs, f"{home}/new", 0o640)
    assert resp.created and resp.inode.mode & 0o7777 == 0o640


def test_create_expecting_an_inode_opens_only_that_file(fs: hf3fs.FileSystem, home: str) -> None:
    """CreateRequest.expect_inode_id (the mount's write-back of a file created earlier): the path must still name
    that file; a path that names another file, or none, is ESTALE and nothing is opened or created there."""
    from fireflyer.meta.v1 import meta_pb2 as pb

    def create(path: str, expect: int) -> Any:
        return fs._meta_call(lambda m: m.create, pb.CreateRequest(
            path=pb.PathAt(path=path), mode=0o644, open_mode=pb.OPEN_MODE_WRITE, truncate=True,
            session_id=os.urandom(8).hex(), client_id=fs.client_id, expect_inode_id=expect), path)  # fmt: skip

    mine = fs.create(f"{home}/f", 0o644, exclusive=True).inode_id
    assert create(f"{home}/f", mine).inode.inode_id == mine  # still there: opened
    fs.rename(f"{home}/f", f"{home}/moved")
    with fs.open(f"{home}/f", "wb") as other:
        other.write(b"another file")
    with pytest.raises(OSError) as stale:
        create(f"{home}/f", mine)
    assert stale.value.errno == errno.ESTALE
    with fs.open(f"{home}/f", "rb") as other:
        assert other.read() == b"another file"  # the file that took the name is untouched
    with pytest.raises(OSError) as gone:
        create(f"{home}/none", mine)  # no file at the path: not created
    assert gone.value.errno == errno.ESTALE and not fs.exists(f"{home}/none")
    with pytest.raises(FileNotFoundError):
        create(f"{home}/f", 1 << 63)  # an id no inode can have
