"""3FS through ``hf3fs mount`` (FUSE): git, tar, rename over a file, fsync. Needs /dev/fuse and fusermount3."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import hf3fs
from ff_testing.environ import clean_env

from .conftest import FsCluster, start_cli

MOUNT_TIMEOUT_S = 30.0
MOUNT_STATS_XATTR = "user.hf3fs.mount_stats"  # the name users are told (hf3fs README)


def _skip_reason() -> str | None:
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse on this machine"
    if shutil.which("fusermount3") is None:
        return "fusermount3 not installed (scripts/bootstrap.sh installs fuse3)"
    return None


pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")


@pytest.fixture(scope="module")
def mount(fs_cluster: FsCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``hf3fs mount --foreground`` as a process; unmounted and the daemon gone in teardown."""
    with _mounted(fs_cluster, tmp_path_factory.mktemp("mnt")) as where:
        yield where


@pytest.fixture(scope="module")
def wb_mount(fs_cluster: FsCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The same with ``--writeback``: tar-style new files wait in the mount's memory (hf3fs.fuse.pending)."""
    with _mounted(fs_cluster, tmp_path_factory.mktemp("wbmnt"), "--writeback") as where:
        yield where


@contextlib.contextmanager
def _mounted(fs_cluster: FsCluster, where: Path, *flags: str, fresh: bool = False) -> Iterator[Path]:
    """``hf3fs mount --foreground`` at ``where`` (``fresh``: in a new interpreter, see ``conftest.start_cli``)."""
    log = where.parent / f"{where.name}.log"
    env = clean_env()
    env.update({"FF_MGMTD_ADDRESSES": fs_cluster.mgmtd, "FF_TOKEN": fs_cluster.token})
    with log.open("wb") as out:
        proc = start_cli(["mount", str(where), "--foreground", *flags], env=env, log=out, fresh=fresh)
    try:
        deadline = time.monotonic() + MOUNT_TIMEOUT_S
        while not os.path.ismount(where):
            assert proc.poll() is None, f"mount exited {proc.returncode}: {log.read_text()}"
            assert time.monotonic() < deadline, f"not mounted in time: {log.read_text()}"
            time.sleep(0.1)
        fs_cluster.client.makedirs("/fuse", exist_ok=True)
        yield where / "fuse"
    finally:
        subprocess.run(["fusermount3", "-u", str(where)], capture_output=True, check=False)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            subprocess.run(["fusermount3", "-uz", str(where)], capture_output=True, check=False)
        assert not os.path.ismount(where)


def _git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
        "GIT_CONFIG_NOSYSTEM": "1",
        "HOME": str(repo.parent),
    }
    proc = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 0, f"git {' '.join(args)}: {proc.stderr}"
    return proc.stdout


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_git_init_commit_fsck(mount: Path) -> None:
    repo = mount / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", ".")
    for i in range(12):
        sub = repo / f"dir{i % 3}"
        sub.mkdir(exist_ok=True)
        (sub / f"f{i}.txt").write_text(f"line {i}\n" * (i * 10))
    (repo / "blob.bin").write_bytes(os.urandom(300_000))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "first")
    (repo / "dir0" / "f0.txt").write_text("changed\n")
    _git(repo, "commit", "-q", "-am", "second")
    _git(repo, "repack", "-a", "-d", "-q")  # writes a pack, renames it into place, removes the loose objects
    assert _git(repo, "fsck", "--full", "--strict") == ""
    assert len(_git(repo, "log", "--oneline").splitlines()) == 2
    assert _git(repo, "status", "--porcelain") == ""


def test_tar_extract_equals_source(mount: Path, tmp_path: Path) -> None:
    src = Path(__file__).resolve().parents[3] / "src"  # the hf3fs package sources: a real tree
    archive = tmp_path / "src.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(src, arcname="src", filter=lambda ti: None if "__pycache__" in ti.name else ti)
    (mount / "tar").mkdir()
    subprocess.run(["tar", "-xf", str(archive), "-C", str(mount / "tar")], check=True, timeout=120)
    ref = tmp_path / "ref"
    ref.mkdir()
    subprocess.run(["tar", "-xf", str(archive), "-C", str(ref)], check=True, timeout=120)
    diff = subprocess.run(
        ["diff", "-r", str(ref / "src"), str(mount / "tar" / "src")], capture_output=True, text=True, check=False
    )
    assert diff.returncode == 0, diff.stdout


def test_a_folder_the_mount_makes_names_in_answers_as_meta_does(mount: Path, fs_cluster: FsCluster) -> None:
    """After each create, mknod and mkdir the mount brings its cached Stat of the folder up to date from meta's answer
    (times: the new entry's ctime; a sub-folder adds a link) rather than asking meta: it must answer as meta does."""
    folder = mount / "made_here"
    folder.mkdir()
    os.stat(folder)  # cached now
    for k in range(3):
        os.close(os.open(folder / f"f{k}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        (folder / f"sub{k}").mkdir()
        os.mknod(folder / f"node{k}", 0o644 | stat.S_IFREG)
        here, there = os.stat(folder), fs_cluster.client.stat("/fuse/made_here")
        assert (here.st_mtime_ns, here.st_ctime_ns, here.st_nlink) == (there.mtime_ns, there.ctime_ns, there.nlink)
        assert here.st_nlink == 3 + k


def test_rename_over_existing_file(mount: Path, fs_cluster: FsCluster) -> None:
    (mount / "old").write_bytes(b"new contents")
    (mount / "target").write_bytes(b"the file that gets replaced")
    os.rename(mount / "old", mount / "target")
    assert (mount / "target").read_bytes() == b"new contents"
    assert not (mount / "old").exists()
    assert fs_cluster.client.stat("/fuse/target").size == len(b"new contents")


def test_fsync_makes_length_exact_for_the_client(mount: Path, fs_cluster: FsCluster) -> None:
    data = os.urandom(5 * (1 << 20) + 777)
    fd = os.open(mount / "synced.bin", os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        os.write(fd, data[: 1 << 20])
        os.write(fd, data[1 << 20 :])
        os.fsync(fd)
        # the file is still open: the length the client sees is exact after fsync, not at close
        assert fs_cluster.client.stat("/fuse/synced.bin").size == len(data)
    finally:
        os.close(fd)
    assert fs_cluster.client.read_batch([("/fuse/synced.bin", 0, len(data))])[0] == data


def test_posix_errors_through_the_mount(mount: Path) -> None:
    (mount / "errs").mkdir()
    (mount / "errs" / "f").write_text("x")
    with pytest.raises(FileExistsError):
        (mount / "errs").mkdir()
    with pytest.raises(OSError, match="not empty"):
        os.rmdir(mount / "errs")
    with pytest.raises(FileNotFoundError):
        os.stat(mount / "errs" / "nope")
    os.symlink("f", mount / "errs" / "s")
    assert os.readlink(mount / "errs" / "s") == "f" and (mount / "errs" / "s").read_text() == "x"
    os.link(mount / "errs" / "f", mount / "errs" / "h")
    assert os.stat(mount / "errs" / "f").st_nlink == 2
    os.chmod(mount / "errs" / "f", 0o600)
    assert os.stat(mount / "errs" / "f").st_mode & 0o777 == 0o600
    os.utime(mount / "errs" / "f", ns=(1_000_000_000, 2_000_000_000))
    assert os.stat(mount / "errs" / "f").st_mtime_ns == 2_000_000_000
    with open(mount / "errs" / "f", "r+b") as f:
        f.truncate(0)
    assert os.stat(mount / "errs" / "f").st_size == 0
    assert os.statvfs(mount).f_bsize > 0


def test_df_on_the_mount_shows_the_storage_disks_and_a_folders_quota(mount: Path, fs_cluster: FsCluster) -> None:
    """Issue 16, defect 7: df showed meta's configured 1 TiB. Every target lives under the cluster's folder (one
    file system), kept 3 times; other processes write to that disk meanwhile, hence the tolerance."""
    disk = os.statvfs(fs_cluster.folder)
    got = os.statvfs(mount)
    assert got.f_blocks * got.f_frsize == pytest.approx(disk.f_blocks * disk.f_frsize / 3, abs=got.f_frsize)
    assert got.f_bavail * got.f_frsize == pytest.approx(disk.f_bavail * disk.f_frsize / 3, abs=1 << 30)
    (mount / "quota").mkdir()
    admin = hf3fs.connect(mgmtd=fs_cluster.mgmtd, token=fs_cluster.admin_token)
    try:
        admin.set_quota("/fuse/quota", max_bytes=64 << 20)
    finally:
        admin.close()
    with fs_cluster.client.open("/fuse/quota/f", "wb") as f:  # closed here (the mount's close comes later)
        f.write(b"x" * (1 << 20))
    inside = os.statvfs(mount / "quota")
    assert (inside.f_blocks * inside.f_frsize, inside.f_bavail * inside.f_frsize) == (64 << 20, 63 << 20)


def _quota_folder(mount: Path, fs_cluster: FsCluster, name: str, max_bytes: int) -> Path:
    (mount / name).mkdir()
    admin = hf3fs.connect(mgmtd=fs_cluster.mgmtd, token=fs_cluster.admin_token)
    try:
        admin.set_quota(f"/fuse/{name}", max_bytes=max_bytes)
    finally:
        admin.close()
    return mount / name


def test_quota_is_refused_at_write_and_keeps_what_was_written(mount: Path, fs_cluster: FsCluster) -> None:
    """Issue 16, defect 5: through the mount, `dd` over a folder's quota failed only at close and the file ended
    at 0 bytes. The write that crosses the quota fails (or is cut short), close does not, the bytes before stay."""
    folder = _quota_folder(mount, fs_cluster, "dd-quota", 1 << 20)
    block = os.urandom(256 << 10)
    written = 0
    fd = os.open(folder / "f", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        with pytest.raises(OSError) as refused:
            for _ in range(8):
                written += os.write(fd, block)
        assert refused.value.errno == errno.EDQUOT
    finally:
        os.close(fd)  # no error here
    assert 0 < written <= 1 << 20
    with open(folder / "f", "rb") as f:
        data = f.read()
    assert len(data) == written and data == (block * 4)[:written]


def test_posix_fallocate_grows_the_file_and_is_charged_to_the_quota(mount: Path, fs_cluster: FsCluster) -> None:
    """Issue 16, defect 7: fallocate was unsupported (ENOSYS)."""
    folder = _quota_folder(mount, fs_cluster, "falloc", 4 << 20)
    fd = os.open(folder / "f", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"head")
        os.posix_fallocate(fd, 0, 1 << 20)
        assert os.fstat(fd).st_size == 1 << 20
        assert os.pread(fd, 8, 0) == b"head\0\0\0\0" and os.pread(fd, 4, (1 << 20) - 4) == b"\0" * 4
        os.posix_fallocate(fd, 0, 4096)  # inside the file: nothing changes
        assert os.fstat(fd).st_size == 1 << 20
        with pytest.raises(OSError) as refused:
            os.posix_fallocate(fd, 0, 8 << 20)
        assert refused.value.errno == errno.EDQUOT
        assert os.fstat(fd).st_size == 1 << 20
    finally:
        os.close(fd)
    assert fs_cluster.client.stat("/fuse/falloc/f").size == 1 << 20


def test_times_set_after_close_stay(mount: Path, tmp_path: Path, fs_cluster: FsCluster) -> None:
    """Issue 16, defect 3: mtimes set right after close (`tar x`, `cp -p`, `os.utime`) reverted a couple of
    seconds later, and a following `tar c` said "file changed as we read it"."""
    archive = tmp_path / "old.tar"
    with tarfile.open(archive, "w") as tar:
        for i in range(20):
            info = tarfile.TarInfo(f"tree/f{i}")
            data = os.urandom(3000 + i)
            info.size, info.mtime = len(data), 1_500_000_000 + i
            tar.addfile(info, io.BytesIO(data))
    dest = mount / "times"
    dest.mkdir()
    subprocess.run(["tar", "-xf", str(archive), "-C", str(dest)], check=True, timeout=120)
    src = tmp_path / "local"
    src.write_bytes(b"copied with its times")
    os.utime(src, ns=(1_400_000_000 * 10**9, 1_400_000_000 * 10**9))
    shutil.copy2(src, dest / "copied")
    with open(dest / "touched", "wb") as f:
        f.write(b"x" * 5000)
    os.utime(dest / "touched", ns=(1_300_000_000 * 10**9, 1_300_000_000 * 10**9))
    # past the moment the writers' sessions closed in meta (the kernel releases handles after close): their Close is
    # what put the times back; meta's times are checked too, not only the mount's (which may still be cached)
    in_meta = [f"/fuse/times/tree/f{i}" for i in range(20)] + ["/fuse/times/copied", "/fuse/times/touched"]
    _eventually(lambda: _equal([fs_cluster.client.stat(p).write_sessions for p in in_meta], [0] * len(in_meta)))
    expected_ns = [(1_500_000_000 + i) * 10**9 for i in range(20)] + [1_400_000_000 * 10**9, 1_300_000_000 * 10**9]
    assert [fs_cluster.client.stat(p).mtime_ns for p in in_meta] == expected_ns
    assert [os.stat(dest / "tree" / f"f{i}").st_mtime_ns for i in range(20)] == [
        (1_500_000_000 + i) * 10**9 for i in range(20)
    ]
    assert os.stat(dest / "copied").st_mtime_ns == 1_400_000_000 * 10**9
    assert os.stat(dest / "touched").st_mtime_ns == 1_300_000_000 * 10**9
    again = subprocess.run(
        ["tar", "-cf", str(tmp_path / "again.tar"), "-C", str(dest), "tree"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert again.returncode == 0, again.stderr


# The mount remembers meta's answers for its attribute timeout (1 s here: hf3fs.fuse.attrs); the kernel may keep them
# as long again. Changes made through the mount are seen at once by every handle and process on it; changes made
# by another client within 2 timeouts.
SEEN_ELSEWHERE_S = 2.5


def test_changes_through_one_handle_are_seen_through_the_others_at_once(mount: Path, fs_cluster: FsCluster) -> None:
    path = mount / "cache-handles"
    path.write_bytes(b"x" * 100)
    a = os.open(path, os.O_RDWR)
    b = os.open(path, os.O_RDONLY)
    try:
        assert os.fstat(b).st_size == 100 and os.stat(path).st_size == 100  # both cached now
        os.pwrite(a, b"y" * 50, 100)
        assert os.fstat(b).st_size == 150 and os.stat(path).st_size == 150
        os.fchmod(a, 0o600)
        assert stat.S_IMODE(os.fstat(b).st_mode) == 0o600 and stat.S_IMODE(os.stat(path).st_mode) == 0o600
        os.chmod(path, 0o640)  # by name: the handles' inode sees it
        assert stat.S_IMODE(os.fstat(a).st_mode) == 0o640
        os.utime(path, ns=(1_000_000_000, 2_000_000_000))
        assert os.fstat(b).st_mtime_ns == 2_000_000_000
        os.ftruncate(a, 10)
        assert os.fstat(b).st_size == 10 and os.stat(path).st_size == 10
        assert os.pread(b, 100, 0) == b"x" * 10
    finally:
        os.close(a)
        os.close(b)
    # the writer's close does not put back the length it had written before the ftruncate (it did: 150)
    _eventually(lambda: _equal(os.stat(path).st_size, 10))
    # the kernel's release (its Close) has landed once meta has no write session on the file; meta's length is
    # checked, not only the mount's (which may still be cached)
    _eventually(lambda: _equal(fs_cluster.client.stat("/fuse/cache-handles").write_sessions, 0))
    assert fs_cluster.client.stat("/fuse/cache-handles").size == 10
    assert os.stat(path).st_size == 10 and path.read_bytes() == b"x" * 10


def test_a_name_made_by_another_process_in_a_folder_made_here_is_seen(mount: Path) -> None:
    """A folder this mount made is known empty for a moment (tar's lookups before each create): a name another
    process makes in it through the mount shows at once."""
    (mount / "cache-new").mkdir()
    assert not (mount / "cache-new" / "f").exists()
    subprocess.run([sys.executable, "-c", f"open({str(mount / 'cache-new' / 'f')!r}, 'wb').write(b'abc')"], check=True)
    assert (mount / "cache-new" / "f").read_bytes() == b"abc"
    assert sorted(os.listdir(mount / "cache-new")) == ["f"]


def test_changes_by_another_client_show_within_two_attribute_timeouts(mount: Path, fs_cluster: FsCluster) -> None:
    (mount / "cache-other").mkdir()
    assert not (mount / "cache-other" / "g").exists()  # known empty here (made here), and the kernel's negative entry
    (mount / "cache-other" / "h").write_bytes(b"12345")
    assert os.stat(mount / "cache-other" / "h").st_size == 5
    with fs_cluster.client.open("/fuse/cache-other/g", "wb") as f:
        f.write(b"from the client")
    with fs_cluster.client.open("/fuse/cache-other/h", "ab") as f:
        f.write(b"678")
    fs_cluster.client.chmod("/fuse/cache-other/h", 0o600)
    time.sleep(SEEN_ELSEWHERE_S)
    assert (mount / "cache-other" / "g").read_bytes() == b"from the client"
    st = os.stat(mount / "cache-other" / "h")
    assert st.st_size == 8 and stat.S_IMODE(st.st_mode) == 0o600


# New files created O_WRONLY|O_CREAT|O_EXCL (tar x) start in the mount's memory and reach the cluster through the
# client's write-back at close (hf3fs.fuse.pending): what a program sees through the mount does not change.
TAR_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL


def _written_like_tar(path: Path, data: bytes, mode: int, mtime_ns: int) -> None:
    fd = os.open(path, TAR_FLAGS, 0o600)
    try:
        os.write(fd, data)
        os.fchmod(fd, mode)
        os.utime(fd, ns=(time.time_ns(), mtime_ns))
    finally:
        os.close(fd)


def _eventually(check: Any, timeout_s: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return check()
        except (OSError, AssertionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def mount_stats(inside: Path) -> dict[str, Any]:
    """The counters of the mount ``inside`` lies in (its root's ``user.hf3fs.mount_stats``)."""
    root = inside
    while not os.path.ismount(root):
        root = root.parent
    return dict(json.loads(os.getxattr(root, MOUNT_STATS_XATTR)))


def wait_released(inside: Path, releases: int, timeout_s: float = 20.0) -> dict[str, Any]:
    """Wait until the mount has released ``releases`` handles in all and its write-back has settled every file queued.

    What follows a close(2), whose release the kernel sends on its own time: a file handed to the write-back
    there is committed (or failed) once ``settled`` reaches ``submitted``. Returns the counters.
    """

    def done() -> dict[str, Any]:
        s = mount_stats(inside)
        wb = s["writeback"]
        assert s["releases"] >= releases and wb["settled"] == wb["submitted"], s
        return s

    return dict(_eventually(done, timeout_s))


def test_mount_stats_count_releases_and_the_write_back(wb_mount: Path, fs_cluster: FsCluster) -> None:
    """The root's ``user.hf3fs.mount_stats``: releases counted once done, a written-back file settled; any other
    attribute or path: ENOTSUP, as before."""
    (wb_mount / "stats").mkdir()
    before = mount_stats(wb_mount)
    for i in range(3):
        _written_like_tar(wb_mount / "stats" / f"f{i}", b"counted %d" % i, 0o644, 1_600_000_000_000_000_000)
    after = wait_released(wb_mount, before["releases"] + 3)
    assert after["writeback"]["submitted"] == before["writeback"]["submitted"] + 3
    assert after["writeback"]["failed"] == before["writeback"]["failed"]
    assert after["pending_files"] == 0
    for i in range(3):  # settled: another client sees the bytes at once, no waiting
        with fs_cluster.client.open(f"/fuse/stats/f{i}", "rb") as f:
            assert f.read() == b"counted %d" % i
    for path, name in ((wb_mount.parent, "user.hf3fs.other"), (wb_mount, MOUNT_STATS_XATTR)):
        with pytest.raises(OSError) as caught:
            os.getxattr(path, name)
        assert caught.value.errno == errno.ENOTSUP


def test_files_written_like_tar_reach_the_cluster_whole(wb_mount: Path, fs_cluster: FsCluster) -> None:
    mount = wb_mount
    (mount / "wb").mkdir()
    files = {f"f{i}": os.urandom(100 + 997 * i) for i in range(20)}
    for name, data in files.items():
        _written_like_tar(mount / "wb" / name, data, 0o640, 1_600_000_000_000_000_000 + len(data))
    for name, data in files.items():  # through the mount at once
        st = os.stat(mount / "wb" / name)
        assert (st.st_size, stat.S_IMODE(st.st_mode), st.st_mtime_ns) == (
            len(data),
            0o640,
            1_600_000_000_000_000_000 + len(data),
        )
    assert (mount / "wb" / "f3").read_bytes() == files["f3"]
    assert sorted(os.listdir(mount / "wb")) == sorted(files)
    client = hf3fs.connect(mgmtd=fs_cluster.mgmtd, token=fs_cluster.token)  # another client: after the commit
    try:
        for name, data in files.items():
            st = _eventually(lambda n=name: client.stat(f"/fuse/wb/{n}"))
            assert (st.size, st.mode, st.mtime_ns) == (len(data), 0o640, 1_600_000_000_000_000_000 + len(data))
            with client.open(f"/fuse/wb/{name}", "rb") as f:
                assert f.read() == data
    finally:
        client.close()
    with pytest.raises(FileExistsError):
        os.open(mount / "wb" / "f1", TAR_FLAGS, 0o600)


def test_a_new_file_still_open_is_listed_synced_and_opened_again(wb_mount: Path, fs_cluster: FsCluster) -> None:
    mount = wb_mount
    (mount / "wb-open").mkdir()
    path = mount / "wb-open" / "new"
    fd = os.open(path, TAR_FLAGS, 0o644)
    try:
        os.write(fd, b"first")
        assert os.listdir(mount / "wb-open") == ["new"]  # listing the folder puts it in meta
        assert fs_cluster.client.stat("/fuse/wb-open/new").inode_id == os.fstat(fd).st_ino
        os.write(fd, b" second")
        os.fsync(fd)
        assert fs_cluster.client.open("/fuse/wb-open/new", "rb").read() == b"first second"
        other = os.open(mount / "wb-open" / "other", TAR_FLAGS, 0o644)
        os.write(other, b"x" * 10)
        assert (mount / "wb-open" / "other").read_bytes() == b"x" * 10  # another open: in meta first
        os.close(other)
    finally:
        os.close(fd)
    big = mount / "wb-open" / "big"  # past the write-back's small-file bound: written through
    data = os.urandom(3 << 20)
    _written_like_tar(big, data, 0o600, 1_700_000_000_000_000_000)
    assert big.read_bytes() == data
    # another client: once the kernel's release (after close returned) closed the write session
    _eventually(lambda: _equal(fs_cluster.client.stat("/fuse/wb-open/big").size, len(data)))


def _equal(a: object, b: object) -> None:
    assert a == b
