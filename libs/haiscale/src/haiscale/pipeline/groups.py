"""``make_subgroups``: the data-parallel and pipeline process groups of a pipeline + DDP job."""

from __future__ import annotations

import datetime
from typing import Any

import torch.distributed as dist


def subgroup_ranks(world_size: int, pp_size: int) -> tuple[list[list[int]], list[list[int]]]:
    """The ranks of every data-parallel group and every pipeline, stage-major.

    Rank ``r`` is stage ``r // dp_size`` of replica ``r % dp_size``: a stage's replicas are consecutive ranks
    (one DP group), a pipeline takes every ``dp_size``-th rank. With torchrun's numbering a node's ranks then
    belong to different replicas of the same stage, the layout of the paper's pipeline + DDP runs (§V): DP
    traffic stays inside the node, pipeline sends cross nodes (and ``offset_replicas`` staggers them).

    Raises:
        ValueError: ``pp_size`` below 1 or not dividing ``world_size``.
    """
    if pp_size < 1 or world_size % pp_size:
        raise ValueError(f"pp_size {pp_size} must be at least 1 and divide the world size {world_size}")
    dp_size = world_size // pp_size
    dp_groups = [[s * dp_size + d for d in range(dp_size)] for s in range(pp_size)]
    pp_groups = [[s * dp_size + d for s in range(pp_size)] for d in range(dp_size)]
    return dp_groups, pp_groups


def make_subgroups(
    pp_size: int,
    dp_size: int | None = None,
    *,
    backend: str | None = None,
    timeout: datetime.timedelta | None = None,
) -> tuple[Any, Any]:
    """``(dp_group, pp_group)`` of this rank: its stage's data-parallel group and its replica's pipeline.

    Call on every rank after ``torch.distributed.init_process_group`` (every rank creates every group, in the
    same order, as ``new_group`` requires). Layout: ``subgroup_ranks``.

    Args:
        pp_size: stages per pipeline.
        dp_size: replicas; default ``world_size // pp_size`` (given, it must match).
        backend: the groups' backend (default: the default group's); the pipeline group sends point to point,
            which gloo, nccl and ``"hfreduce"`` do.
        timeout: the groups' timeout, as ``new_group`` takes it (default: torch's).

    Raises:
        RuntimeError: torch.distributed is not initialized.
        ValueError: the sizes do not fit the world.
    """
    if not dist.is_initialized():
        raise RuntimeError("make_subgroups: call torch.distributed.init_process_group(...) first")
    world = dist.get_world_size()
    dp_groups, pp_groups = subgroup_ranks(world, pp_size)
    if dp_size is not None and dp_size * pp_size != world:
        raise ValueError(f"dp_size {dp_size} x pp_size {pp_size} must be the world size {world}")
    rank = dist.get_rank()
    mine: dict[str, Any] = {}
    for kind, groups in (("dp", dp_groups), ("pp", pp_groups)):
        for ranks in groups:
            group = dist.new_group(ranks, backend=backend, timeout=timeout)
            if rank in ranks:
                mine[kind] = group
    return mine["dp"], mine["pp"]
