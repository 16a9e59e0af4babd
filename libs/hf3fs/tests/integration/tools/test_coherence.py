"""Length and content coherent across handles and processes (issue 16, defect 1): a handle opened before another
process grew the file reads the new bytes; appends from several processes lose nothing; several writers never
shrink a file one of them grew."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import hf3fs
from ff_testing.environ import clean_env

from .conftest import FsCluster

RECORD_BYTES = 28


def _in_process(cluster: FsCluster, body: str) -> subprocess.Popen[str]:
    """``body`` in a new Python process with ``fs`` connected to the cluster as the test user."""
    connect = f"fs = hf3fs.connect(mgmtd={cluster.mgmtd!r}, token={cluster.token!r})"
    script = f"import os, hf3fs\n{connect}\n{body}\nfs.close()\n"
    env = clean_env()
    return subprocess.Popen(
        [sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _fresh(client: hf3fs.FileSystem, path: str, data: bytes = b"") -> None:
    client.makedirs("/ffs/coherent", exist_ok=True)
    with client.open(path, "wb") as f:
        f.write(data)


def _run_in_process(cluster: FsCluster, body: str) -> None:
    proc = _in_process(cluster, body)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err


def test_a_reader_opened_before_another_process_wrote_at_8192_reads_it(fs_cluster: FsCluster) -> None:
    client = fs_cluster.client
    _fresh(client, "/ffs/coherent/grow", b"a" * 100)
    raw = client.open("/ffs/coherent/grow", "rb", buffering=0)
    buffered = client.open("/ffs/coherent/grow", "rb")
    try:
        assert raw.read() == b"a" * 100  # the handle has seen the end once
        _run_in_process(
            fs_cluster, "with fs.open('/ffs/coherent/grow', 'r+b') as f:\n    f.seek(8192)\n    f.write(b'DDDD')"
        )
        raw.seek(8192)
        assert raw.read(4) == b"DDDD"  # pread(reader, 4, 8192), as on a local disk
        assert raw.seek(0, os.SEEK_END) == 8196
        assert buffered.read() == b"a" * 100 + bytes(8092) + b"DDDD"
    finally:
        raw.close()
        buffered.close()


def test_a_reader_sees_what_another_handle_of_the_same_client_wrote(fs_cluster: FsCluster) -> None:
    """The mount keeps one handle per open: a reader's handle sees a writer's bytes before the writer closes."""
    client = fs_cluster.client
    _fresh(client, "/ffs/coherent/shared", b"x" * 10)
    reader = client.open("/ffs/coherent/shared", "rb", buffering=0)
    writer = client.open("/ffs/coherent/shared", "r+b", buffering=0)
    try:
        writer.seek(10)
        writer.write(b"yyyy")
        assert reader.read() == b"x" * 10 + b"yyyy"
    finally:
        writer.close()
        reader.close()
    assert client.stat("/ffs/coherent/shared").size == 14


def _appender(path: str, tag: str, count: int) -> str:
    return (
        f"with fs.open({path!r}, 'ab') as f:\n"
        f"    for i in range({count}):\n"
        f"        f.write(('{tag}-%05d-' % i).encode().ljust({RECORD_BYTES - 1}, b'.') + b'\\n')\n"
        f"        f.flush()"
    )


def _records(data: bytes) -> list[bytes]:
    assert len(data) % RECORD_BYTES == 0, len(data)
    return [data[i : i + RECORD_BYTES] for i in range(0, len(data), RECORD_BYTES)]


def test_two_processes_appending_lose_nothing(fs_cluster: FsCluster) -> None:
    client = fs_cluster.client
    path = "/ffs/coherent/log"
    _fresh(client, path)
    early = client.open(path, "rb")  # a reader opened before the appends
    try:
        assert early.read() == b""
        procs = [_in_process(fs_cluster, _appender(path, tag, 100)) for tag in ("A", "B")]
        for p in procs:
            _, err = p.communicate(timeout=180)
            assert p.returncode == 0, err
        records = _records(early.read())  # sees them all, as a local file's reader would
    finally:
        early.close()
    with client.open(path, "rb") as f:
        assert _records(f.read()) == records
    assert len(records) == 200  # 5,600 bytes, where 2,800 were lost before
    for tag in (b"A", b"B"):
        mine = [r for r in records if r.startswith(tag + b"-")]
        assert [int(r[2:7]) for r in mine] == list(range(100))  # each once, in the order written


def test_threads_of_one_client_appending_lose_nothing(fs_cluster: FsCluster) -> None:
    client = fs_cluster.client
    path = "/ffs/coherent/threads"
    _fresh(client, path)

    def append(tag: str) -> None:
        with client.open(path, "ab", buffering=0) as f:
            for i in range(30):
                f.write(f"{tag}-{i:05d}-".encode().ljust(RECORD_BYTES - 1, b".") + b"\n")

    threads = [threading.Thread(target=append, args=(t,)) for t in "CDE"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    with client.open(path, "rb") as f:
        assert len(_records(f.read())) == 90


def test_a_second_writer_reporting_a_shorter_length_does_not_shrink_the_file(fs_cluster: FsCluster) -> None:
    client = fs_cluster.client
    path = "/ffs/coherent/two-writers"
    _fresh(client, path)
    short = client.open(path, "r+b", buffering=0)
    try:
        short.write(b"s" * 10)
        _run_in_process(fs_cluster, f"with fs.open({path!r}, 'r+b') as f:\n    f.seek(8192)\n    f.write(b'LONG')")
        short.fsync()  # reports 10 after the other writer closed at 8196
    finally:
        short.close()
    assert client.stat(path).size == 8196
    with client.open(path, "rb") as f:
        data = f.read()
    assert data[:10] == b"s" * 10 and data[8192:] == b"LONG"


def test_a_bad_token_is_refused_at_connect_not_reported_as_unreachable(fs_cluster: FsCluster) -> None:
    try:
        hf3fs.connect(mgmtd=fs_cluster.mgmtd, token="fft_not-a-token").close()
    except PermissionError as err:
        assert "token refused" in str(err)
    else:
        raise AssertionError("a bad token was accepted")
