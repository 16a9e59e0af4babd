"""HaiScale DDP: ``DistributedDataParallel`` over hfreduce, a drop-in for torch's.

``from haiscale.ddp import DistributedDataParallel``; wrap after ``torch.distributed.init_process_group``;
call ``model.reducer.stop()`` at exit.
"""

from __future__ import annotations

from haiscale.ddp.reducer import Reducer
from haiscale.ddp.wrapper import DistributedDataParallel

__all__ = ["DistributedDataParallel", "Reducer"]
