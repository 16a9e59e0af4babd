from __future__ import annotations

import dataclasses
import errno
import os
import stat
from typing import Any

import pytest

try:
    import mfusepy

    from hf3fs.fuse import UTIME_NOW, UTIME_OMIT, Hf3fsOperations, MountOptions
except OSError as exc:  # mfusepy loads libfuse when imported
    pytest.skip(f"libfuse is not installed ({exc}); scripts/bootstrap.sh installs fuse3", allow_module_level=True)

from .conftest import LocalFs


@pytest.fixture
def ops(local_fs: LocalFs) -> Hf3fsOperations:
    return Hf3fsOperations(local_fs)


def test_write_read_and_size_while_buffered(ops: Hf3fsOperations, local_fs: LocalFs) -> None:
    fh = ops.create("/f", 0o100640, os.O_WRONLY | os.O_CREAT)
    assert ops.write("/f", b"hello", 0, fh) == 5
    assert ops.write("/f", b"world", 5, fh) == 5
    # the bytes may still sit in the handle's buffer; the size the kernel sees already counts them
    assert ops.getattr("/f")["st_size"] == 10
    rd = ops.open("/f", os.O_RDONLY)
    assert ops.read("/f", 100, 3, rd) == b"loworld"  # a reader sees what another handle wrote
    ops.fsync("/f", 0, fh)
    ops.flush("/f", fh)
    ops.release("/f", fh)
    ops.release("/f", rd)
    attrs = ops.getattr("/f")
    assert stat.S_ISREG(attrs["st_mode"]) and attrs["st_mode"] & 0o7777 == 0o640 and attrs["st_size"] == 10
    assert attrs["st_uid"] == os.getuid() and attrs["st_mtime"] > 10**18  # nanoseconds
    with pytest.raises(mfusepy.FuseOSError) as exc:
        ops.read("/f", 1, 0, fh)
    assert exc.value.errno == errno.EBADF


def test_a_release_between_the_meta_stat_and_the_handles_is_not_missed(
    ops: Hf3fsOperations, local_fs: LocalFs, monkeypatch: pytest.MonkeyPatch
) -> None:
    fh = ops.create("/g", 0o644, os.O_WRONLY)
    ops.write("/g", b"hello", 0, fh)
    real_lstat = local_fs.lstat
    seen: list[int] = []

    def racing_lstat(path: str) -> Any:
        st = real_lstat(path)
        if not seen:  # meta answers from before the close; then the writer's release finishes, handle gone
            ops.release("/g", fh)
            st = dataclasses.replace(st, size=0)
        seen.append(st.size)
        return st

    monkeypatch.setattr(local_fs, "lstat", racing_lstat)
    assert ops.getattr("/g")["st_size"] == 5  # not the stale 0 that neither the stat nor the handles showed
    assert seen == [0, 5]


def test_truncate_and_o_trunc(ops: Hf3fsOperations, local_fs: LocalFs) -> None:
    fh = ops.create("/t", 0o644, os.O_RDWR)
    ops.write("/t", b"x" * 100, 0, fh)
    ops.truncate("/t", 10)
    assert ops.getattr("/t")["st_size"] == 10
    ops.release("/t", fh)
    fh = ops.open("/t", os.O_WRONLY | os.O_TRUNC)
    assert ops.getattr("/t")["st_size"] == 0
    ops.release("/t", fh)


def test_names(ops: Hf3fsOperations, local_fs: LocalFs) -> None:
    ops.mkdir("/d", 0o750)
    fh = ops.create("/d/a", 0o644, os.O_WRONLY)
    ops.write("/d/a", b"A", 0, fh)
    ops.release("/d/a", fh)
    fh = ops.create("/d/b", 0o644, os.O_WRONLY)
    ops.write("/d/b", b"BB", 0, fh)
    ops.release("/d/b", fh)
    ops.rename("/d/a", "/d/b")  # over an existing file
    assert local_fs.listdir("/d") == ["b"] and ops.getattr("/d/b")["st_size"] == 1
    ops.symlink("/d/s", "b")
    assert ops.readlink("/d/s") == "b" and stat.S_ISLNK(ops.getattr("/d/s")["st_mode"])
    ops.link("/d/h", "/d/b")
    assert ops.getattr("/d/b")["st_nlink"] == 2
    names = ops.readdir("/d", 0)
    assert names[:2] == [".", ".."] and [n[0] for n in names[2:]] == ["b", "h", "s"]
    ops.chmod("/d/b", 0o100600)
    assert ops.getattr("/d/b")["st_mode"] & 0o7777 == 0o600
    ops.utimens("/d/b", (1_000_000_000, 2_000_000_000))
    assert (ops.getattr("/d/b")["st_atime"], ops.getattr("/d/b")["st_mtime"]) == (1_000_000_000, 2_000_000_000)
    ops.utimens("/d/b", (UTIME_OMIT, 5_000_000_000))
    assert (ops.getattr("/d/b")["st_atime"], ops.getattr("/d/b")["st_mtime"]) == (1_000_000_000, 5_000_000_000)
    ops.utimens("/d/b", (UTIME_NOW, UTIME_OMIT))
    assert ops.getattr("/d/b")["st_atime"] > 10**18 and ops.getattr("/d/b")["st_mtime"] == 5_000_000_000
    ops.chown("/d/b", os.getuid(), -1)  # the mounting user's id stands for "unchanged"
    for name in ("h", "s", "b"):
        ops.unlink(f"/d/{name}")
    ops.rmdir("/d")
    assert local_fs.listdir("/") == []
    assert ops.statfs("/")["f_blocks"] == (1 << 40) // 4096


def test_errors_keep_errno(ops: Hf3fsOperations) -> None:
    cases = [
        (lambda: ops.getattr("/nope"), errno.ENOENT),
        (lambda: ops.mkdir("/", 0o755), errno.EEXIST),
        (lambda: ops.rmdir("/nope"), errno.ENOENT),
        (lambda: ops.create("/x/y", 0o644, os.O_WRONLY), errno.ENOENT),
    ]
    ops.mkdir("/full", 0o755)
    ops.mkdir("/full/in", 0o755)
    cases.append((lambda: ops.rmdir("/full"), errno.ENOTEMPTY))
    for call, code in cases:
        with pytest.raises(mfusepy.FuseOSError) as exc:
            call()
        assert exc.value.errno == code


def test_keep_ids(local_fs: LocalFs) -> None:
    local_fs.create("/f")
    ops = Hf3fsOperations(local_fs, MountOptions(keep_ids=True))
    assert ops.getattr("/f")["st_uid"] == local_fs.stat("/f").uid


def test_sequential_writes_stay_buffered(ops: Hf3fsOperations, local_fs: LocalFs) -> None:
    fh = ops.create("/seq", 0o644, os.O_WRONLY)
    raw = ops._get(fh).file.raw  # type: ignore[attr-defined]
    calls = []
    write = raw.write
    raw.write = lambda b: calls.append(len(b)) or write(b)
    for i in range(16):
        ops.write("/seq", bytes([i]) * 256, i * 256, fh)  # what the kernel sends for a sequential writer
    assert calls == []  # nothing left the 8 KiB buffer yet: a seek to the same offset must not flush it
    ops.write("/seq", b"z", 10, fh)  # a write elsewhere first sends what was buffered
    assert calls == [4096]
    ops.release("/seq", fh)
    with local_fs.open("/seq", "rb") as f:
        data = f.read()
    assert len(data) == 4096 and data[10:11] == b"z" and data[256:257] == b"\x01"
