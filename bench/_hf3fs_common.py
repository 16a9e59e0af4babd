"""What the 3FS benchmarks share: a real cluster on this machine (mgmtd, three storage services with chains of 3,
one meta service, as processes; an admin user and its token) and a FUSE mount of it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hf3fs
from ff_testing.cluster import StorageCluster, start_test_cluster
from ff_testing.meta import MetaProcess
from fireflyer.common.v1 import common_pb2


async def start_cluster_with_meta(folder: Path) -> tuple[StorageCluster, MetaProcess, str]:
    """The test cluster with one meta service, mgmtd's own timing, and the admin ``bench``: its token."""
    c = await start_test_cluster(
        folder, users={"bench": common_pb2.ROLE_ADMIN}, storage={"targets_per_disk": 2, "timing": {}}, meta={}
    )
    return c.storage, c.meta[0], c.tokens["bench"]


@contextlib.contextmanager
def fuse_mount(where: Path, mgmtd: str, token: str, log: Path) -> Iterator[Path | None]:
    """``hf3fs mount --foreground --writeback`` (the mount's small-file write-back is opt-in; the benches measure
    the mount with it, as a user extracting many small files would run it)."""
    if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
        print("FUSE: skipped (no /dev/fuse or fusermount3)")
        yield None
        return
    where.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "FF_MGMTD_ADDRESSES": mgmtd, "FF_TOKEN": token}
    with log.open("wb") as out:
        argv = [sys.executable, "-m", "hf3fs", "mount", str(where), "--foreground", "--writeback"]
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 30
        while not os.path.ismount(where):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mount failed: {log.read_text()}")
            time.sleep(0.1)
        yield where
    finally:
        subprocess.run(["fusermount3", "-u", str(where)], capture_output=True, check=False)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass(frozen=True)
class BenchCluster:
    root: Path  # the run's folder: the cluster's state, and room for the disk baseline on the same disk
    fs: Any  # an hf3fs.FileSystem of the admin, with /bench made
    mount: Path | None  # the FUSE mount, None when skipped
    mgmtd: str = ""  # the cluster's mgmtd address and the admin's token (for more clients)
    token: str = ""
    pids: dict[str, int] = field(default_factory=dict)  # the cluster's processes: mgmtd, meta, storage1..

    def cpu_s(self) -> dict[str, float]:
        """CPU seconds (user + system) each cluster process has used so far, from /proc/<pid>/stat."""
        tick = os.sysconf("SC_CLK_TCK")
        out = {}
        for name, pid in self.pids.items():
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[name] = (int(fields[11]) + int(fields[12])) / tick
        return out


@contextlib.contextmanager
def bench_cluster(prefix: str, where: Path | None, *, with_mount: bool) -> Iterator[BenchCluster]:
    """A cluster under a new folder in ``where`` (a client connected, mounted if asked and possible); all of it
    stopped and removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir=where))
    try:
        storage, meta, token = asyncio.run(start_cluster_with_meta(root / "cluster"))
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    try:
        fs = hf3fs.connect(mgmtd=storage.mgmtd_address, token=token)
        try:
            fs.makedirs("/bench", exist_ok=True)
            mount_cm = fuse_mount(root / "mnt", storage.mgmtd_address, token, root / "mount.log") if with_mount \
                else contextlib.nullcontext(None)  # fmt: skip
            pids = {"mgmtd": storage.mgmtd_proc.pid, "meta": meta.proc.pid if meta.proc else 0}
            pids.update({f"storage{i + 1}": n.proc.pid for i, n in enumerate(storage.nodes) if n.proc})
            with mount_cm as mount:
                yield BenchCluster(root, fs, mount, storage.mgmtd_address, token, pids)
        finally:
            fs.close()
    finally:
        meta.stop()
        storage.stop()
        shutil.rmtree(root, ignore_errors=True)


PAGE = bytes(range(256)) * 16  # 4 KiB


def _untimed(kind: str, fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


def replay_sqlite_transactions(base: Path, num_tx: int, timed: Callable[..., Any] = _untimed) -> None:
    """The file-system calls SQLite 3 makes for ``num_tx`` transactions in journal mode delete, 100 rows of 64 bytes
    each (3 journal pages, 5 database pages, the file growing a page a transaction), as ``strace`` shows them, in the
    new folder ``base``: the change counter read at BEGIN, the journal created, its pages written, fdatasync, the
    folder's fdatasync, the journal header, fdatasync, the database's pages, fdatasync, close, unlink. ``timed(kind,
    fn, *args)`` makes each call that waits (the others go straight): the default just calls it."""
    base.mkdir()
    db = os.open(base / "db", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.pwrite(db, PAGE * 4, 0)
        for tx in range(num_tx):
            timed("read counter", os.pread, db, 16, 24)  # BEGIN: the change counter
            journal = timed("create journal", os.open, base / "db-journal", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                timed("journal pwrites", _journal_pages, journal)
                timed("fdatasync journal", os.fdatasync, journal)
                folder = os.open(base, os.O_RDONLY)
                try:
                    timed("fdatasync folder", os.fdatasync, folder)
                finally:
                    os.close(folder)
                os.pwrite(journal, PAGE[:12], 0)  # the header: the journal is now hot
                timed("fdatasync header", os.fdatasync, journal)
                for at in (0, 4096, 4096 * (4 + tx), 4096 * (5 + tx), 4096 * (6 + tx)):
                    os.pwrite(db, PAGE, at)
                timed("fdatasync database", os.fdatasync, db)
            finally:
                timed("close journal", os.close, journal)
            timed("unlink journal", os.unlink, base / "db-journal")
    finally:
        os.close(db)


def _journal_pages(journal: int) -> None:
    os.pwrite(journal, PAGE[:512], 0)
    for k in range(3):  # page number, the original page, its checksum
        at = 512 + k * 4104
        os.pwrite(journal, PAGE[:4], at)
        os.pwrite(journal, PAGE, at + 4)
        os.pwrite(journal, PAGE[:4], at + 4100)
