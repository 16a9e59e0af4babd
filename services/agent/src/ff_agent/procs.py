"""Rank processes: spawn, find, signal and watch each rank's whole session.

A rank is spawned in its own session with its log file; every process of its session (its whole tree, also
children that changed process group) can be found, signalled, and seen gone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

from ff_agent.core.launch import RunAs

# Rank leaders get SIGKILL when the agent dies (a node agent that is gone owns nothing). Set by setpriv
# (util-linux) right before exec, so the spawn itself stays a plain vfork+exec: no Python code runs in
# a forked child of this multi-threaded process.
_SETPRIV = shutil.which("setpriv")


def spawn(
    argv: list[str], env: Mapping[str, str], cwd: Path, log_path: Path, run_as: RunAs | None = None
) -> subprocess.Popen[bytes]:
    """Start one rank in its own session (sid = pid), stdout and stderr appended to ``log_path``.

    It gets the uid, gid and groups of ``run_as`` (None: the agent's).

    The credentials are switched by the child before it execs setpriv (subprocess does it in C: groups,
    gid, then uid), and setpriv sets the death signal after that, since a change of uid clears it.

    Raises:
        OSError: the command could not be executed.
    """
    wrapped = [_SETPRIV, "--pdeathsig", "KILL", "--", *argv] if _SETPRIV else argv
    creds: dict[str, object] = {}
    if run_as is not None:
        creds = {"user": run_as.uid, "group": run_as.gid, "extra_groups": list(run_as.groups)}
    with log_path.open("ab") as log:
        return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
            wrapped,
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            **creds,
        )


def session_members(sids: Iterable[int]) -> dict[int, int]:
    """Live (non-zombie) processes in any of the sessions: pid -> sid."""
    wanted = set(sids)
    found: dict[int, int] = {}
    if not wanted:
        return found
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) < 4 or fields[0] == b"Z":
            continue
        sid = int(fields[3])
        if sid in wanted:
            found[int(entry.name)] = sid
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] != b"Z"


def stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped: by a signal (SIGSTOP, SIGTSTP, ...) or by a tracer (state T or t)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] in (b"T", b"t")


def environ_has(pid: int, entry: bytes) -> bool:
    """Whether the process's initial environment holds ``entry`` (``b"NAME=value"``)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return entry in f.read().split(b"\0")
    except OSError:
        return False


def signal_sessions(sids: Iterable[int], sig: signal.Signals) -> int:
    """Send ``sig`` to every process of the sessions (process groups first, then stragglers); how many."""
    sids = list(sids)
    for sid in sids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(sid, sig)
    members = session_members(sids)
    for pid in members:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
    return len(members)


def closed_ancestor(folder: Path) -> Path | None:
    """The first existing folder on the way to ``folder`` (itself included) that others cannot search."""
    for path in [*reversed(folder.parents), folder]:
        if path.exists() and not path.stat().st_mode & stat.S_IXOTH:
            return path
    return None
