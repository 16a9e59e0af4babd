"""``fireflyer up --mount DIR`` mounts the cluster's 3FS with FUSE; files written there are in 3FS; ``down``
unmounts it and its daemon is gone. Skipped where FUSE is missing (no /dev/fuse or fusermount3)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ff_appliance.supervisor import pid_alive
from ff_testing.environ import clean_env

from .conftest import Appliance

pytestmark = pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
    reason="FUSE is not available here (no /dev/fuse or fusermount3; scripts/bootstrap.sh installs fuse3)",
)


def test_up_mount_and_down_unmounts(appliance: Appliance, tmp_path: Path) -> None:
    where = tmp_path / "3fs"
    try:
        up = appliance.ok("up", "--mount", str(where))
        assert f"mounted 3FS on {where}" in up.out and os.path.ismount(where)
        pid = json.loads((appliance.state_dir / "run" / "hf3fs-mount.json").read_text())["pid"]
        (where / "from-the-mount").mkdir()
        (where / "from-the-mount" / "hello.txt").write_text("hello through FUSE\n")
        plan = json.loads((appliance.state_dir / "plan.json").read_text())
        mgmtd = ",".join(f"{i['host']}:{i['grpc_port']}" for i in plan["instances"] if i["service"] == "mgmtd")
        env = clean_env()
        env["FF_MGMTD_ADDRESSES"] = mgmtd
        env["FF_TOKEN"] = (appliance.state_dir / "secrets" / "admin_token").read_text().strip()
        cat = subprocess.run([sys.executable, "-m", "hf3fs", "cat", "/from-the-mount/hello.txt"], env=env,
                             capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        assert (cat.returncode, cat.stdout) == (0, "hello through FUSE\n"), cat.stderr
        again = appliance.ok("up", "--mount", str(where))
        assert "mounted on" in again.out and "already" in again.out
        # the daemon dies: its mount stays, dead ("Transport endpoint is not connected"); `up --mount` replaces it
        os.kill(pid, signal.SIGKILL)
        _wait_gone(pid)
        assert str(where) in _fuse_mounts()
        with pytest.raises(OSError) as dead:
            os.listdir(where)
        assert dead.value.errno in (errno.ENOTCONN, errno.ECONNABORTED)
        remount = appliance.ok("up", "--mount", str(where))
        assert f"mounted 3FS on {where}" in remount.out and os.path.ismount(where)
        assert (where / "from-the-mount" / "hello.txt").read_text() == "hello through FUSE\n"
        pid = json.loads((appliance.state_dir / "run" / "hf3fs-mount.json").read_text())["pid"]
        # and `down` removes a dead mount too
        os.kill(pid, signal.SIGKILL)
        _wait_gone(pid)
        down = appliance.ok("down")
        assert f"unmounted {where}" in down.out
        assert str(where) not in _fuse_mounts() and not pid_alive(pid)
    finally:
        if str(where) in _fuse_mounts():  # also a dead mount, which os.path.ismount may not see
            subprocess.run(["fusermount3", "-uz", str(where)], check=False)


def _fuse_mounts() -> list[str]:
    with open("/proc/self/mounts") as f:
        return [line.split()[1] for line in f if line.split()[2].startswith("fuse")]


def _wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 10
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(pid)
