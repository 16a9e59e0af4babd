"""pandas and pyarrow read and write ``hf3fs://`` paths of a real cluster through the fsspec filesystem."""

from __future__ import annotations

import fsspec
import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from .conftest import FsCluster


def test_pandas_parquet_round_trip(fs_cluster: FsCluster) -> None:
    opts = fs_cluster.storage_options
    rng = np.random.default_rng(7)
    df = pd.DataFrame(
        {
            "id": np.arange(200_000, dtype=np.int64),
            "x": rng.standard_normal(200_000),
            "name": [f"row-{i % 977}" for i in range(200_000)],
        }
    )
    df.to_parquet("hf3fs:///pandas/frames/x.parquet", storage_options=opts)  # the folder is made on the way
    back = pd.read_parquet("hf3fs:///pandas/frames/x.parquet", storage_options=opts)
    pd.testing.assert_frame_equal(df, back)
    # the same bytes as seen by the client API, and pyarrow's own reader over the fsspec filesystem
    fs = fsspec.filesystem("hf3fs", **opts)
    assert fs.info("/pandas/frames/x.parquet")["size"] == fs_cluster.client.stat("/pandas/frames/x.parquet").size
    table = pq.read_table("/pandas/frames/x.parquet", filesystem=fs, columns=["id"])
    assert table.num_rows == 200_000 and table.column("id").to_pylist()[-1] == 199_999


def test_fsspec_file_operations(fs_cluster: FsCluster) -> None:
    fs = fsspec.filesystem("hf3fs", **fs_cluster.storage_options)
    fs.makedirs("/ffs/w/a/b", exist_ok=True)
    fs.pipe_file("hf3fs:///ffs/w/a/b/x", bytes(range(256)) * 4096)
    assert fs.cat_file("/ffs/w/a/b/x", start=1000, end=1010) == (bytes(range(256)) * 4096)[1000:1010]
    assert fs.cat_file("/ffs/w/a/b/x", start=-5) == bytes(range(251, 256))
    assert fs.ls("/ffs/w/a", detail=False) == ["/ffs/w/a/b"]
    fs.cp_file("/ffs/w/a/b/x", "/ffs/w/a/y")
    assert fs.info("/ffs/w/a/y")["size"] == 256 * 4096
    fs.mv("/ffs/w/a/b", "/ffs/w/c")
    assert fs.exists("/ffs/w/c/x") and not fs.exists("/ffs/w/a/b")
    with fsspec.open("hf3fs:///ffs/w/t.txt", "w", **fs_cluster.storage_options) as f:
        f.write("hello\n")
    with fsspec.open("hf3fs:///ffs/w/t.txt", "r", **fs_cluster.storage_options) as f:
        assert f.read() == "hello\n"
    fs.rm("/ffs/w", recursive=True)
    assert not fs.exists("/ffs/w") and fs.exists("/ffs")
