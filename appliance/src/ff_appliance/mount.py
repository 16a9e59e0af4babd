"""``fireflyer up --mount DIR``: the cluster's 3FS mounted with ``hf3fs mount`` (as the admin).

``down`` unmounts it before it stops the services. Nothing is mounted unless asked.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

from ff_appliance.state import StateDir
from ff_appliance.supervisor import pid_alive

MOUNT_NAME = "hf3fs-mount"
EXIT_WAIT_S = 10.0


def _record(state: StateDir) -> Path:
    return state.run_dir / f"{MOUNT_NAME}.json"


def mount_3fs(state: StateDir, mgmtd: Sequence[str], token: str, where: str, env: Mapping[str, str]) -> str:
    """Mount 3FS at ``where`` through a daemon, unless this cluster already has it mounted there; a line to print.

    Raises:
        OSError: this machine cannot mount FUSE, or the mount did not come up.
    """
    from hf3fs import fuse  # loads libfuse: only when a mount is asked for

    target = os.path.abspath(where)
    current = _read(state)
    if current is not None and current[0] == target and os.path.ismount(target) and pid_alive(current[1]):
        return f"3FS is mounted on {target} already (daemon pid {current[1]})"
    if current is not None:  # what an earlier `up --mount` left: its daemon died or the mount moved
        unmount_3fs(state, io.StringIO())
    os.makedirs(target, exist_ok=True)
    options = fuse.MountOptions(log_file=str(state.log_file(MOUNT_NAME)))
    mounted = fuse.mount_background(target, ",".join(mgmtd), token, options, env)
    _record(state).write_text(json.dumps({"where": mounted.where, "pid": mounted.pid}))
    return f"{mounted} (as the admin; `fireflyer down` unmounts it)"


def unmount_3fs(state: StateDir, out: TextIO) -> None:
    """Unmount what ``up --mount`` mounted, and make sure its daemon is gone."""
    current = _read(state)
    if current is None:
        return
    where, pid = current
    from hf3fs import fuse

    try:  # also a dead or hung mount, which os.path.ismount does not see (its stat fails)
        fuse.umount(where)
    except OSError as err:
        if err.errno != errno.EINVAL:  # EINVAL: nothing mounted there
            print(f"{MOUNT_NAME}: {err}", file=out)
    deadline = time.monotonic() + EXIT_WAIT_S
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _record(state).unlink(missing_ok=True)
    print(f"{MOUNT_NAME}: unmounted {where}", file=out)


def _read(state: StateDir) -> tuple[str, int] | None:
    try:
        data = json.loads(_record(state).read_text())
    except (FileNotFoundError, ValueError):
        return None
    return str(data["where"]), int(data["pid"])
