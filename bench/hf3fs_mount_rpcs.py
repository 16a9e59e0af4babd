"""Where the FUSE mount's time goes, in round trips: the FUSE callbacks the kernel makes and the meta/storage RPCs
the mount sends for ``tar x`` of a tree and for SQLite transactions (issue 16, defect 6).

A real cluster (as ``hf3fs_small_files.py``), mounted by ``hf3fs mount --foreground`` in a child process whose
client and FUSE callbacks are wrapped with counters by a ``sitecustomize`` this script puts on its PYTHONPATH
(nothing else changes: the same code serves). Per phase it
prints the counts divided by the phase's files (tar) or transactions (SQLite), and the phase's wall time.

    .venv/bin/python bench/hf3fs_mount_rpcs.py
    .venv/bin/python bench/hf3fs_mount_rpcs.py --tar-files 241 --sqlite-tx 100 --dir /work/tmp
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

from _hf3fs_common import bench_cluster, fuse_mount
from hf3fs_small_files import Round, make_tarball

# The mount process's sitecustomize: counters around the meta/storage calls and the FUSE callbacks, written to
# $HF3FS_COUNT_DIR/counts.json whenever a file "dump" appears there (libfuse's loop holds the main thread, so a
# thread watches).
_COUNTING = r"""
import collections, functools, json, os, sys, threading, time
from hf3fs import fuse, meta_client, storage_client
out = os.environ["HF3FS_COUNT_DIR"]
counts = collections.Counter()
lock = threading.Lock()
def bump(key):
    with lock:
        counts[key] += 1
class _Namer:  # the typed client's method (snake_case) -> the RPC's name in the proto
    def __getattr__(self, name):
        return "".join(part.title() for part in name.split("_"))
meta_call = meta_client.MetaClient.call
async def counted_call(self, select, request, **kw):
    bump("meta " + select(_Namer()))
    return await meta_call(self, select, request, **kw)
meta_client.MetaClient.call = counted_call
def storage(name):
    orig = getattr(storage_client.StorageClient, name)
    async def counted(self, ios, *a, **kw):
        bump("storage " + name)
        return await orig(self, ios, *a, **kw)
    setattr(storage_client.StorageClient, name, counted)
storage("batch_read"); storage("batch_write")
def op(name):
    orig = getattr(fuse.Hf3fsOperations, name)
    @functools.wraps(orig)  # mfusepy reads the callbacks' signatures (create's flags)
    def counted(self, *a, **kw):
        bump("fuse " + name)
        return orig(self, *a, **kw)
    setattr(fuse.Hf3fsOperations, name, counted)
for name in ("getattr", "create", "open", "read", "write", "flush", "release", "fsync", "truncate", "utimens",
             "chmod", "chown", "mkdir", "unlink", "rename", "opendir", "readdir", "releasedir", "mknod", "rmdir"):
    op(name)
def watch():
    while True:
        if os.path.exists(os.path.join(out, "dump")):
            with lock:
                data = json.dumps(counts)
            with open(os.path.join(out, "counts.tmp"), "w") as f:
                f.write(data)
            os.replace(os.path.join(out, "counts.tmp"), os.path.join(out, "counts.json"))
            os.remove(os.path.join(out, "dump"))
        time.sleep(0.02)
threading.Thread(target=watch, daemon=True).start()
"""


def snapshot(folder: Path) -> Counter[str]:
    (folder / "dump").touch()
    while (folder / "dump").exists():
        time.sleep(0.01)
    return Counter(json.loads((folder / "counts.json").read_text()))


def report(what: str, per: int, delta: Counter[str], seconds: float) -> None:
    print(f"\n{what}: {seconds:.2f} s; per item ({per} items), by kind:")
    for kind in ("fuse", "meta", "storage"):
        items = sorted((k for k in delta if k.startswith(kind + " ")), key=lambda k: -delta[k])
        total = sum(delta[k] for k in items)
        each = ", ".join(f"{k.split(' ', 1)[1]} {delta[k] / per:.2f}" for k in items)
        print(f"  {kind:<8} {total / per:6.2f}   {each}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tar-files", type=int, default=241)
    p.add_argument("--sqlite-tx", type=int, default=100)
    p.add_argument("--dir", type=Path, default=None)
    a = p.parse_args()
    with bench_cluster("hf3fs-rpcs-", a.dir, with_mount=False) as c:
        tarball = c.root / "tree.tar"
        make_tarball(tarball, a.tar_files, seed=2)
        counts = c.root / "counts"
        counts.mkdir()
        mgmtd, token = c.fs._args[0][0], c.fs._args[1]
        (counts / "site").mkdir()
        (counts / "site" / "sitecustomize.py").write_text(_COUNTING)
        path = os.environ.get("PYTHONPATH", "")
        os.environ.update(
            HF3FS_COUNT_DIR=str(counts), PYTHONPATH=f"{counts / 'site'}{os.pathsep}{path}".rstrip(os.pathsep)
        )
        with fuse_mount(c.root / "mnt", mgmtd, token, counts / "mount.log") as where:
            if where is None:
                return 1
            r = Round("mount", c.fs, where / "bench", [], tarball)
            before = snapshot(counts)
            seconds = r.tar()
            after = snapshot(counts)
            report(f"tar x of {a.tar_files} files", a.tar_files, after - before, seconds)
            seconds = r.sqlite(a.sqlite_tx)
            last = snapshot(counts)
            report(f"SQLite, {a.sqlite_tx} transactions (with open and close)", a.sqlite_tx, last - after, seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
