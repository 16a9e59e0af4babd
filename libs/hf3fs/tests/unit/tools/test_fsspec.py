from __future__ import annotations

from pathlib import Path

import fsspec
import pandas as pd
import pytest

from hf3fs.fsspec_fs import Hf3fsFileSystem

from .conftest import LocalFs


@pytest.fixture
def fs(local_fs: LocalFs) -> Hf3fsFileSystem:
    return Hf3fsFileSystem(fs=local_fs, skip_instance_cache=True)


def test_protocol_is_registered(local_fs: LocalFs) -> None:
    assert fsspec.get_filesystem_class("hf3fs") is Hf3fsFileSystem
    f, path = fsspec.core.url_to_fs("hf3fs:///d/x.bin", fs=local_fs)
    assert isinstance(f, Hf3fsFileSystem) and path == "/d/x.bin"


def test_tree_ops(fs: Hf3fsFileSystem, local_fs: LocalFs) -> None:
    fs.makedirs("hf3fs:///a/b")
    fs.pipe_file("/a/b/x", b"0123456789")
    fs.pipe_file("/a/y", b"yy")
    assert fs.ls("/a", detail=False) == ["/a/b", "/a/y"]
    info = fs.info("hf3fs:///a/b/x")
    assert (info["name"], info["size"], info["type"]) == ("/a/b/x", 10, "file")
    assert fs.info("/a")["type"] == "directory"
    assert fs.cat_file("/a/b/x") == b"0123456789"
    assert fs.cat_file("/a/b/x", start=2, end=5) == b"234"
    assert fs.cat_file("/a/b/x", start=-3) == b"789"
    assert fs.cat_file("/a/b/x", start=8, end=100) == b"89"
    assert fs.cat_file("/a/b/x", start=5, end=-6) == b""
    assert sorted(fs.find("/a")) == ["/a/b/x", "/a/y"]
    fs.cp_file("/a/b/x", "/a/z")
    assert fs.cat("/a/z") == b"0123456789"
    fs.mv("/a/b", "/c")
    assert fs.exists("/c/x") and not fs.exists("/a/b")
    with pytest.raises(IsADirectoryError):
        fs.rm("/c")
    fs.rm("/c", recursive=True)
    assert not fs.exists("/c")
    fs.rm("/a/z")
    assert fs.ls("/a", detail=False) == ["/a/y"]
    with pytest.raises(FileExistsError):
        fs.mkdir("/a")
    with pytest.raises(FileNotFoundError):
        fs.info("/nope")


def test_put_get_and_text(fs: Hf3fsFileSystem, tmp_path: Path) -> None:
    src = tmp_path / "in.txt"
    src.write_text("hello\nworld\n")
    fs.mkdir("/t")
    fs.put(str(src), "/t/in.txt")
    with fs.open("/t/in.txt", "r") as f:
        assert f.read().splitlines() == ["hello", "world"]
    fs.get("/t/in.txt", str(tmp_path / "out.txt"))
    assert (tmp_path / "out.txt").read_text() == src.read_text()


def test_pandas_parquet_round_trip(local_fs: LocalFs) -> None:
    df = pd.DataFrame({"a": range(1000), "b": [f"s{i}" for i in range(1000)]})
    opts = {"fs": local_fs}
    df.to_parquet("hf3fs:///frames/x.parquet", storage_options=opts)
    back = pd.read_parquet("hf3fs:///frames/x.parquet", storage_options=opts)
    pd.testing.assert_frame_equal(df, back)
    df.to_csv("hf3fs:///frames/x.csv", index=False, storage_options=opts)
    pd.testing.assert_frame_equal(df, pd.read_csv("hf3fs:///frames/x.csv", storage_options=opts))
