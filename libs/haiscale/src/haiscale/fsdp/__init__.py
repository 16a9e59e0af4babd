"""HaiScale FSDP (ZeRO-3): ``FullyShardedDataParallel`` over any torch.distributed process group.

``from haiscale.fsdp import FullyShardedDataParallel, ModuleWrapPolicy, MixedPrecision``; wrap after
``torch.distributed.init_process_group``; give ``model.parameters()`` (the flat shards) to the optimizer.
"""

from __future__ import annotations

from haiscale.fsdp.flat import FlatLayout, Piece, layout_of
from haiscale.fsdp.wrap import ModuleWrapPolicy, SizeWrapPolicy, WrapPolicy, plan_units
from haiscale.fsdp.wrapper import FullyShardedDataParallel, MixedPrecision

__all__ = [
    "FlatLayout",
    "FullyShardedDataParallel",
    "MixedPrecision",
    "ModuleWrapPolicy",
    "Piece",
    "SizeWrapPolicy",
    "WrapPolicy",
    "layout_of",
    "plan_units",
]
