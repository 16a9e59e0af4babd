"""pjdfstest (the POSIX file-system suite) against ``hf3fs mount`` on a fresh local cluster; prints passed/total.

    python scripts/pjdfstest.py [--tests DIR...] [--jobs N] [--keep] [--mount-args ...]

It builds pjdfstest from ``../shared/tools/pjdfstest.tar.gz`` (relative to the repository's parent folder) into a
temp folder, brings a cluster up with ``fireflyer up`` in a temp state folder, mounts it with ``hf3fs mount
--multi-user`` (admin token, so each caller's uid and groups reach meta's checks), runs ``prove -r`` over the suite
from inside the mount, and prints ``pjdfstest: P/T tests passed (X %)`` and the failed tests per file. It exits 0
after a run (whatever the figure; the figure is the result), 1 when the cluster or mount failed, and 0 with
"skipped: ..." where the tarball, the build tools, root or FUSE are missing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARBALL = ROOT.parent / "shared" / "tools" / "pjdfstest.tar.gz"
BUILD_TOOLS = ("autoreconf", "make", "cc", "prove")
MOUNT_WAIT_S = 60.0


@dataclass
class Outcome:
    total: int = 0
    failed: dict[str, list[int]] = field(default_factory=dict)  # test file -> failed test numbers
    bad_files: list[str] = field(default_factory=list)  # died or ran a wrong number of tests

    @property
    def passed(self) -> int:
        return self.total - sum(len(v) for v in self.failed.values())


def skip_reason() -> str | None:
    if not TARBALL.exists():
        return f"{TARBALL} is missing (see ../shared/tools/README.md)"
    missing = [t for t in BUILD_TOOLS if shutil.which(t) is None]
    if shutil.which("autoreconf") and shutil.which("automake") is None:
        missing.append("automake")
    if missing:
        return f"build tools missing: {', '.join(missing)} (apt: autoconf automake gcc make perl)"
    if os.getuid() != 0:
        return "pjdfstest runs as root (it changes owners and switches users)"
    if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
        return "FUSE is not available (no /dev/fuse or fusermount3)"
    return None


def build(work: Path) -> Path:
    subprocess.run(["tar", "xzf", str(TARBALL), "-C", str(work)], check=True)
    src = work / "pjdfstest"
    for argv in (["autoreconf", "-ifs"], ["./configure"], ["make", "pjdfstest"]):
        subprocess.run(argv, cwd=src, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return src


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("FF_")}


def fireflyer(state: Path, *args: str) -> None:
    argv = [str(Path(sys.executable).parent / "fireflyer"), *args, "--state-dir", str(state)]
    subprocess.run(argv, check=True, env=_env(), stdout=subprocess.DEVNULL, timeout=300)


def cluster_env(state: Path) -> dict[str, str]:
    plan = json.loads((state / "plan.json").read_text())
    mgmtd = ",".join(f"{i['host']}:{i['grpc_port']}" for i in plan["instances"] if i["service"] == "mgmtd")
    token = (state / "secrets" / "admin_token").read_text().strip()
    return {**_env(), "FF_MGMTD_ADDRESSES": mgmtd, "FF_TOKEN": token}


def mount(where: Path, env: dict[str, str], log: Path, extra: list[str]) -> None:
    argv = [sys.executable, "-m", "hf3fs", "mount", str(where), "--multi-user", "--log-file", str(log), *extra]
    subprocess.run(argv, check=True, env=env, timeout=MOUNT_WAIT_S)


def umount(where: Path) -> None:
    if os.path.ismount(where):
        subprocess.run([sys.executable, "-m", "hf3fs", "umount", str(where)], check=False, env=_env())
    if os.path.ismount(where):
        subprocess.run(["fusermount3", "-uz", str(where)], check=False)


_SUMMARY = re.compile(r"^(\S+\.t)\s+\(Wstat: \d+ Tests: (\d+) Failed: (\d+)\)")
_FAILED = re.compile(r"^\s*Failed tests?:\s*(.*)$")
_MORE = re.compile(r"^\s+[\d, -]+$")
_PLANNED = re.compile(r"You planned (\d+) tests? but ran (\d+)")
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
_TOTAL = re.compile(r"^Files=\d+, Tests=(\d+)")


def _numbers(text: str) -> list[int]:
    out: list[int] = []
    for r in _RANGE.finditer(text):
        out.extend(range(int(r.group(1)), int(r.group(2) or r.group(1)) + 1))
    return out


def parse_prove(text: str, tests_root: Path) -> Outcome:
    """prove's summary report: ``path.t (Wstat: W Tests: N Failed: F)``, then ``Failed tests: 3, 5-7`` (wrapped
    over lines) and ``You planned P tests but ran N`` for a file that died; the tests it never ran count as
    failed (and in the total), as they would have on a file system where they ran."""
    out = Outcome()
    current = ""
    in_failed = False
    for line in text.splitlines():
        if m := _TOTAL.match(line):
            out.total += int(m.group(1))
        elif m := _SUMMARY.match(line):
            current = str(Path(m.group(1)).resolve().relative_to(tests_root.resolve()))
            out.failed.setdefault(current, [])
            in_failed = False
        elif current and (m := _FAILED.match(line)):
            out.failed[current].extend(_numbers(m.group(1)))
            in_failed = True
        elif current and in_failed and _MORE.match(line):
            out.failed[current].extend(_numbers(line))
        elif current and (m := _PLANNED.search(line)):
            planned, ran = int(m.group(1)), int(m.group(2))
            if planned > ran:
                out.total += planned - ran
                out.failed[current].extend(range(ran + 1, planned + 1))
            out.bad_files.append(current)
            in_failed = False
        else:
            in_failed = False
    out.failed = {k: v for k, v in out.failed.items() if v}
    return out


def run_prove(src: Path, where: Path, dirs: list[str], jobs: int, log: Path) -> Outcome:
    targets = [str(src / "tests" / d) for d in dirs] if dirs else [str(src / "tests")]
    work = where / f"pjdfstest-{os.getpid()}"
    work.mkdir()
    with log.open("w") as f:
        subprocess.run(["prove", "-r", f"-j{jobs}", *targets], cwd=work, stdout=f, stderr=subprocess.STDOUT,
                       check=False)  # fmt: skip
    return parse_prove(log.read_text(errors="replace"), src / "tests")


def report(out: Outcome, seconds: float, log: Path | None) -> None:
    pct = 100.0 * out.passed / out.total if out.total else 0.0
    for name, nums in sorted(out.failed.items()):
        print(f"  {name}: {len(nums)} failed ({', '.join(map(str, nums[:20]))}{' ...' if len(nums) > 20 else ''})")
    for name in sorted(set(out.bad_files)):
        print(f"  {name}: died or planned a different number of tests")
    where = f"prove's log: {log}" if log else "--keep keeps prove's log"
    print(f"pjdfstest: {out.passed}/{out.total} tests passed ({pct:.1f} %) in {seconds:.0f} s; {where}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", nargs="*", default=[], help="folders under pjdfstest/tests (default: all)")
    parser.add_argument("--jobs", type=int, default=1, help="prove -j")
    parser.add_argument("--keep", action="store_true", help="keep the temp folder (build, state, logs)")
    parser.add_argument("--mount-args", nargs=argparse.REMAINDER, default=[], help="more hf3fs mount flags")
    args = parser.parse_args()
    reason = skip_reason()
    if reason:
        print(f"pjdfstest: skipped: {reason}")
        return 0
    work = Path(tempfile.mkdtemp(prefix="ff-pjdfstest-"))
    state, where, log = work / "state", work / "mnt", work / "prove.log"
    where.mkdir()
    try:
        src = build(work)
        fireflyer(state, "up", "--agent", "1")
        try:
            mount(where, cluster_env(state), work / "mount.log", args.mount_args)
            start = time.monotonic()
            out = run_prove(src, where, args.tests, args.jobs, log)
            report(out, time.monotonic() - start, log if args.keep else None)
        finally:
            umount(where)
            fireflyer(state, "down")
    except subprocess.SubprocessError as err:
        print(f"pjdfstest: the cluster or the mount failed: {err} (folder {work})", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
