"""From a torch process group to the hfreduce group that reduces for it, and the checks made across ranks."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from hfreduce import Group
from hfreduce.distributed import join_store

_lock = threading.Lock()
_shared: dict[Any, SharedGroup] = {}  # torch ProcessGroup -> the hfreduce group formed for it


def resolve_process_group(process_group: Any) -> Any:
    """The torch ``ProcessGroup`` to follow: ``process_group``, or the default group.

    Raises:
        TypeError: ``process_group`` is not a torch ``ProcessGroup``.
        RuntimeError: no default group (``init_process_group`` was not called), or this rank is not a member.
    """
    if process_group is None:
        if not dist.is_initialized():
            raise RuntimeError(
                "haiscale DDP: call torch.distributed.init_process_group(...) before wrapping the model "
                "(or pass process_group=)"
            )
        return c10d._get_default_group()
    if process_group is dist.GroupMember.NON_GROUP_MEMBER:
        raise RuntimeError("haiscale DDP: this rank is not a member of process_group")
    if not isinstance(process_group, dist.ProcessGroup):
        raise TypeError(
            "haiscale DDP: process_group must be a torch.distributed ProcessGroup (from init_process_group or "
            f"new_group), got {type(process_group).__name__}"
        )
    if process_group not in c10d._world.pg_map:
        raise RuntimeError("haiscale DDP: process_group is not registered with torch.distributed (destroyed?)")
    return process_group


@dataclasses.dataclass
class SharedGroup:
    """An hfreduce group shared by every DDP wrapper on the same torch process group, closed with the last."""

    pg: Any
    group: Group
    src_rank: int  # hfreduce rank of the torch group's rank 0 (the source of broadcasts)
    users: int = 0

    def release(self) -> None:
        """Drop one wrapper's use; the last one closes the hfreduce group (thread-safe)."""
        with _lock:
            self.users -= 1
            if self.users > 0:
                return
            if _shared.get(self.pg) is self:
                del _shared[self.pg]
        self.group.close()


def acquire_group(pg: Any) -> SharedGroup:
    """The hfreduce group for torch group ``pg``, formed through ``pg``'s store on first use.

    Every rank of ``pg`` must call this at the same point (as it constructs its DDP wrapper). Layout (nodes,
    ranks per node) and options (``FF_HFREDUCE_*``, e.g. ``FF_HFREDUCE_TIMEOUT_S``) are ``join_store``'s.
    """
    with _lock:
        shared = _shared.get(pg)
        if shared is None:
            store = c10d._world.pg_map[pg][1]
            rank, size = dist.get_rank(pg), dist.get_world_size(pg)
            group, layout = join_store(store, rank, size, prefix=f"haiscale-ddp/{_generation(store, size)}")
            shared = SharedGroup(pg=pg, group=group, src_rank=layout.hf_rank(0))
            _shared[pg] = shared
        shared.users += 1
        return shared


def _generation(store: Any, size: int) -> int:
    """How many hfreduce groups were formed through ``store`` before this one (its keys' prefix).

    Counted in the store, not per torch group object: torch keeps the env:// store for the life of the process,
    so a default group destroyed and made again has the same store (and key prefix) as the one before, and a
    count that started again at 0 read the old group's keys (its closed control server's address). Every rank
    adds one before it publishes; all adds of one formation come before any of the next (a rank forms the next
    only once this one is formed), so all ranks agree.
    """
    count: int = store.add("haiscale-ddp/joins", 1)
    return (count - 1) // size


def check_same_parameters(pg: Any, named: Sequence[tuple[str, torch.nn.Parameter]]) -> None:
    """Every rank of ``pg`` holds the same trainable parameters (names, shapes, dtypes, in order).

    All ranks exchange their lists over ``pg`` and reach the same verdict, so all raise together.

    Raises:
        RuntimeError: names the first rank and parameter that differ from rank 0's.
    """
    mine = [(name, tuple(p.shape), str(p.dtype)) for name, p in named]
    everyone: list[Any] = [None] * dist.get_world_size(pg)
    dist.all_gather_object(everyone, mine, group=pg)
    reference = everyone[0]
    for rank, theirs in enumerate(everyone[1:], start=1):
        problem = _first_difference(reference, theirs)
        if problem is not None:
            raise RuntimeError(f"haiscale DDP: rank {rank}'s parameters differ from rank 0's: {problem}")


def _first_difference(
    ref: list[tuple[str, tuple[int, ...], str]], other: list[tuple[str, tuple[int, ...], str]]
) -> str | None:
    for i, (a, b) in enumerate(zip(ref, other, strict=False)):
        if a != b:
            return f"parameter {i} is {b[0]!r} {list(b[1])} {b[2]} there, {a[0]!r} {list(a[1])} {a[2]} on rank 0"
    if len(ref) != len(other):
        return f"{len(other)} parameters requiring grad there, {len(ref)} on rank 0"
    return None
