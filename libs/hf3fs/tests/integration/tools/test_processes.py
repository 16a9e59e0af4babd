"""The client across processes: a FileSystem pickles and connects again; a forked child gets a clear error
instead of hanging in gRPC; torch DataLoader workers (spawn) read 3FS files through a FileDataset."""

from __future__ import annotations

import os
import pickle
import select

import pytest
import torch.utils.data

import hf3fs

from .conftest import FsCluster


def test_a_pickled_file_system_connects_again(fs_cluster: FsCluster) -> None:
    fs_cluster.client.makedirs("/ffs/proc", exist_ok=True)
    with fs_cluster.client.open("/ffs/proc/p", "wb") as f:
        f.write(b"pickled")
    again = pickle.loads(pickle.dumps(fs_cluster.client))
    try:
        assert again.client_id != fs_cluster.client.client_id  # a client of its own
        with again.open("/ffs/proc/p", "rb") as f:
            assert f.read() == b"pickled"
    finally:
        again.close()


def _in_child(body: str) -> str:
    """What a forked child of this process reports after running ``body`` (within 30 s, or it hung)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe and never returns
        os.close(r)
        try:
            exec(body, {"hf3fs": hf3fs, "fs": CHILD_STATE["fs"], "mgmtd": CHILD_STATE["mgmtd"]})
            out = "no error"
        except hf3fs.ForkedProcessError as err:
            out = f"ForkedProcessError: {err}"
        except BaseException as err:
            out = f"{type(err).__name__}: {err}"
        os.write(w, out.encode())
        os._exit(0)
    os.close(w)
    try:
        ready, _, _ = select.select([r], [], [], 30)
        if not ready:
            os.kill(pid, 9)
            return "hung"
        return os.read(r, 4096).decode()
    finally:
        os.close(r)
        os.waitpid(pid, 0)


CHILD_STATE: dict[str, object] = {}


@pytest.mark.parametrize("body", ["fs.stat('/ffs')", "hf3fs.connect(mgmtd=mgmtd, token='x').stat('/')"])
def test_a_forked_child_gets_a_clear_error_not_a_hang(fs_cluster: FsCluster, body: str) -> None:
    CHILD_STATE.update(fs=fs_cluster.client, mgmtd=fs_cluster.mgmtd)
    report = _in_child(body)
    assert report.startswith("ForkedProcessError:") and "forkserver" in report, report
    assert fs_cluster.client.isdir("/ffs")  # the parent's client is untouched


def test_dataloader_workers_read_through_a_file_dataset(fs_cluster: FsCluster) -> None:
    client = fs_cluster.client
    client.makedirs("/ffs/loader", exist_ok=True)
    paths = [f"/ffs/loader/s{i:02d}" for i in range(12)]
    for i, p in enumerate(paths):
        with client.open(p, "wb") as f:
            f.write(f"sample {i} ".encode() * (i + 1))
    data = hf3fs.FileDataset(client, paths, transform=bytes.decode)
    assert data[3] == "sample 3 " * 4 and len(data) == 12
    loader = torch.utils.data.DataLoader(data, batch_size=4, num_workers=2, multiprocessing_context="spawn")
    got = [item for batch in loader for item in batch]
    assert got == [f"sample {i} " * (i + 1) for i in range(12)]
