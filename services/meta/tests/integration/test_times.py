"""mtimes set while a file is open for writing stay where they were put (issue 16, defect 3): ``cp -p`` and
``tar x`` set the time after the last write but before the close reaches meta (FUSE releases a file
asynchronously), and the writer's Close, Sync or length report must not put its write time back."""

from __future__ import annotations

import time

import hf3fs

T_NS = 1_000_000_000 * 10**9  # 2001-09-09
ATIME_NS = 999_000_000 * 10**9


def test_utime_before_close_survives_the_close(fs: hf3fs.FileSystem, home: str) -> None:
    path = f"{home}/copied"
    f = fs.open(path, "wb", buffering=0)
    f.write(b"x" * 1000)
    fs.utime(path, ns=(ATIME_NS, T_NS))
    f.close()
    st = fs.stat(path)
    assert (st.mtime_ns, st.atime_ns, st.size) == (T_NS, ATIME_NS, 1000)


def test_utime_survives_a_length_report_and_fsync(fs: hf3fs.FileSystem, home: str) -> None:
    path = f"{home}/reported"
    f = fs.open(path, "wb", buffering=0)
    f.write(b"y" * 5000)
    fs.utime(path, ns=(ATIME_NS, T_NS))
    fs.renew_sessions_now()  # meta adopts the reported length 5000: not a new write time
    st = fs.stat(path)
    assert (st.size, st.mtime_ns) == (5000, T_NS)
    f.fsync()
    assert fs.stat(path).mtime_ns == T_NS
    f.close()
    assert fs.stat(path).mtime_ns == T_NS


def test_a_write_after_the_utime_wins(fs: hf3fs.FileSystem, home: str) -> None:
    path = f"{home}/rewritten"
    f = fs.open(path, "wb", buffering=0)
    f.write(b"a" * 100)
    fs.utime(path, ns=(ATIME_NS, T_NS))
    before_write = time.time_ns()
    f.write(b"b" * 100)
    f.close()
    st = fs.stat(path)
    assert st.size == 200
    assert st.mtime_ns >= before_write > T_NS


def test_utime_after_close_stays(fs: hf3fs.FileSystem, home: str) -> None:
    path = f"{home}/closed"
    with fs.open(path, "wb") as f:
        f.write(b"z" * 10)
    fs.utime(path, ns=(ATIME_NS, T_NS))
    with fs.open(path, "rb") as f:
        assert f.read() == b"z" * 10
    assert fs.stat(path).mtime_ns == T_NS
