"""The mount as a POSIX file system shared by the users of a machine (issue 16): ``hf3fs mount --multi-user``
with an admin token; processes of other uids use it, and meta checks each as its own uid and groups; ownership
shown is the file's; FIFOs; a folder's link count and times; a file removed while open stays usable until
closed. The whole pjdfstest suite runs in ``tox -e posix`` (scripts/pjdfstest.py). Needs root (it runs processes
as other users), /dev/fuse and fusermount3."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ff_testing.environ import clean_env

from .conftest import FsCluster, start_cli
from .test_fuse_mount import MOUNT_TIMEOUT_S, _skip_reason, mount_stats, wait_released

SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")  # readable by every user, unlike a venv under /root
ALICE, BOB, SHARED_GROUP = 4001, 4002, 5000

pytestmark = [
    pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or ""),
    pytest.mark.skipif(os.getuid() != 0, reason="runs processes as other users: needs root"),
    pytest.mark.skipif(SYSTEM_PYTHON is None, reason="no system python3 for the other users' processes"),
]


@pytest.fixture(scope="module")
def shared(fs_cluster: FsCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A --multi-user mount (admin token) in a folder every user may enter; yields /posix inside it."""
    top = Path(tempfile.mkdtemp(prefix="ff-multi-"))  # under /tmp: pytest's folders are root's alone
    os.chmod(top, 0o755)
    where = top / "mnt"
    where.mkdir(mode=0o755)
    env = clean_env()
    env.update({"FF_MGMTD_ADDRESSES": fs_cluster.mgmtd, "FF_TOKEN": fs_cluster.admin_token})
    log = tmp_path_factory.mktemp("multi-log") / "mount.log"
    with log.open("wb") as out:
        proc = start_cli(["mount", str(where), "--foreground", "--multi-user"], env=env, log=out)
    try:
        deadline = time.monotonic() + MOUNT_TIMEOUT_S
        while not os.path.ismount(where):
            assert proc.poll() is None, f"mount exited {proc.returncode}: {log.read_text()}"
            assert time.monotonic() < deadline, f"not mounted in time: {log.read_text()}"
            time.sleep(0.1)
        (where / "posix").mkdir(mode=0o755)
        os.chmod(where / "posix", 0o777)
        yield where / "posix"
    finally:
        subprocess.run(["fusermount3", "-u", str(where)], capture_output=True, check=False)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            subprocess.run(["fusermount3", "-uz", str(where)], capture_output=True, check=False)
        if not os.path.ismount(where):
            shutil.rmtree(top, ignore_errors=True)


def as_user(uid: int, code: str, *args: str, groups: tuple[int, ...] = ()) -> str:
    """Run ``code`` (Python, ``sys.argv[1:]`` = args) as ``uid`` (its own group, and ``groups``); its stdout, or
    ``errno <name>`` when it raised OSError."""
    wrapped = (
        "import errno, os, stat, sys\ntry:\n"
        + "".join(f"    {line}\n" for line in code.splitlines())
        + ("except OSError as err:\n    print('errno', errno.errorcode[err.errno])\n")
    )
    assert SYSTEM_PYTHON is not None
    proc = subprocess.run(
        [SYSTEM_PYTHON, "-c", wrapped, *args],
        user=uid,
        group=uid,
        extra_groups=list(groups),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd="/",
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_each_user_acts_as_themselves(shared: Path, fs_cluster: FsCluster) -> None:
    mine = shared / "alices.txt"
    assert as_user(ALICE, "open(sys.argv[1], 'w').write('from alice'); print('ok')", str(mine)) == "ok"
    st = os.stat(mine)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode) & 0o600) == (ALICE, ALICE, 0o600)  # the file's owner
    in_3fs = fs_cluster.client.stat("/posix/alices.txt")  # meta agrees
    assert (in_3fs.uid, in_3fs.gid) == (ALICE, ALICE)
    # bob may read alice's 0644 file, not write it: meta refuses him, not the kernel
    assert as_user(BOB, "print(open(sys.argv[1]).read())", str(mine)) == "from alice"
    assert as_user(BOB, "open(sys.argv[1], 'a').write('x')", str(mine)) == "errno EACCES"
    assert as_user(BOB, "os.chmod(sys.argv[1], 0o777)", str(mine)) == "errno EPERM"
    assert mine.read_text() == "from alice"
    # a folder of root's that only root may write
    (shared / "roots").mkdir(mode=0o755)
    assert as_user(BOB, "os.mkdir(sys.argv[1])", str(shared / "roots" / "b")) == "errno EACCES"
    assert not (shared / "roots" / "b").exists()


def test_supplementary_groups_reach_meta(shared: Path) -> None:
    team = shared / "team.txt"
    team.write_text("for the group")
    os.chown(team, 0, SHARED_GROUP)
    os.chmod(team, 0o040)  # only the group may read
    code = "print(open(sys.argv[1]).read())"
    assert as_user(BOB, code, str(team), groups=(SHARED_GROUP,)) == "for the group"
    assert as_user(BOB, code, str(team)) == "errno EACCES"


def test_fifos_links_and_folder_times(shared: Path) -> None:
    box = shared / "box"
    box.mkdir()
    assert os.stat(box).st_nlink == 2
    before = os.stat(box).st_mtime_ns
    time.sleep(0.01)
    os.mkfifo(box / "pipe", 0o640)
    (box / "sub").mkdir()
    st = os.stat(box)
    assert stat.S_ISFIFO(os.lstat(box / "pipe").st_mode) and st.st_nlink == 3 and st.st_mtime_ns > before
    os.rmdir(box / "sub")
    assert os.stat(box).st_nlink == 2


def test_a_file_removed_while_open_stays_usable_until_closed(shared: Path) -> None:
    path = shared / "tmpfile"
    rw = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    ro = os.open(path, os.O_RDONLY)
    try:
        os.write(rw, b"Hello, World!")
        os.unlink(path)
        assert not path.exists()
        assert os.pread(rw, 13, 0) == os.pread(ro, 13, 0) == b"Hello, World!"
        os.pwrite(rw, b"!", 13)
        os.ftruncate(rw, 5)
        assert os.pread(ro, 20, 0) == b"Hello"
    finally:
        os.close(rw)
        os.close(ro)
    reader_only = shared / "readme"
    reader_only.write_bytes(b"x" * 100)
    ro = os.open(reader_only, os.O_RDONLY)  # no writer holds it: the mount does while it is open
    try:
        os.unlink(reader_only)
        assert os.pread(ro, 5, 95) == b"xxxxx"
    finally:
        os.close(ro)
    kept = shared / "kept"  # removed while a writer and a reader have it; the writer closes first
    rw = os.open(kept, os.O_CREAT | os.O_RDWR, 0o644)
    ro = os.open(kept, os.O_RDONLY)
    try:
        os.write(rw, b"abc" * 10)
        os.unlink(kept)
        released = mount_stats(shared)["releases"]
        os.close(rw)  # its session becomes what keeps the file
        wait_released(shared, released + 1)  # the kernel sends the release on its own time
        assert os.pread(ro, 100, 0) == b"abc" * 10
    finally:
        os.close(ro)
