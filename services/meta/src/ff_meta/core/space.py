"""The file system's usable space from what storage targets report of the disks they live on (pure)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction


@dataclass(frozen=True)
class TargetSpace:
    """One target's report: its file system's size and free bytes, and which file system that is."""

    filesystem_id: str
    capacity_bytes: int
    free_bytes: int


@dataclass(frozen=True)
class UsableSpace:
    """The file system's usable bytes (after replication) and how many disks."""

    capacity_bytes: int
    free_bytes: int
    num_filesystems: int


def usable_space(targets: Iterable[TargetSpace], replication: Fraction) -> UsableSpace | None:
    """The cluster's usable capacity and free bytes.

    Capacity and free bytes of every distinct file system (counted once, however many targets share it),
    divided by the replication factor: every byte a client writes is stored once per replica.

    None when no target reported any capacity (the caller then falls back to its configured figure).
    """
    filesystems: dict[str, TargetSpace] = {}
    for t in targets:
        if t.filesystem_id and t.capacity_bytes > 0:
            filesystems[t.filesystem_id] = t
    if not filesystems:
        return None
    replicas = max(Fraction(1), replication)
    capacity = sum(t.capacity_bytes for t in filesystems.values())
    free = sum(min(t.free_bytes, t.capacity_bytes) for t in filesystems.values())
    return UsableSpace(int(capacity / replicas), int(free / replicas), len(filesystems))


def replicas_per_chain(chain_lengths: Iterable[int]) -> Fraction:
    """The mean number of targets of the chains that have any (1 when there are none), exact."""
    lengths = [n for n in chain_lengths if n > 0]
    return Fraction(sum(lengths), len(lengths)) if lengths else Fraction(1)
