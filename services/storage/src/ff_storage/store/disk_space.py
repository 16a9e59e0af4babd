"""The space of the file system a target's folder lives on (what ListTargets reports for meta's StatFs)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ff_fsprotocol.shm import host_id


@dataclass(frozen=True)
class DiskSpace:
    """A file system's size and available bytes, with an id unique in the cluster."""

    capacity_bytes: int
    free_bytes: int
    filesystem_id: str


def disk_space(path: str) -> DiskSpace:
    """The space of ``path``'s file system (from statvfs), with an id so that sums count it once.

    Its size and the bytes an unprivileged writer may still use (``f_bavail``, what ``df`` shows as available);
    the id is the same for every folder on that file system and unique in the cluster (kernel boot id and
    device number).
    """
    st = os.statvfs(path)
    filesystem_id = f"{host_id() or os.uname().nodename}:{os.stat(path).st_dev}"
    return DiskSpace(st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize, filesystem_id)
