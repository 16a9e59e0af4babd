"""Bad input and other users' files: POSIX errors, nothing changed."""

from __future__ import annotations

import errno
from collections.abc import Callable

import pytest

import hf3fs

from .conftest import MetaCluster


def _errno(fn: Callable[[], object]) -> int:
    with pytest.raises(OSError) as exc:
        fn()
    assert exc.value.errno is not None
    return exc.value.errno


def test_bad_paths_and_names_change_nothing(fs: hf3fs.FileSystem, home: str) -> None:
    fs.mkdir(f"{home}/d")
    with fs.open(f"{home}/file", "wb") as f:
        f.write(b"data")
    before = sorted(fs.listdir(home))
    assert _errno(lambda: fs.mkdir(f"{home}/bad\0name")) == errno.EINVAL
    assert _errno(lambda: fs.create(f"{home}/" + "n" * 256)) == errno.ENAMETOOLONG
    assert _errno(lambda: fs.mkdir(f"{home}/" + "é" * 128)) == errno.ENAMETOOLONG  # 256 bytes of UTF-8
    fs.mkdir(f"{home}/" + "é" * 127)  # 254 bytes is fine
    fs.rmdir(f"{home}/" + "é" * 127)
    assert _errno(lambda: fs.mkdir(f"{home}/d/..")) == errno.EEXIST
    assert _errno(lambda: fs.mkdir(f"{home}/missing/x")) == errno.ENOENT
    assert _errno(lambda: fs.create(f"{home}/file/x")) == errno.ENOTDIR
    assert _errno(lambda: fs.open(f"{home}/d", "wb")) == errno.EISDIR
    assert _errno(lambda: fs.open(f"{home}/d", "rb")) == errno.EISDIR
    assert _errno(lambda: fs.rmdir(f"{home}/file")) == errno.ENOTDIR
    assert _errno(lambda: fs.remove(f"{home}/d")) == errno.EISDIR
    assert _errno(lambda: fs.rename(f"{home}/d", f"{home}/d/inside")) == errno.EINVAL
    assert _errno(lambda: fs.rename(f"{home}/d", f"{home}/file")) == errno.ENOTDIR
    assert _errno(lambda: fs.rename(f"{home}/file", f"{home}/d")) == errno.EISDIR
    assert _errno(lambda: fs.rename(f"{home}/nope", f"{home}/x")) == errno.ENOENT
    assert _errno(lambda: fs.link(f"{home}/d", f"{home}/dlink")) == errno.EPERM
    assert _errno(lambda: fs.remove("/")) in (errno.EISDIR, errno.EBUSY)
    assert _errno(lambda: fs.rmdir("/")) == errno.EBUSY
    fs.symlink("loop2", f"{home}/loop1")
    fs.symlink("loop1", f"{home}/loop2")
    assert _errno(lambda: fs.stat(f"{home}/loop1")) == errno.ELOOP
    with pytest.raises(ValueError):
        fs.stat("relative/path")
    with pytest.raises(ValueError):
        fs.open(f"{home}/file", "rw")
    assert sorted(fs.listdir(home)) == sorted([*before, "loop1", "loop2"])
    assert fs.listdir(f"{home}/d") == []
    with fs.open(f"{home}/file") as f:
        assert f.read() == b"data"


def test_other_users_files(cluster: MetaCluster, fs: hf3fs.FileSystem, home: str) -> None:
    fs.chmod(home, 0o755)
    with fs.open(f"{home}/private", "wb", perm=0o600) as f:
        f.write(b"secret")
    with fs.open(f"{home}/shared", "wb", perm=0o644) as f:
        f.write(b"public")
    with cluster.connect("bob") as bob:
        assert bob.stat(f"{home}/private").uid == cluster.uids["alice"]
        assert _errno(lambda: bob.open(f"{home}/private", "rb")) == errno.EACCES
        with bob.open(f"{home}/shared", "rb") as f:
            assert f.read() == b"public"
        assert _errno(lambda: bob.open(f"{home}/shared", "r+b")) == errno.EACCES
        assert _errno(lambda: bob.remove(f"{home}/shared")) == errno.EACCES
        assert _errno(lambda: bob.create(f"{home}/bobs")) == errno.EACCES
        assert _errno(lambda: bob.rename(f"{home}/shared", f"{home}/mine")) == errno.EACCES
        assert _errno(lambda: bob.chmod(f"{home}/shared", 0o666)) == errno.EPERM
        assert _errno(lambda: bob.chown(f"{home}/shared", cluster.uids["bob"], -1)) == errno.EPERM
        assert _errno(lambda: bob.truncate(f"{home}/shared", 0)) == errno.EACCES
        # In the sticky root, bob cannot remove alice's directory either.
        assert _errno(lambda: bob.rmtree(home)) in (errno.EPERM, errno.EACCES)
        # Storage refuses chunk I/O without meta's capability (bob holds the token, not the right).
        st = fs.stat(f"{home}/private")
        assert _errno(lambda: bob.read_batch([(f"{home}/private", 0, 6)])) == errno.EACCES
        del st
    assert sorted(fs.listdir(home)) == ["private", "shared"]
    with fs.open(f"{home}/shared") as f:
        assert f.read() == b"public"
    assert fs.stat(f"{home}/shared").mode == 0o644


def test_storage_needs_the_capability(cluster: MetaCluster, fs: hf3fs.FileSystem, home: str) -> None:
    """Storage itself refuses user chunk I/O without meta's capability, with another file's, or read-only
    for a write (not only the client library)."""
    import asyncio

    from ff_cluster import MgmtdClient
    from fireflyer.meta.v1 import meta_pb2 as pb
    from hf3fs.storage_client import ChunkRead, ChunkWrite, StorageClient, StorageIoError

    with fs.open(f"{home}/f", "wb") as f:
        f.write(b"payload")
    with fs.open(f"{home}/g", "wb") as f:
        f.write(b"other")
    st = fs.stat(f"{home}/f")
    resp = fs._meta_call(lambda m: m.batch_stat, pb.BatchStatRequest(
        paths=[pb.PathAt(path=f"{home}/f"), pb.PathAt(path=f"{home}/g")], follow_last_symlink=True,
        include_read_capability=True))  # fmt: skip
    cap_f, cap_g = (r.read_capability.token for r in resp.results)
    chain = fs._layout(resp.results[0].inode).chain_of(0)

    async def attempt(cap: bytes, write: bool) -> str:
        mg = MgmtdClient([cluster.mgmtd], token=cluster.tokens["alice"])
        sc = StorageClient(mg, cluster.tokens["alice"])
        try:
            if write:
                await sc.batch_write([ChunkWrite(chain_id=chain, inode_id=st.inode_id, chunk_index=0, data=b"evil",
                                                 chunk_size=st.chunk_size, capability=cap)])  # fmt: skip
            else:
                out = await sc.batch_read([ChunkRead(chain_id=chain, inode_id=st.inode_id, chunk_index=0, length=7,
                                                     capability=cap)])  # fmt: skip
                return bytes(out[0].data).decode()
        except StorageIoError as err:
            return f"refused {err.code.name if err.code else ''}"
        finally:
            await sc.close()
            await mg.close()
        return "written"

    assert asyncio.run(attempt(cap_f, write=False)) == "payload"
    assert asyncio.run(attempt(b"", write=False)) == "refused PERMISSION_DENIED"
    assert asyncio.run(attempt(cap_g, write=False)) == "refused PERMISSION_DENIED"
    assert asyncio.run(attempt(cap_f, write=True)) == "refused PERMISSION_DENIED"
    with fs.open(f"{home}/f") as f:
        assert f.read() == b"payload"
