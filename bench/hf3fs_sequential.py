"""3FS sequential throughput: one large file written and read through the hf3fs client, through the FUSE mount
(``hf3fs mount``), and on the local disk, in interleaved rounds; median MiB/s and median ratios to the disk.

One run starts a real cluster (mgmtd, three storage services with chains of 3, one meta service, as processes
on this machine, state under ``--dir``), mounts it with ``hf3fs mount --foreground`` when /dev/fuse and
fusermount3 are there, and each round, in an order that rotates from round to round:

- write: ``--size-mib`` MiB in ``--block-mib`` MiB writes, then made durable (client: close, which makes the
  length exact on meta after every replica acknowledged; FUSE: fsync + close; disk: fsync + close). 3FS
  writes three replicas (each with an fsync) on the same disk, so the disk figure is the ceiling x 3;
- read: the whole file back into one reused buffer (client: ``readinto``; FUSE and disk: ``readinto`` on an
  unbuffered file). The disk file and the chunk files were just written, so both reads come from the page
  cache: the ratio measures the client path, not the device.

    .venv/bin/python bench/hf3fs_sequential.py                      # 1 GiB, 3 rounds
    .venv/bin/python bench/hf3fs_sequential.py --size-mib 256 --rounds 5 --dir /work/tmp
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _hf3fs_common import bench_cluster

MIB = 1 << 20


def _write_io(f: Any, payload: memoryview, total: int) -> None:
    done = 0
    while done < total:
        n = min(len(payload), total - done)
        f.write(payload[:n])
        done += n


def _read_io(f: Any, buf: memoryview, total: int) -> None:
    done = 0
    while done < total:
        n = f.readinto(buf)
        if not n:
            raise RuntimeError(f"short read: {done} of {total}")
        done += n


class Runner:
    def __init__(self, fs: Any, local_dir: Path, mount: Path | None, size: int, block: int) -> None:
        self.fs, self.local_dir, self.mount, self.size = fs, local_dir, mount, size
        self.payload = memoryview(os.urandom(block))
        self.buf = memoryview(bytearray(block))

    # each returns MiB/s
    def timed(self, fn: Callable[[], None]) -> float:
        t0 = time.perf_counter()
        fn()
        return self.size / MIB / (time.perf_counter() - t0)

    def client_write(self) -> float:
        def run() -> None:
            with self.fs.open("/bench/client.bin", "wb") as f:
                _write_io(f, self.payload, self.size)

        return self.timed(run)

    def client_read(self) -> float:
        def run() -> None:
            with self.fs.open("/bench/client.bin", "rb", buffering=0) as f:
                _read_io(f, self.buf, self.size)

        return self.timed(run)

    def _posix_write(self, path: Path) -> float:
        def run() -> None:
            with open(path, "wb", buffering=0) as f:
                _write_io(f, self.payload, self.size)
                os.fsync(f.fileno())

        return self.timed(run)

    def _posix_read(self, path: Path) -> float:
        def run() -> None:
            with open(path, "rb", buffering=0) as f:
                _read_io(f, self.buf, self.size)

        return self.timed(run)

    def fuse_write(self) -> float:
        assert self.mount is not None
        return self._posix_write(self.mount / "bench" / "fuse.bin")

    def fuse_read(self) -> float:
        assert self.mount is not None
        return self._posix_read(self.mount / "bench" / "fuse.bin")

    def disk_write(self) -> float:
        return self._posix_write(self.local_dir / "disk.bin")

    def disk_read(self) -> float:
        return self._posix_read(self.local_dir / "disk.bin")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-mib", type=int, default=1024)
    p.add_argument("--block-mib", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dir", type=Path, default=None, help="where the cluster and the disk file live (one disk)")
    p.add_argument("--no-fuse", action="store_true")
    a = p.parse_args()
    with bench_cluster("hf3fs-seq-", a.dir, with_mount=not a.no_fuse) as c:
        r = Runner(c.fs, c.root, c.mount, a.size_mib * MIB, a.block_mib * MIB)
        kinds = ["client", "disk"] + (["fuse"] if c.mount is not None else [])
        results: dict[str, list[float]] = {f"{k} {op}": [] for k in kinds for op in ("write", "read")}
        print(f"{a.size_mib} MiB in {a.block_mib} MiB I/Os, {a.rounds} rounds, state in {c.root}")
        for i in range(a.rounds):
            order = kinds[i % len(kinds) :] + kinds[: i % len(kinds)]
            line = []
            for kind in order:
                for op in ("write", "read"):
                    mibs = getattr(r, f"{kind}_{op}")()
                    results[f"{kind} {op}"].append(mibs)
                    line.append(f"{kind} {op} {mibs:8.1f}")
            print(f"round {i + 1}: " + " | ".join(line) + " MiB/s", flush=True)
        print("\nmedian MiB/s and median of per-round ratios to the local disk:")
        for kind in kinds:
            for op in ("write", "read"):
                vals, base = results[f"{kind} {op}"], results[f"disk {op}"]
                ratio = statistics.median(v / b for v, b in zip(vals, base, strict=True))
                print(f"  {kind:<6} {op:<5} {statistics.median(vals):9.1f} MiB/s   x{ratio:.3f} of disk")
    return 0


if __name__ == "__main__":
    sys.exit(main())
