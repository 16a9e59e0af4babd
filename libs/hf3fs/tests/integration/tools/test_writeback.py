"""Write-back of small files (issue 16, defect 6) on a real cluster: a client sees its queued files as committed,
other clients once their batch committed (at a sync point, or by itself within the delay), errors of a deferred
commit are raised at the next sync point naming the files, and closing the file system (or exiting) commits
what is queued."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest

import hf3fs
from ff_testing.environ import clean_env
from hf3fs import WritebackError, WritebackOptions

from .conftest import FsCluster

HELD = WritebackOptions(max_delay_s=3600.0)  # nothing commits by itself: only sync points do


@pytest.fixture
def folder(fs_cluster: FsCluster) -> str:
    path = f"/ffs/wb-{uuid.uuid4().hex[:8]}"
    fs_cluster.client.makedirs(path)
    return path


@pytest.fixture
def held(fs_cluster: FsCluster) -> Iterator[hf3fs.FileSystem]:
    fs = hf3fs.connect(fs_cluster.mgmtd, fs_cluster.token, writeback=HELD)
    yield fs
    fs.close()


def _write(fs: hf3fs.FileSystem, path: str, data: bytes) -> None:
    with fs.open(path, "wb") as f:
        f.write(data)


def test_queued_files_are_committed_for_their_client_and_others_see_them_after_sync(
    fs_cluster: FsCluster, held: hf3fs.FileSystem, folder: str
) -> None:
    other = fs_cluster.client
    payloads = {f"{folder}/f{i}": os.urandom(4096 + 37 * i) for i in range(40)}
    for path, data in payloads.items():
        _write(held, path, data)
    assert held.writeback_pending() == 40 and other.listdir(folder) == []  # queued, not committed yet
    assert held.stat(f"{folder}/f3").size == len(payloads[f"{folder}/f3"])  # a call on a queued path commits first
    assert held.writeback_pending() == 0 and held.writeback_stats().batches == 1  # one batch for 40
    assert sorted(other.listdir(folder)) == sorted(p.rsplit("/", 1)[1] for p in payloads)
    for path, data in payloads.items():
        with other.open(path, "rb") as f:
            assert f.read() == data
    # each kind of call on a queued path sees it committed: rename, remove, append, read, listing the folder
    _write(held, f"{folder}/a", b"alpha")
    held.rename(f"{folder}/a", f"{folder}/b")
    _write(held, f"{folder}/c", b"gone")
    held.remove(f"{folder}/c")
    _write(held, f"{folder}/d", b"head-")
    with held.open(f"{folder}/d", "ab") as f:
        f.write(b"tail")
    with held.open(f"{folder}/e", "w") as t:
        t.write("text")
    assert held.open(f"{folder}/e", "r").read() == "text"
    _write(held, f"{folder}/g", b"listed")
    assert "g" in held.listdir(folder)
    held.sync()
    assert other.open(f"{folder}/b", "rb").read() == b"alpha" and not other.exists(f"{folder}/a")
    assert not other.exists(f"{folder}/c") and other.open(f"{folder}/d", "rb").read() == b"head-tail"


def test_a_file_queued_twice_commits_its_last_content(
    fs_cluster: FsCluster, held: hf3fs.FileSystem, folder: str
) -> None:
    assert held.writeback_stats() == hf3fs.WritebackStats()  # nothing queued yet: all zero
    _write(held, f"{folder}/x", b"first version, longer")
    _write(held, f"{folder}/x", b"second")
    assert held.writeback_stats() == hf3fs.WritebackStats(queued=1, submitted=1)  # the second replaced the first
    held.sync()
    assert held.writeback_stats() == hf3fs.WritebackStats(submitted=1, settled=1, batches=1)
    st = fs_cluster.client.stat(f"{folder}/x")
    assert st.size == 6 and fs_cluster.client.open(f"{folder}/x", "rb").read() == b"second"


def test_other_clients_see_a_file_within_the_delay_without_a_sync(fs_cluster: FsCluster, folder: str) -> None:
    with hf3fs.connect(fs_cluster.mgmtd, fs_cluster.token, writeback=WritebackOptions(max_delay_s=0.05)) as fs:
        _write(fs, f"{folder}/soon", b"committed by the flusher")
        deadline = time.monotonic() + 30  # the bound is 50 ms plus the commit; generous for a loaded machine
        while not fs_cluster.client.exists(f"{folder}/soon"):
            assert time.monotonic() < deadline, "the flusher never committed the file"
            time.sleep(0.05)
        assert fs.writeback_pending() == 0 or fs_cluster.client.exists(f"{folder}/soon")
    assert fs_cluster.client.open(f"{folder}/soon", "rb").read() == b"committed by the flusher"


def test_errors_of_deferred_commits_are_raised_at_the_next_sync_point(
    fs_cluster: FsCluster, held: hf3fs.FileSystem, folder: str
) -> None:
    admin = hf3fs.connect(fs_cluster.mgmtd, fs_cluster.admin_token)
    try:
        admin.mkdir(f"{folder}/locked", mode=0o755)  # the admin's: the user may not create in it
        admin.mkdir(f"{folder}/small", mode=0o777)
        admin.set_quota(f"{folder}/small", max_bytes=10_000)
    finally:
        admin.close()
    held.mkdir(f"{folder}/dir")
    _write(held, f"{folder}/ok1", b"fine")
    _write(held, f"{folder}/missing/f", b"no folder")
    _write(held, f"{folder}/locked/f", b"not allowed")
    _write(held, f"{folder}/dir", b"a folder's name")
    _write(held, f"{folder}/small/big", b"q" * 20_000)
    _write(held, f"{folder}/ok2", b"fine too")
    with pytest.raises(WritebackError) as caught:
        held.sync()
    counts = held.writeback_stats()
    assert (counts.queued, counts.in_flight, counts.submitted, counts.settled, counts.failed) == (0, 0, 6, 6, 4)
    got = {path: err.errno for path, err in caught.value.failures}
    assert got == {
        f"{folder}/missing/f": errno.ENOENT,
        f"{folder}/locked/f": errno.EACCES,
        f"{folder}/dir": errno.EISDIR,
        f"{folder}/small/big": errno.EDQUOT,
    }
    assert f"{folder}/locked/f" in str(caught.value)
    other = fs_cluster.client
    assert (
        other.open(f"{folder}/ok1", "rb").read() == b"fine" and other.open(f"{folder}/ok2", "rb").read() == b"fine too"
    )
    assert not other.exists(f"{folder}/small/big")  # over quota: not created at all
    held.sync()  # raised once: nothing left to report
    _write(held, f"{folder}/missing/again", b"x")
    with pytest.raises(WritebackError) as at_close:
        held.close()
    assert [p for p, _ in at_close.value.failures] == [f"{folder}/missing/again"]


def test_closing_or_exiting_commits_queued_files(fs_cluster: FsCluster, folder: str) -> None:
    fs = hf3fs.connect(fs_cluster.mgmtd, fs_cluster.token, writeback=HELD)
    for i in range(5):
        _write(fs, f"{folder}/c{i}", b"closed %d" % i)
    fs.close()
    script = (
        f"import hf3fs\nfs = hf3fs.connect({fs_cluster.mgmtd!r}, {fs_cluster.token!r}, "
        f"writeback=hf3fs.WritebackOptions(max_delay_s=3600))\n"
        f"for i in range(5):\n"
        f"    with fs.open(f'{folder}/e{{i}}', 'wb') as f: f.write(b'exit %d' % i)\n"
    )
    env = clean_env()
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    other = fs_cluster.client
    for i in range(5):
        assert other.open(f"{folder}/c{i}", "rb").read() == b"closed %d" % i
        assert other.open(f"{folder}/e{i}", "rb").read() == b"exit %d" % i


def test_a_process_ended_by_sigterm_commits_its_queued_files_first(fs_cluster: FsCluster, folder: str) -> None:
    """SIGTERM (kill, docker stop) runs no atexit: the client commits what is queued, then dies of the signal
    (before: the files a process had closed were lost, silently)."""
    script = (
        f"import os, signal, hf3fs\nfs = hf3fs.connect({fs_cluster.mgmtd!r}, {fs_cluster.token!r}, "
        f"writeback=hf3fs.WritebackOptions(max_delay_s=3600))\n"
        f"with fs.open('{folder}/termed', 'wb') as f: f.write(b'closed before SIGTERM')\n"
        f"os.kill(os.getpid(), signal.SIGTERM)\n"
    )
    env = clean_env()
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert fs_cluster.client.open(f"{folder}/termed", "rb").read() == b"closed before SIGTERM"


def test_fsync_and_large_files_write_through(fs_cluster: FsCluster, folder: str) -> None:
    options = WritebackOptions(max_delay_s=3600.0, max_file_bytes=1000)
    with hf3fs.connect(fs_cluster.mgmtd, fs_cluster.token, writeback=options) as fs:
        with fs.open(f"{folder}/synced", "wb") as f:
            f.write(b"durable")
            f.fsync()
            assert fs_cluster.client.open(f"{folder}/synced", "rb").read() == b"durable"
            f.write(b" and more")
        with fs.open(f"{folder}/large", "wb") as f:
            f.write(b"L" * 600)
            f.write(b"M" * 600)  # past max_file_bytes: written through from here on
        assert fs.writeback_pending() == 0
        assert fs_cluster.client.open(f"{folder}/large", "rb").read() == b"L" * 600 + b"M" * 600
        assert fs_cluster.client.open(f"{folder}/synced", "rb").read() == b"durable and more"


def test_write_back_of_a_whole_file_relative_to_a_folder_inode(
    fs_cluster: FsCluster, held: hf3fs.FileSystem, folder: str
) -> None:
    """The mount's way: ``write_back(..., parent=(folder inode, name))`` creates the file in that folder (even
    after the folder was renamed), and any call of the client on a path commits such files first."""
    folder_id = held.stat(folder).inode_id
    held.write_back(f"{folder}/p", b"by folder inode", parent=(folder_id, "p"), perm=0o600, mtime_ns=10**18)
    held.write_back(f"{folder}/q", b"queued", parent=(folder_id, "q"))
    assert held.writeback_pending() == 2 and fs_cluster.client.listdir(folder) == []
    fs_cluster.client.rename(folder, f"{folder}-moved")
    assert sorted(held.listdir(f"{folder}-moved")) == ["p", "q"]  # committed first, in the folder it names
    st = fs_cluster.client.stat(f"{folder}-moved/p")
    assert (st.size, st.mode, st.mtime_ns) == (15, 0o600, 10**18)
    assert fs_cluster.client.open(f"{folder}-moved/p", "rb").read() == b"by folder inode"


def test_a_name_made_over_or_under_a_file_already_in_meta_does_not_wait_for_its_commit(
    fs_cluster: FsCluster, held: hf3fs.FileSystem, folder: str
) -> None:
    """A file queued by its inode (in meta already, as the mount's are) answers mkdir and symlink at its name or
    below it as it is, and a stat of its folder, without its commit; a stat of the file, a chmod of its folder and a
    listing of it commit it first; a file not in meta yet is committed first, so its name is taken."""
    made = held.create(f"{folder}/made", exclusive=True)
    held.write_back(f"{folder}/made", b"queued by inode", inode_id=made.inode_id)
    held.mkdir(f"{folder}/beside")
    for make, code in (
        (lambda: held.mkdir(folder), errno.EEXIST),
        (lambda: held.mkdir(f"{folder}/made"), errno.EEXIST),
        (lambda: held.mkdir(f"{folder}/made/below"), errno.ENOTDIR),
        (lambda: held.symlink("elsewhere", f"{folder}/made"), errno.EEXIST),
    ):
        with pytest.raises(OSError) as caught:
            make()
        assert caught.value.errno == code
    assert held.writeback_stats().queued == 1  # none of them waited for the commit
    assert held.stat(folder).type == "directory"  # the folder's own attributes: nor did a stat of it
    assert held.writeback_stats().queued == 1
    assert held.stat(f"{folder}/made").size == 15  # the file itself: committed first
    assert held.writeback_stats().queued == 0
    held.write_back(f"{folder}/made", b"queued by inode", inode_id=made.inode_id)
    held.chmod(folder, 0o755)  # a chmod of its folder could take away the search permission its commit needs
    assert held.writeback_stats().queued == 0
    held.write_back(f"{folder}/made", b"queued again", inode_id=made.inode_id)
    assert [e.stat.size for e in held.scandir(folder) if e.name == "made"] == [12]  # a listing: committed first
    _write(held, f"{folder}/new", b"not in meta yet")
    with pytest.raises(FileExistsError):
        held.mkdir(f"{folder}/new")  # committed first: the name is the queued file's
    assert held.writeback_stats().queued == 0
    held.sync()
    assert fs_cluster.client.open(f"{folder}/made", "rb").read() == b"queued again"
    assert fs_cluster.client.open(f"{folder}/new", "rb").read() == b"not in meta yet"
