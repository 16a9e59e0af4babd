"""3FS small files: many small files, ``tar x``, SQLite and random 4 KiB I/O, through the hf3fs client and the FUSE
mount, against the local disk, in interleaved rounds; medians, ratios to the disk, and issue 16's goals.

One run starts a real cluster (mgmtd, three storage services with chains of 3, one meta service, as processes on
this machine, state under ``--dir``) and mounts it with ``hf3fs mount --foreground`` (skipped without /dev/fuse
and fusermount3). Each round, in an order that rotates between the kinds (client, mount, disk):

- files: ``--files`` files of 4-16 KiB (seeded sizes and bytes) written into 20 folders, one open/write/close
  each (client: ``fs.open``; client-wb: ``fs.open`` with write-back, the time including the final
  ``fs.sync()`` that commits the last batch; mount and disk: ``open``), then read back and compared; files/s;
  for the client kinds also the CPU per file of each cluster process and of the client (``/proc/<pid>/stat``,
  ``time.process_time``): the comparable figure on a loaded machine;
- tar: a tree of ``--tar-files`` files (the size mix of a source tree) extracted with ``tar x`` (mount, disk);
  seconds;
- sqlite: one process, ``--sqlite-tx`` transactions of 100 rows each, journal mode delete (mount, disk); seconds;
  and "sqlite calls": the same number of transactions' file-system calls alone, no SQLite (what ``strace``
  shows SQLite 3 making for one such transaction: the journal created, its pages written, fdatasync, the
  folder's fdatasync, the journal header, fdatasync, the database's pages, fdatasync, close, unlink); the
  durable steps any SQLite transaction waits for, the bound of the SQLite figure on the same file system;
- ls -l: the folders of the round's files listed with each entry's attributes (``os.scandir`` and ``lstat`` of
  every entry, as ``ls -l`` and ``find`` do), after the steps above so no cache holds them (mount, disk); entries/s;
- appends: a log file written as a training job writes one: ``--append-lines`` lines of 64 bytes, each its own
  ``write`` on an ``O_APPEND`` descriptor, an fsync every 50, then close (mount, disk); seconds;
- random: 4 threads doing 4 KiB ``pread``/``pwrite`` (half each) at random aligned offsets of one file of one
  chunk (4 MiB) and of one of two chunks (8 MiB: its middle 4 MiB, across the chunk boundary, so both have the
  same working set in the kernel's page cache), through the mount, ``--random-abba`` ABBA blocks of the two per
  round (1,2,2,1: a drift in the machine's load favours neither); IOPS, and the two-chunk/one-chunk ratio of each
  pair run side by side: its median (the goal) and quartiles (3FS should be no slower on files of several chunks).

Goals (issue 16): client writes >= 500 files/s; ``tar x`` of 241 files <= 1.5 s; SQLite 100 transactions on the
mount <= 1.5 s; random 4 KiB I/O on two-chunk files >= one-chunk files. Absolute figures swing with the
machine's load; the ratios to the disk measured in the same round swing less.

    .venv/bin/python bench/hf3fs_small_files.py                    # 3 rounds
    .venv/bin/python bench/hf3fs_small_files.py --rounds 5 --files 500 --dir /work/tmp
"""

from __future__ import annotations

import argparse
import io
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _hf3fs_common import bench_cluster, replay_sqlite_transactions

import hf3fs

KIB = 1 << 10
MIB = 1 << 20
NUM_FOLDERS = 20
RANDOM_SPAN = 4 * MIB  # the random I/O's working set


def small_payloads(num_files: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(rng.randint(4 * KIB, 16 * KIB)) for _ in range(num_files)]


def make_tarball(path: Path, num_files: int, seed: int) -> None:
    """A tree like a source checkout: nested folders, mostly small files, a few larger ones."""
    rng = random.Random(seed)
    with tarfile.open(path, "w") as tar:
        folders = [f"src/pkg{i}/sub{j}" for i in range(6) for j in range(4)]
        for n in range(num_files):
            size = rng.choice([300, 900, 2 * KIB, 5 * KIB, 12 * KIB, 40 * KIB]) + rng.randint(0, 999)
            info = tarfile.TarInfo(f"{rng.choice(folders)}/file{n}.py")
            info.size, info.mtime, info.mode = size, 1_700_000_000 + n, 0o644
            tar.addfile(info, io.BytesIO(rng.randbytes(size)))


class Round:
    """One kind's operations; each returns its figure (files/s, seconds or IOPS)."""

    def __init__(self, kind: str, fs: Any, root: Path | None, payloads: list[bytes], tarball: Path,
                 cpu: Callable[[], dict[str, float]] | None = None) -> None:  # fmt: skip
        self.kind, self.fs, self.root, self.payloads, self.tarball = kind, fs, root, payloads, tarball
        self.n = 0
        self.cpu = cpu  # the cluster processes' CPU seconds so far (client kinds)
        self.cpu_ms: dict[str, float] = {}  # CPU per file written, ms, of the last files()
        self.last_files = ""  # the folder the last files() wrote into

    def _fresh(self, what: str) -> str:
        """A new name for this kind: kinds that write into 3FS (client, client-wb, mount) never reuse another's
        paths (they did: the second kind of a round overwrote the first's files, and measured overwrites)."""
        self.n += 1
        return f"{what}{self.n}-{self.kind}"

    def files(self) -> tuple[float, float]:
        base = self._fresh("files")
        self.last_files = base
        names = [f"{base}/d{i % NUM_FOLDERS}/f{i}" for i in range(len(self.payloads))]
        if self.kind.startswith("client"):
            for d in range(NUM_FOLDERS):
                self.fs.makedirs(f"/bench/{base}/d{d}", exist_ok=True)
            cpu0 = self.cpu() if self.cpu else {}
            p0 = time.process_time()
            t0 = time.perf_counter()
            for name, data in zip(names, self.payloads, strict=True):
                with self.fs.open(f"/bench/{name}", "wb") as f:
                    f.write(data)
            self.fs.sync()  # write-back: the last batch committed (nothing to do without it)
            t1 = time.perf_counter()
            cpu1 = self.cpu() if self.cpu else {}
            self.cpu_ms = {k: (cpu1[k] - cpu0[k]) * 1000 / len(names) for k in cpu0}
            self.cpu_ms["client"] = (time.process_time() - p0) * 1000 / len(names)
            self.cpu_ms["total"] = sum(self.cpu_ms.values())
            for name, data in zip(names, self.payloads, strict=True):
                with self.fs.open(f"/bench/{name}", "rb") as f:
                    if f.read() != data:
                        raise RuntimeError(f"client read of {name} differs")
        else:
            assert self.root is not None
            for d in range(NUM_FOLDERS):
                (self.root / base / f"d{d}").mkdir(parents=True, exist_ok=True)
            t0 = time.perf_counter()
            for name, data in zip(names, self.payloads, strict=True):
                with open(self.root / name, "wb") as f:
                    f.write(data)
            t1 = time.perf_counter()
            for name, data in zip(names, self.payloads, strict=True):
                with open(self.root / name, "rb") as f:
                    if f.read() != data:
                        raise RuntimeError(f"{self.kind} read of {name} differs")
        t2 = time.perf_counter()
        return len(names) / (t1 - t0), len(names) / (t2 - t1)

    def tar(self) -> float:
        assert self.root is not None
        dest = self.root / self._fresh("tar")
        dest.mkdir()
        t0 = time.perf_counter()
        subprocess.run(["tar", "xf", str(self.tarball), "-C", str(dest)], check=True, capture_output=True)
        return time.perf_counter() - t0

    def sqlite(self, num_tx: int) -> float:
        assert self.root is not None
        path = self.root / f"{self._fresh('db')}.sqlite"
        t0 = time.perf_counter()
        db = sqlite3.connect(path, isolation_level=None)
        try:
            db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, tx INTEGER, payload TEXT)")
            for tx in range(num_tx):
                db.execute("BEGIN IMMEDIATE")
                db.executemany("INSERT INTO t (tx, payload) VALUES (?, ?)", [(tx, "x" * 64) for _ in range(100)])
                db.execute("COMMIT")
            (count,) = db.execute("SELECT count(*) FROM t").fetchone()
        finally:
            db.close()
        if count != num_tx * 100:
            raise RuntimeError(f"sqlite on {self.kind}: {count} rows, expected {num_tx * 100}")
        return time.perf_counter() - t0

    def sqlite_calls(self, num_tx: int) -> float:
        """The file-system calls of ``sqlite`` without SQLite (``replay_sqlite_transactions``)."""
        assert self.root is not None
        t0 = time.perf_counter()
        replay_sqlite_transactions(self.root / self._fresh("dbcalls"), num_tx)
        return time.perf_counter() - t0

    def ls_l(self) -> float:
        """Entries per second of listing the last files() folders with every entry's lstat (``ls -l``)."""
        assert self.root is not None
        t0 = time.perf_counter()
        seen = 0
        for d in range(NUM_FOLDERS):
            for e in os.scandir(self.root / self.last_files / f"d{d}"):
                e.stat(follow_symlinks=False)
                seen += 1
        elapsed = time.perf_counter() - t0
        if seen != len(self.payloads):
            raise RuntimeError(f"ls -l on {self.kind}: {seen} entries, expected {len(self.payloads)}")
        return seen / elapsed

    def appends(self, lines: int) -> float:
        """``lines`` log lines of 64 bytes appended one ``write`` each (O_APPEND), an fsync every 50, then close;
        the file is checked afterwards (every line whole, in order)."""
        assert self.root is not None
        path = self.root / f"{self._fresh('log')}.log"
        body = [f"step {n:08d} loss 1.2345 lr 3e-4 ".encode().ljust(63, b".") + b"\n" for n in range(lines)]
        t0 = time.perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            for n, line in enumerate(body):
                os.write(fd, line)
                if n % 50 == 49:
                    os.fsync(fd)
        finally:
            os.close(fd)
        elapsed = time.perf_counter() - t0
        if path.read_bytes() != b"".join(body):
            raise RuntimeError(f"appends on {self.kind}: the log does not read back as written")
        return elapsed

    def random_io(self, file_bytes: int, ops_per_thread: int) -> float:
        """4 KiB operations over the middle RANDOM_SPAN bytes of a new file of ``file_bytes``: the same working set
        in both files (the kernel's page cache answers a read of a page read or written before, so a larger
        span alone would be slower), across the chunk boundary in a file of two chunks."""
        base = (file_bytes - RANDOM_SPAN) // 2
        assert self.root is not None
        path = self.root / f"{self._fresh('rand')}.bin"
        with open(path, "wb") as f:
            f.write(os.urandom(file_bytes))
            f.flush()
            os.fsync(f.fileno())
        block = os.urandom(4 * KIB)
        errors: list[BaseException] = []

        def worker(seed: int) -> None:
            rng = random.Random(seed)
            fd = os.open(path, os.O_RDWR)
            try:
                for _ in range(ops_per_thread):
                    offset = base + rng.randrange(RANDOM_SPAN // (4 * KIB)) * 4 * KIB
                    if rng.random() < 0.5:
                        if len(os.pread(fd, 4 * KIB, offset)) != 4 * KIB:
                            raise RuntimeError(f"short read at {offset}")
                    else:
                        os.pwrite(fd, block, offset)
            except BaseException as e:  # reported after join
                errors.append(e)
            finally:
                os.close(fd)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
        if errors:
            raise errors[0]
        return 4 * ops_per_thread / elapsed


def _median_ratio(vals: list[float], base: list[float]) -> float:
    return statistics.median(v / b for v, b in zip(vals, base, strict=True))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", type=int, default=2000)
    p.add_argument("--tar-files", type=int, default=241)
    p.add_argument("--sqlite-tx", type=int, default=100)
    p.add_argument("--append-lines", type=int, default=300)
    p.add_argument("--random-ops", type=int, default=250, help="4 KiB operations per thread (4 threads)")
    p.add_argument(
        "--random-abba", type=int, choices=(1, 2), default=2, help="ABBA blocks (1,2,2,1-chunk runs) per round"
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dir", type=Path, default=None, help="where the cluster and the disk files live (one disk)")
    p.add_argument("--no-fuse", action="store_true")
    p.add_argument("--no-mount", action="store_true", help="mount but skip the mount's figures (client only)")
    a = p.parse_args()
    payloads = small_payloads(a.files, seed=1)
    with bench_cluster("hf3fs-small-", a.dir, with_mount=not a.no_fuse) as c:
        tarball = c.root / "tree.tar"
        make_tarball(tarball, a.tar_files, seed=2)
        disk = c.root / "disk"
        disk.mkdir()
        with hf3fs.connect(c.mgmtd, c.token, writeback=True) as wb_fs:
            rounds = {
                "client": Round("client", c.fs, None, payloads, tarball, c.cpu_s),
                "client-wb": Round("client-wb", wb_fs, None, payloads, tarball, c.cpu_s),
                "disk": Round("disk", c.fs, disk, payloads, tarball),
            }
            if c.mount is not None and not a.no_mount:
                rounds["mount"] = Round("mount", c.fs, c.mount / "bench", payloads, tarball)
            results = run_rounds(rounds, a)
    report(results, a, mount_present="mount" in rounds)
    return 0


def run_rounds(rounds: dict[str, Round], a: argparse.Namespace) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {}
    kinds = list(rounds)
    print(f"{a.files} files of 4-16 KiB, tar of {a.tar_files} files, {a.sqlite_tx} SQLite transactions, "
          f"{a.rounds} rounds; kinds: {', '.join(kinds)}", flush=True)  # fmt: skip
    for i in range(a.rounds):
        order = kinds[i % len(kinds) :] + kinds[: i % len(kinds)]
        line: list[str] = []
        for kind in order:
            r = rounds[kind]
            steps: list[tuple[str, Callable[[], float]]] = []
            write_read = r.files()
            for name, val in (("files write/s", write_read[0]), ("files read/s", write_read[1])):
                results.setdefault(f"{kind} {name}", []).append(val)
                line.append(f"{kind} {name} {val:.0f}")
            for proc, ms in r.cpu_ms.items():
                results.setdefault(f"{kind} cpu ms/file {proc}", []).append(ms)
            if r.cpu_ms:
                line.append(f"{kind} cpu ms/file {r.cpu_ms['total']:.1f}")
            if not kind.startswith("client"):
                steps = [
                    ("tar x s", r.tar),
                    ("sqlite s", lambda r=r: r.sqlite(a.sqlite_tx)),
                    ("sqlite calls s", lambda r=r: r.sqlite_calls(a.sqlite_tx)),
                    ("appends s", lambda r=r: r.appends(a.append_lines)),
                    ("ls -l entries/s", r.ls_l),
                ]
            if kind == "mount":  # in ABBA pairs, so a trend in the machine's load favours neither file
                for chunks in (1, 2, 2, 1, 1, 2, 2, 1)[: 4 * a.random_abba]:
                    steps.append(
                        (f"rand {chunks}-chunk iops", lambda r=r, c=chunks: r.random_io(c * 4 * MIB, a.random_ops))
                    )
            for name, fn in steps:
                val = fn()
                results.setdefault(f"{kind} {name}", []).append(val)
                line.append(f"{kind} {name} {val:.2f}")
        print(f"round {i + 1}: " + " | ".join(line), flush=True)
    return results


def report(results: dict[str, list[float]], a: argparse.Namespace, *, mount_present: bool) -> None:
    med = {k: statistics.median(v) for k, v in results.items()}
    print("\nmedians, and the median of per-round ratios to the local disk (files/s: higher is better):")
    for key in sorted(results):
        kind, name = key.split(" ", 1)
        if kind == "disk":
            continue
        base = results.get(f"disk {name}")
        ratio = f"   x{_median_ratio(results[key], base):.3f} of disk" if base else ""
        print(f"  {key:<28} {med[key]:10.2f}{ratio}")
    for key in sorted(k for k in results if k.startswith("disk ")):
        print(f"  {key:<28} {med[key]:10.2f}")
    print("\nissue 16's goals:")
    goal(f"client writes of {a.files} files, files/s >= 500", med["client files write/s"], 500, higher=True)
    goal("client writes with write-back, files/s >= 500", med["client-wb files write/s"], 500, higher=True)
    if mount_present:
        if a.tar_files == 241:
            goal("tar x of 241 files on the mount, s <= 1.5", med["mount tar x s"], 1.5, higher=False)
        if a.sqlite_tx == 100:
            goal("SQLite 100 transactions on the mount, s <= 1.5", med["mount sqlite s"], 1.5, higher=False)
            print(f"  (their file-system calls alone, no SQLite: {med['mount sqlite calls s']:.3f} s on the mount, "
                  f"{med['disk sqlite calls s']:.3f} s on the disk: the bound of the SQLite figure)")  # fmt: skip
        ratios = sorted(
            v / b for v, b in zip(results["mount rand 2-chunk iops"], results["mount rand 1-chunk iops"], strict=True)
        )
        quart = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        print(f"  (2-chunk / 1-chunk IOPS of each of {len(ratios)} runs side by side: quartiles {quart[0]:.3f}, "
              f"{quart[1]:.3f}, {quart[2]:.3f}; range {ratios[0]:.3f}-{ratios[-1]:.3f})")  # fmt: skip
        goal("random 4 KiB on the mount, 2-chunk / 1-chunk IOPS >= 1.0", statistics.median(ratios), 1.0, higher=True)


def goal(what: str, value: float, bar: float, *, higher: bool) -> None:
    met = value >= bar if higher else value <= bar
    print(f"  {what:<58} {value:10.3f}   {'met' if met else 'NOT met'}")


if __name__ == "__main__":
    sys.exit(main())
