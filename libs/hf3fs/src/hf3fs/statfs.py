"""``df`` of a folder: the cluster's space, or the room a byte quota over the folder leaves, if that is less."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from hf3fs.entries import Quota, StatFs


def within_quotas(space: StatFs, quotas: Sequence[Quota]) -> StatFs:
    """``space`` as seen from a folder under ``quotas``, as JuiceFS shows a folder under a quota.

    The byte quota with the least room left, when that room is less than the cluster's free bytes, gives the size
    (its limit), the use and the free bytes. Inode counts stay the cluster's.
    """
    limited = [(q.max_bytes, q.used_bytes) for q in quotas if q.max_bytes is not None]
    if not limited:
        return space
    max_bytes, used = min(limited, key=lambda q: q[0] - q[1])
    room = max(0, max_bytes - used)
    if room >= space.free_bytes:
        return space
    return dataclasses.replace(space, capacity_bytes=max_bytes, used_bytes=min(used, max_bytes), free_bytes=room)
