"""Train the tiny GPT fully sharded (haiscale.fsdp, ZeRO-3), checkpointing the shards, honouring HAI's suspend
protocol.

    # by hand, torchrun-style (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)
    python examples/gpt/train_fsdp.py --data corpus.txt --ckpt ./ckpt-fsdp --steps 300
    # on the cluster: 2 nodes
    hfai python examples/gpt/train_fsdp.py --data hf3fs:///data/corpus.txt --ckpt hf3fs:///ckpt/gpt-fsdp -- --nodes 2

``train.py`` with ``haiscale.fsdp.FullyShardedDataParallel`` in place of DDP: each transformer block is a unit
(``ModuleWrapPolicy``), every rank keeps 1/world of each unit's parameters, gradients and AdamW moments, the next
block's parameters are gathered while one computes. Checkpoints hold the shards (``sharded_state_dict`` and
``sharded_optim_state_dict``: every rank writes its own slices), so a run may resume on another number of ranks.
"""

from __future__ import annotations

import os
import random
import sys
from typing import Any

import torch
import torch.distributed as dist
from model import Block, GPTConfig, TinyGPT
from train import Batches, Progress, Ranks, Trainer, parse_args, ranks_from_env, read_corpus, run

from haiscale.fsdp import FullyShardedDataParallel, ModuleWrapPolicy


class FsdpTrainer(Trainer):
    """``train.Trainer`` over FSDP: the same steps, data order and suspend handling; sharded state."""

    def __init__(self, a: Any, r: Ranks) -> None:  # (no super().__init__: it would wrap the model in DDP)
        self.a, self.r = a, r
        torch.manual_seed(a.seed)
        random.seed(a.seed)
        cfg = GPTConfig(context=a.context, dim=a.dim, heads=a.heads, layers=a.layers, dropout=a.dropout)
        self.model = TinyGPT(cfg)
        self.ddp = self.fsdp = FullyShardedDataParallel(self.model, auto_wrap_policy=ModuleWrapPolicy([Block]))
        self.opt = torch.optim.AdamW(self.fsdp.parameters(), lr=a.lr)
        self.batches = Batches(read_corpus(a.data), a.context, a.seed)
        self.step = 0
        self.saved_step: int | None = None

    def state(self) -> dict[str, Any]:
        return {
            "model": self.fsdp.sharded_state_dict(),
            "optim": self.fsdp.sharded_optim_state_dict(self.opt),
            "step": self.step,
            "data": self.batches.state(),
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
        }

    def restore_optimizer(self, state: dict[str, Any]) -> None:
        self.fsdp.load_sharded_optim_state_dict(self.opt, state)  # AdamW's moments: made whole by the load


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    r = ranks_from_env(dict(os.environ))
    dist.init_process_group(a.backend, rank=r.rank, world_size=r.world)
    t = FsdpTrainer(a, r)
    resumed = t.resume()
    if r.rank == 0:
        print(f"rank 0 of {r.world} (FSDP): " + (f"resumed from step {resumed}" if resumed is not None
                                                 else "from scratch"), flush=True)  # fmt: skip
    run(t, a, r, Progress(a, r))
    t.fsdp.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
