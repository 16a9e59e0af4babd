"""``hf3fs mount``/``umount`` when something is wrong (issue 16, defect 4): a bad token, an unreachable cluster, a
missing mount point, a ``--multi-user`` mount without an admin token: a clear message, exit 1 and nothing mounted;
a dead mount (daemon killed) in the way is named, and ``hf3fs umount`` removes it, and a hung one (daemon stopped).
Needs /dev/fuse and fusermount3; the hung-mount case needs root (it aborts the FUSE connection)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ff_testing.environ import clean_env
from ff_testing.waiting import wait_until

from .conftest import FsCluster, run_cli, start_cli
from .test_fuse_mount import MOUNT_TIMEOUT_S, _skip_reason

pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")


@dataclass
class Run:
    code: int
    out: str
    err: str


def hf3fs(*args: str, mgmtd: str, token: str, timeout_s: float = 120) -> Run:
    """``hf3fs args...`` as a process forked from the CLI fork server (``conftest.run_cli``)."""
    env = clean_env()
    env.update({"FF_MGMTD_ADDRESSES": mgmtd, "FF_TOKEN": token})
    proc = run_cli(list(args), env=env, timeout_s=timeout_s)
    return Run(proc.returncode, proc.stdout, proc.stderr)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when the socket goes


@pytest.fixture
def where(tmp_path: Path) -> Iterator[Path]:
    point = tmp_path / "mnt"
    point.mkdir()
    yield point
    if point.is_mount() or _dead(point):
        subprocess.run(["fusermount3", "-uz", str(point)], capture_output=True, check=False)


def _dead(point: Path) -> bool:
    try:
        os.stat(point)
    except OSError as err:
        return err.errno == 107  # ENOTCONN
    return False


@pytest.mark.parametrize("foreground", [False, True], ids=["daemon", "foreground"])
def test_a_refused_token_mounts_nothing(fs_cluster: FsCluster, where: Path, foreground: bool) -> None:
    run = hf3fs(
        "mount", str(where), *(["--foreground"] if foreground else []), mgmtd=fs_cluster.mgmtd, token="not-a-token"
    )
    assert run.code == 1 and "token refused" in run.err, run
    assert not where.is_mount() and not _dead(where) and list(where.iterdir()) == []


def test_an_unreachable_cluster_mounts_nothing(fs_cluster: FsCluster, where: Path) -> None:
    run = hf3fs("mount", str(where), mgmtd=f"127.0.0.1:{_closed_port()}", token=fs_cluster.token)
    assert run.code == 1 and "cannot reach mgmtd" in run.err, run
    assert not where.is_mount() and not _dead(where)


def test_a_missing_mount_point_is_named(fs_cluster: FsCluster, tmp_path: Path) -> None:
    for args in ((), ("--foreground",)):
        run = hf3fs("mount", str(tmp_path / "nope"), *args, mgmtd=fs_cluster.mgmtd, token=fs_cluster.token)
        assert run.code == 1 and "mount point does not exist" in run.err and "RuntimeError" not in run.err, run
    (tmp_path / "file").write_text("x")
    run = hf3fs("mount", str(tmp_path / "file"), mgmtd=fs_cluster.mgmtd, token=fs_cluster.token)
    assert run.code == 1 and "not a folder" in run.err, run


def test_multi_user_needs_a_token_that_may_act_for_others(fs_cluster: FsCluster, where: Path) -> None:
    run = hf3fs("mount", str(where), "--multi-user", mgmtd=fs_cluster.mgmtd, token=fs_cluster.token)
    assert run.code == 1 and "may act for other users" in run.err, run
    assert not where.is_mount() and not _dead(where)


def _mount_daemon(fs_cluster: FsCluster, where: Path, *flags: str) -> int:
    run = hf3fs(
        "mount",
        str(where),
        "--log-file",
        str(where.parent / "mount.log"),
        *flags,
        mgmtd=fs_cluster.mgmtd,
        token=fs_cluster.token,
        timeout_s=MOUNT_TIMEOUT_S + 30,
    )
    assert run.code == 0 and where.is_mount(), run
    return int(run.out.split("daemon pid ")[1].split(",")[0])


def test_a_dead_mount_is_named_and_umount_removes_it(fs_cluster: FsCluster, where: Path) -> None:
    os.kill(_mount_daemon(fs_cluster, where), signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not _dead(where):  # the kernel sees the connection close a moment after the kill
        assert time.monotonic() < deadline
        time.sleep(0.05)
    again = hf3fs("mount", str(where), mgmtd=fs_cluster.mgmtd, token=fs_cluster.token)
    assert again.code == 1 and "dead mount is in the way" in again.err and "RuntimeError" not in again.err, again
    gone = hf3fs("umount", str(where), mgmtd=fs_cluster.mgmtd, token=fs_cluster.token)
    assert gone.code == 0, gone
    assert not _dead(where) and not where.is_mount()
    _mount_daemon(fs_cluster, where)  # the folder serves again
    assert hf3fs("umount", str(where), mgmtd=fs_cluster.mgmtd, token=fs_cluster.token).code == 0
    assert not where.is_mount()


def _waits_on_fuse(pid: int) -> bool:
    """Whether process ``pid`` sleeps in the kernel waiting for a FUSE daemon's answer (its wait channel)."""
    try:
        wchan = Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return False
    return wchan == "request_wait_answer" or "fuse" in wchan


@pytest.mark.skipif(os.getuid() != 0, reason="aborting a FUSE connection needs root")
def test_umount_removes_a_hung_mount(fs_cluster: FsCluster, where: Path) -> None:
    pid = _mount_daemon(fs_cluster, where)
    inside = subprocess.Popen(["sleep", "600"], cwd=where)  # keeps the mount busy: a plain unmount fails
    os.kill(pid, signal.SIGSTOP)  # the daemon answers nothing: calls on the mount block
    try:
        lister = subprocess.Popen(["ls", str(where)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: _waits_on_fuse(lister.pid), timeout_s=10, what="ls blocked on the stopped mount")
        gone = hf3fs("umount", str(where), mgmtd=fs_cluster.mgmtd, token=fs_cluster.token)
        assert gone.code == 0, gone
        assert not where.is_mount() and not _dead(where)
        assert lister.wait(timeout=30) != 0  # the blocked call failed when the connection was aborted
    finally:
        inside.kill()
        inside.wait()
        os.kill(pid, signal.SIGKILL)
        os.kill(pid, signal.SIGCONT)


def test_umount_leaves_a_mount_in_use_mounted_and_its_open_files_working(fs_cluster: FsCluster, where: Path) -> None:
    """``hf3fs umount`` of a live mount where a program has a file open: fusermount refuses (busy), and umount then
    aborted the FUSE connection as it does for a dead or hung daemon: the program's next write failed (ENOTCONN)
    and what it had written was lost (the file stayed empty). Now it says the mount is in use, as umount(8) does."""
    _mount_daemon(fs_cluster, where)
    name = f"busy-{time.monotonic_ns()}"
    fd = os.open(where / "fuse" / name, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.write(fd, b"written before the umount")
        refused = hf3fs("umount", str(where), mgmtd=fs_cluster.mgmtd, token=fs_cluster.token)
        assert refused.code == 1 and "in use" in refused.err, refused
        assert where.is_mount()
        os.write(fd, b", and after")
        os.fsync(fd)
    finally:
        os.close(fd)
    assert hf3fs("umount", str(where), mgmtd=fs_cluster.mgmtd, token=fs_cluster.token).code == 0
    assert not where.is_mount()
    with fs_cluster.client.open(f"/fuse/{name}", "rb") as f:
        assert f.read() == b"written before the umount, and after"


def test_umount_of_a_folder_that_is_no_mount_fails_clearly(fs_cluster: FsCluster, where: Path) -> None:
    run = hf3fs("umount", str(where), mgmtd=fs_cluster.mgmtd, token=fs_cluster.token)
    assert run.code == 1 and "no FUSE mount there" in run.err, run


def _tar_style_files(folder: Path, count: int) -> dict[str, bytes]:
    """``count`` files made as ``tar x`` makes them (write-only, exclusive, then fchmod): pending on a --writeback
    mount until their close hands them to its write-back. What each holds, by name."""
    folder.mkdir()
    made = {}
    for i in range(count):
        body = b"%d " % i * (50 + i)
        fd = os.open(folder / f"f{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, body)
            os.fchmod(fd, 0o644)
        finally:
            os.close(fd)
        made[f"f{i}"] = body
    return made


def _read_all(fs_cluster: FsCluster, folder: str, names: Iterator[str]) -> dict[str, bytes]:
    out = {}
    for name in names:
        with fs_cluster.client.open(f"{folder}/{name}", "rb") as f:
            out[name] = bytes(f.read())
    return out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_the_mount_cleanly_after_committing_what_it_was_handed(
    fs_cluster: FsCluster, where: Path, sig: signal.Signals
) -> None:
    """``kill`` (a service manager's stop) or Ctrl-C of ``hf3fs mount --foreground``: the mount goes, the files closed
    before, and what a file still open had written, are in the cluster whole, and the exit is 0. It said
    "Input/output error (libfuse could not mount or serve (status 8))" and exited 1, for a stop (libfuse reports a
    loop ended by a signal as status 8); and the still-open file, and now and then the last one closed (its release
    still queued when the loop ended), stayed empty."""
    env = clean_env()
    env.update({"FF_MGMTD_ADDRESSES": fs_cluster.mgmtd, "FF_TOKEN": fs_cluster.token})
    log = where.parent / "mount.log"
    with log.open("wb") as out:
        proc = start_cli(["mount", str(where), "--foreground", "--writeback"], env=env, log=out)
    wait_until(lambda: where.is_mount() or proc.poll() is not None, timeout_s=MOUNT_TIMEOUT_S)
    assert where.is_mount(), log.read_text()
    name = f"stop-{sig.name}-{time.monotonic_ns()}"
    made = _tar_style_files(where / "fuse" / name, 30)
    # and one still open, its bytes still in the mount's memory (the kernel's releases of the others may be queued)
    fd = os.open(where / "fuse" / name / "open", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, b"written, not closed, when the mount stopped")
    made["open"] = b"written, not closed, when the mount stopped"
    proc.send_signal(sig)
    assert proc.wait(timeout=60) == 0, log.read_text()
    with contextlib.suppress(OSError):  # ENOTCONN: the mount is gone
        os.close(fd)
    assert not where.is_mount() and not _dead(where)
    assert "stopped by a signal" in log.read_text() and "Input/output error" not in log.read_text()
    assert _read_all(fs_cluster, f"/fuse/{name}", iter(made)) == made


def test_a_killed_writeback_mount_leaves_each_file_it_was_handed_whole_or_empty(
    fs_cluster: FsCluster, where: Path
) -> None:
    """SIGKILL (or a crash) of a --writeback mount right after files were closed: what its write-back had not committed
    yet is lost, as the README says: each such file stays as its create left it, empty; none is left with part of its
    bytes or another file's. The others are whole."""
    pid = _mount_daemon(fs_cluster, where, "--writeback")
    name = f"killed-{time.monotonic_ns()}"
    made = _tar_style_files(where / "fuse" / name, 30)
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: _dead(where), timeout_s=10)
    assert hf3fs("umount", str(where), mgmtd=fs_cluster.mgmtd, token=fs_cluster.token).code == 0
    assert sorted(fs_cluster.client.listdir(f"/fuse/{name}")) == sorted(made)
    for file, held in _read_all(fs_cluster, f"/fuse/{name}", iter(made)).items():
        assert held in (made[file], b""), file
