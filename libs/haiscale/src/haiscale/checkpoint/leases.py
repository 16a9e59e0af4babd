"""Leases on a checkpoint folder: a save writing it, or a load reading it, keeps another process's prune away.

Several processes may share a checkpoint root: the ranks of a job, a restarted job while the old one's background
save still runs, two jobs by mistake. Each save and load holds a lease while it works: an empty file
``.lease-<kind>-<unix time>-<pid>-<random>-<host>`` in the checkpoint's folder. A prune (``saver.prune``) leaves a
folder with a live lease for a later save. A lease is live until its process is gone (seen on its own host) or
``LEASE_S`` after it was taken (other hosts), so a crash leaves nothing kept for long; one dated more than ``LEASE_S``
ahead of this host's clock is not live either.

The order of operations makes it safe without locks: a load takes its lease *before* it reads the manifest, and a
prune looks for leases *after* it moved the manifest away (and puts it back if it finds one); a save takes its lease
before it writes, and checks it is still there before it commits.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterator

from haiscale.checkpoint.storage import Location

logger = logging.getLogger(__name__)

LEASE_PREFIX = ".lease-"
LEASE_S = 3 * 3600.0  # a lease of another host counts this long; one of this host, while its process lives


def _this_host() -> str:
    return socket.gethostname().replace("/", "_") or "localhost"


def take(loc: Location, folder: str, kind: str) -> str | None:
    """Write a lease of this process in ``folder``; its path, or None when the folder cannot be written to.

    A load of a read-only checkpoint (someone else's) runs without a lease: nobody may prune that folder anyway.
    """
    name = f"{LEASE_PREFIX}{kind}-{int(time.time())}-{os.getpid()}-{uuid.uuid4().hex[:12]}-{_this_host()}"
    path = loc.join(folder, name)
    try:
        loc.storage.write_file(path, [])
    except OSError as err:
        logger.debug("no lease on %s: %s", loc.url(folder), err)
        return None
    return path


def release(loc: Location, path: str | None) -> None:
    """Remove a lease ``take`` wrote (nothing if it wrote none, or the folder is gone)."""
    if path is None:
        return
    with contextlib.suppress(OSError):
        loc.storage.remove(path)


@contextlib.contextmanager
def held(loc: Location, folder: str, kind: str) -> Iterator[str | None]:
    """A lease on ``folder`` for the block (see ``take``)."""
    path = take(loc, folder, kind)
    try:
        yield path
    finally:
        release(loc, path)


def is_live(name: str, now: float) -> bool:
    """Whether the lease file ``name`` still holds (see the module docstring); False for names that are no lease."""
    if not name.startswith(LEASE_PREFIX):
        return False
    fields = name[len(LEASE_PREFIX) :].split("-", 4)
    if len(fields) != 5 or not all(f.isascii() and f.isdigit() for f in fields[1:3]):
        return False  # (str.isdigit alone passes digits int() refuses: "²")
    if abs(now - int(fields[1])) > LEASE_S:
        return False  # (one "taken" far in the future, by a wrong clock or by hand, would hold its folder forever)
    if fields[4] != _this_host():
        return True
    return _alive(int(fields[2]))


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def live(loc: Location, folder: str) -> list[str]:
    """The live leases in ``folder``."""
    now = time.time()
    return [n for n in loc.storage.listdir(loc.join(folder)) if is_live(n, now)]
