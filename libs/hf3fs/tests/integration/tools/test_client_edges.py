"""Edges of the client and its fsspec layer on a real cluster (issue 16, defects 5, 7 and 8): a quota error from
the write that crosses the limit, not from close; fsspec making missing parents wherever it creates a file; the
``3fs://`` form of a URL."""

from __future__ import annotations

import errno

import fsspec
import pytest

import hf3fs

from .conftest import FsCluster


def _folder_with_quota(cluster: FsCluster, path: str, max_bytes: int) -> None:
    cluster.client.makedirs(path, exist_ok=True)
    admin = hf3fs.connect(mgmtd=cluster.mgmtd, token=cluster.admin_token)
    try:
        admin.set_quota(path, max_bytes=max_bytes)
    finally:
        admin.close()


def test_a_buffered_write_over_quota_fails_at_write_and_keeps_what_fit(fs_cluster: FsCluster) -> None:
    client = fs_cluster.client
    _folder_with_quota(fs_cluster, "/ffs/quota-write", 1 << 20)
    with client.open("/ffs/quota-write/f", "wb") as f:  # buffered: 4 MiB before anything reaches storage
        f.write(b"a" * 600_000)
        with pytest.raises(OSError) as refused:
            f.write(b"b" * 600_000)
        assert refused.value.errno == errno.EDQUOT
    assert client.stat("/ffs/quota-write/f").size == 600_000
    with client.open("/ffs/quota-write/f", "rb") as f:
        assert f.read() == b"a" * 600_000


def test_an_unbuffered_write_is_cut_short_where_the_quota_ends(fs_cluster: FsCluster) -> None:
    client = fs_cluster.client
    _folder_with_quota(fs_cluster, "/ffs/quota-short", 1 << 20)
    with client.open("/ffs/quota-short/f", "wb", buffering=0) as f:
        assert f.write(b"a" * 600_000) == 600_000
        assert f.write(b"b" * 600_000) == (1 << 20) - 600_000  # a short write, as on a full disk
        with pytest.raises(OSError) as refused:
            f.write(b"c")
        assert refused.value.errno == errno.EDQUOT
    assert client.stat("/ffs/quota-short/f").size == 1 << 20


def test_fsspec_makes_missing_parents_wherever_it_creates_a_file(fs_cluster: FsCluster) -> None:
    fs = fsspec.filesystem("hf3fs", **fs_cluster.storage_options)
    fs.makedirs("/ffs/parents/src", exist_ok=True)
    fs.touch("/ffs/parents/t1/t2/touched")
    fs.pipe_file("/ffs/parents/p1/p2/piped", b"piped")
    fs.cp_file("/ffs/parents/p1/p2/piped", "/ffs/parents/c1/c2/copied")
    assert fs.cat_file("/ffs/parents/c1/c2/copied") == b"piped" and fs.info("/ffs/parents/t1/t2/touched")["size"] == 0
    fs.pipe({"/ffs/parents/src/a": b"A", "/ffs/parents/src/b": b"B"})
    fs.copy("/ffs/parents/src/*", "/ffs/parents/d1/", recursive=True)  # used to drop files silently
    assert sorted(fs.ls("/ffs/parents/d1", detail=False)) == ["/ffs/parents/d1/a", "/ffs/parents/d1/b"]
    strict = fsspec.filesystem("hf3fs", auto_mkdir=False, skip_instance_cache=True, **fs_cluster.storage_options)
    with pytest.raises(FileNotFoundError):
        strict.touch("/ffs/parents/none/x")


def test_3fs_and_hf3fs_urls_name_the_same_file(fs_cluster: FsCluster) -> None:
    opts = fs_cluster.storage_options
    with fsspec.open("3fs:///ffs/urls/x", "wb", **opts) as f:
        f.write(b"same")
    with fsspec.open("hf3fs:///ffs/urls/x", "rb", **opts) as f:
        assert f.read() == b"same"
    assert fs_cluster.client.stat("/ffs/urls/x").size == 4


def test_reads_into_the_callers_buffers_fill_holes_with_zeros_and_stop_at_the_end(fs_cluster: FsCluster) -> None:
    """``read_batch_into`` and ``readinto`` land the chunks straight in the caller's buffer: a hole and a short
    chunk must read as zeros there too (the buffer is not fresh), and a read past the end comes back short."""
    client = fs_cluster.client
    with client.open("/ffs/sparse", "wb", buffering=0) as f:
        chunk = f.layout.chunk_size
        f.seek(chunk + 10)  # chunk 0 a hole; chunk 1 holds 110 bytes, its first 10 a hole
        f.write(b"x" * 100)
    expected = bytes(chunk + 10) + b"x" * 100
    dirty = [bytearray(b"\xff" * (chunk + 200)), bytearray(b"\xff" * 64)]
    got = client.read_batch_into([("/ffs/sparse", 0, chunk + 200), ("/ffs/sparse", chunk + 60, 64)], dirty)
    assert got == [chunk + 110, 50]
    assert dirty[0][: got[0]] == expected and dirty[1][:50] == b"x" * 50
    assert client.read_batch([("/ffs/sparse", 0, chunk + 200)]) == [expected]
    with client.open("/ffs/sparse", "rb", buffering=0) as f:
        view = bytearray(b"\xff" * (chunk + 110))
        assert f.readinto(view) == chunk + 110 and view == expected

    with client.open("/ffs/short", "wb", buffering=0) as f:  # chunk 0 short (10 bytes stored), chunk 1 a hole
        f.write(b"a" * 10)
        f.seek(2 * chunk)
        f.write(b"b" * 5)
    dirty = [bytearray(b"\xff" * (2 * chunk + 5))]
    assert client.read_batch_into([("/ffs/short", 0, 2 * chunk + 5)], dirty) == [2 * chunk + 5]
    assert dirty[0] == b"a" * 10 + bytes(2 * chunk - 10) + b"b" * 5

    for bad in ([bytearray(10)], [bytes(chunk + 200)], []):  # too small, read-only, one buffer short
        with pytest.raises(ValueError):
            client.read_batch_into([("/ffs/sparse", 0, chunk + 200)], bad)
