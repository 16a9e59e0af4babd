from __future__ import annotations

import dataclasses
import errno
import os
import stat
from typing import Any

import pytest

try:
    import mfusepy

    from ff_rpc import Identity, current_acting
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


def test_writes_stay_buffered_until_a_flush_sends_every_extent_in_one_batch(
    ops: Hf3fsOperations, local_fs: LocalFs
) -> None:
    fh = ops.create("/seq", 0o644, os.O_WRONLY)
    raw = ops._get(fh).file.raw  # type: ignore[attr-defined]
    calls: list[list[tuple[int, int]]] = []
    write_extents = raw.write_extents
    raw.write_extents = lambda ext: calls.append([(at, len(b)) for at, b in ext]) or write_extents(ext)
    for i in range(16):
        ops.write("/seq", bytes([i]) * 256, i * 256, fh)  # what the kernel sends for a sequential writer
    ops.write("/seq", b"z", 10, fh)  # over bytes buffered: merged in place
    ops.write("/seq", b"p" * 100, 6000, fh)  # elsewhere (a database's other page): buffered too
    assert calls == []
    ops.fsync("/seq", 1, fh)  # fdatasync: both extents in one storage batch
    assert calls == [[(0, 4096), (6000, 100)]]
    ops.write("/seq", b"q" * 8192, 0, fh)  # a buffer's worth goes at once
    assert calls[1:] == [[(0, 8192)]]
    ops.release("/seq", fh)
    with local_fs.open("/seq", "rb") as f:
        data = f.read()
    assert len(data) == 8192 and data == b"q" * 8192
    assert len(calls) == 2  # nothing was left to send at the release


def test_a_read_sends_only_what_is_buffered_in_its_range_and_reads_zeros_before_bytes_still_buffered(
    ops: Hf3fsOperations,
) -> None:
    fh = ops.create("/r", 0o644, os.O_RDWR)
    ops.write("/r", b"a" * 100, 0, fh)
    ops.fsync("/r", 1, fh)
    rd = ops.open("/r", os.O_RDONLY)  # (an open sends what writers here buffered: close-to-open)
    ops.write("/r", b"b" * 10, 5000, fh)  # buffered, past storage's end
    ops.write("/r", b"c" * 10, 50, fh)  # buffered, inside
    raw = ops._get(fh).file.raw  # type: ignore[attr-defined]
    sent: list[list[tuple[int, int]]] = []
    write_extents = raw.write_extents
    raw.write_extents = lambda ext: sent.append([(at, len(b)) for at, b in ext]) or write_extents(ext)
    assert ops.read("/r", 40, 0, rd) == b"a" * 40 and sent == []  # nothing buffered there
    assert ops.read("/r", 20, 200, rd) == bytes(20)  # a hole before the bytes at 5000: zeros, nothing sent
    assert ops.read("/r", 20, 45, rd) == b"a" * 5 + b"c" * 10 + b"a" * 5 and sent == [[(50, 10)]]
    assert ops.read("/r", 100, 4990, rd) == bytes(10) + b"b" * 10 and sent[1:] == [[(5000, 10)]]
    assert ops.read("/r", 100, 5010, rd) == b""  # the end
    ops.release("/r", fh)
    ops.release("/r", rd)


def test_mknod_makes_fifos_sockets_devices_and_plain_files(ops: Hf3fsOperations) -> None:
    ops.mknod("/fifo", stat.S_IFIFO | 0o640, 0)
    ops.mknod("/plain", stat.S_IFREG | 0o600, 0)  # mknod(S_IFREG) is an empty file
    assert stat.S_ISFIFO(ops.getattr("/fifo")["st_mode"]) and ops.getattr("/fifo")["st_mode"] & 0o7777 == 0o640
    assert stat.S_ISREG(ops.getattr("/plain")["st_mode"]) and ops.getattr("/plain")["st_size"] == 0
    if os.getuid() == 0:  # making device nodes needs root here too
        ops.mknod("/tty", stat.S_IFCHR | 0o600, os.makedev(5, 0))
        attrs = ops.getattr("/tty")
        assert stat.S_ISCHR(attrs["st_mode"]) and attrs["st_rdev"] == os.makedev(5, 0)
    with pytest.raises(mfusepy.FuseOSError) as exc:
        ops.mknod("/fifo", stat.S_IFIFO | 0o640, 0)
    assert exc.value.errno == errno.EEXIST


def test_times_and_owner_of_a_symlink_change_the_link_not_its_target(ops: Hf3fsOperations, local_fs: LocalFs) -> None:
    local_fs.create("/target")
    local_fs.utime("/target", ns=(3_000_000_000, 4_000_000_000))
    ops.symlink("/link", "target")
    ops.utimens("/link", (1_000_000_000, 2_000_000_000))  # what utimensat(AT_SYMLINK_NOFOLLOW) sends
    assert (ops.getattr("/link")["st_atime"], ops.getattr("/link")["st_mtime"]) == (1_000_000_000, 2_000_000_000)
    assert (ops.getattr("/target")["st_atime"], ops.getattr("/target")["st_mtime"]) == (3_000_000_000, 4_000_000_000)
    if os.getuid() == 0:  # lchown to another user needs root
        ops = Hf3fsOperations(local_fs, MountOptions(keep_ids=True))
        ops.chown("/link", 4321, 4321)
        assert (ops.getattr("/link")["st_uid"], ops.getattr("/target")["st_uid"]) == (4321, 0)


class _Recording:
    """The client stand-in, noting as whom each metadata call was made."""

    def __init__(self, fs: LocalFs) -> None:
        self._fs = fs
        self.seen: list[tuple[str, Identity | None]] = []

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._fs, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            self.seen.append((name, current_acting()))
            return real(*args, **kwargs)

        return call


def test_a_multi_user_mount_runs_name_calls_as_the_caller(local_fs: LocalFs, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mfusepy, "fuse_get_context", lambda: (4321, 8765, os.getpid()))
    groups = tuple(g for g in os.getgroups() if g != 8765)
    fs = _Recording(local_fs)
    ops = Hf3fsOperations(fs, MountOptions(multi_user=True))
    ops.mkdir("/d", 0o755)
    fh = ops.create("/d/f", 0o644, os.O_WRONLY)
    fs.seen.clear()
    ops.write("/d/f", b"data", 0, fh)  # calls on an open handle were checked at open: the mount's own user
    ops.release("/d/f", fh)
    assert {who for _, who in fs.seen} <= {None}
    fs.seen.clear()
    ops.getattr("/d/f")
    who = Identity(4321, (8765, *groups))
    assert fs.seen == [("lstat", who)]
    fs.seen.clear()
    ops.chmod("/d/f", 0o600)  # (the mount looks at the mode itself first: is it the kernel clearing set-id bits?)
    ops.unlink("/d/f")
    assert [c for c in fs.seen if c[0] != "lstat"] == [("chmod", who), ("remove", who)], fs.seen
    assert current_acting() is None  # nothing left set in the FUSE thread
    fs.seen.clear()
    Hf3fsOperations(fs, MountOptions()).getattr("/d")  # a single-user mount acts as its token's user
    assert fs.seen == [("lstat", None)]


def test_a_handle_reads_what_another_wrote_over_bytes_it_read_before(ops: Hf3fsOperations) -> None:
    one = ops.create("/db", 0o644, os.O_RDWR)
    ops.write("/db", b"a" * 8192, 0, one)
    ops.fsync("/db", 0, one)
    two = ops.open("/db", os.O_RDWR)  # as SQLite's processes do: both handles may write
    assert ops.read("/db", 10, 0, two) == b"a" * 10  # a buffered reader would keep 8 KiB of it
    ops.write("/db", b"b" * 10, 100, one)  # not flushed yet: it sits in the handle's buffer
    assert ops.read("/db", 10, 100, two) == b"b" * 10
    ops.write("/db", b"c" * 10, 100, two)
    assert ops.read("/db", 10, 100, one) == b"c" * 10
    ops.release("/db", one)
    ops.release("/db", two)


def test_a_folder_is_listed_through_its_handle(ops: Hf3fsOperations) -> None:
    ops.mkdir("/d", 0o755)
    ops.mkdir("/d/e", 0o755)
    fh = ops.opendir("/d")
    assert [n if isinstance(n, str) else n[0] for n in ops.readdir(None, fh)] == [".", "..", "e"]  # nullpath_ok
    ops.releasedir(None, fh)
    with pytest.raises(mfusepy.FuseOSError) as exc:
        ops.readdir(None, fh)
    assert exc.value.errno == errno.EBADF
    with pytest.raises(mfusepy.FuseOSError) as exc:
        ops.opendir("/nope")
    assert exc.value.errno == errno.ENOENT


def test_the_kernel_clearing_set_id_bits_on_a_write_runs_as_the_mount(
    local_fs: LocalFs, monkeypatch: pytest.MonkeyPatch
) -> None:
    local_fs.create("/suid", mode=0o644)
    local_fs.chmod("/suid", 0o6755)
    owner = local_fs.stat("/suid").uid
    monkeypatch.setattr(mfusepy, "fuse_get_context", lambda: (owner + 4321, 8765, os.getpid()))
    fs = _Recording(local_fs)
    ops = Hf3fsOperations(fs, MountOptions(multi_user=True))
    ops.chmod("/suid", 0o755)  # what file_remove_privs sends after a non-owner's write (default_permissions)
    assert [c for c in fs.seen if c[0] == "chmod"] == [("chmod", None)]
    assert local_fs.stat("/suid").mode == 0o755
    fs.seen.clear()
    ops.chmod("/suid", 0o700)  # anything else is the caller's own chmod, for meta to judge
    assert [who.uid if who else None for name, who in fs.seen if name == "chmod"] == [owner + 4321]


def test_mkdir_of_a_name_known_here_is_eexist_without_asking_meta(
    ops: Hf3fsOperations, local_fs: LocalFs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name this single-user mount made or saw within the attribute timeout answers EEXIST at once (tar x makes
    every parent again); a name it does not know is asked of meta, and a multi-user mount always asks."""
    ops.mkdir("/made", 0o755)
    calls: list[str] = []
    real_mkdir = local_fs.mkdir

    def counted(path: str, mode: int = 0o755) -> None:
        calls.append(path)
        real_mkdir(path, mode)

    monkeypatch.setattr(local_fs, "mkdir", counted)
    for _ in range(3):
        with pytest.raises(mfusepy.FuseOSError) as exc:
            ops.mkdir("/made", 0o755)
        assert exc.value.errno == errno.EEXIST
    assert calls == []
    os.mkdir(local_fs.root / "elsewhere")  # made by another client: not known here
    with pytest.raises(mfusepy.FuseOSError) as exc:
        ops.mkdir("/elsewhere", 0o755)
    assert exc.value.errno == errno.EEXIST and calls == ["/elsewhere"]
    multi = Hf3fsOperations(local_fs, MountOptions(multi_user=True))
    multi.mkdir("/m", 0o755)
    with pytest.raises(mfusepy.FuseOSError) as exc:
        multi.mkdir("/m", 0o755)
    assert exc.value.errno == errno.EEXIST and calls == ["/elsewhere", "/m", "/m"]
