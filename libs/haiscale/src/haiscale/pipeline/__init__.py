"""HaiScale pipeline parallelism: GPipe and PipeDream (1F1B) schedules over micro-batches, with DDP across replicas.

``from haiscale.pipeline import GPipe, PipeDream, partition, make_subgroups, SequentialModel``;
``dp_group, pp_group = make_subgroups(pp_size=...)``; ``stage = partition(model, pp_group.rank(), pp_group.size(),
balance=[...])``; ``model = PipeDream(DDP(stage, process_group=dp_group), chunks, process_group=pp_group)``;
``loss, _ = model.forward_backward(x, criterion=..., labels=(y,))``.
"""

from __future__ import annotations

from haiscale.pipeline.engine import GPipe, PipeDream, Pipeline, PipelineFailure, StepStats
from haiscale.pipeline.groups import make_subgroups, subgroup_ranks
from haiscale.pipeline.partition import SequentialModel, partition, stage_bounds
from haiscale.pipeline.schedule import ideal_bubble

__all__ = [
    "GPipe",
    "PipeDream",
    "Pipeline",
    "PipelineFailure",
    "SequentialModel",
    "StepStats",
    "ideal_bubble",
    "make_subgroups",
    "partition",
    "stage_bounds",
    "subgroup_ranks",
]
