"""Train the tiny GPT with pipeline parallelism (haiscale.pipeline) and DDP across the pipeline's replicas,
checkpointing each stage, honouring HAI's suspend protocol.

    # 4 ranks by hand (torchrun-style env): 2 stages x 2 replicas, 1F1B over 4 micro-batches
    python examples/gpt/train_pipeline.py --data corpus.txt --ckpt ./ckpt-pp --pp 2 --chunks 4
    # on the cluster
    hfai python examples/gpt/train_pipeline.py --data hf3fs:///data/corpus.txt --ckpt hf3fs:///ckpt/gpt-pp \\
        -- --nodes 2

The model is cut into ``--pp`` stages of consecutive layers (the embedding, each block, the head);
``haiscale.pipeline.make_subgroups`` puts a stage's replicas in one DP group (haiscale DDP averages their
gradients) and a replica's stages in one pipeline group (activations and gradients go stage to stage). Every
step each replica takes its slice of the global batch (the data order of ``train.py``), split into ``--chunks``
micro-batches; the last stage's loss reaches rank 0, which prints and reports it.

Checkpoints: each stage saves its own layers, optimizer, RNG states, step and data position under
``<ckpt>/stage-<s>`` (the stage's replicas hold the same values: its DP group's rank 0 writes them). A run resumes
from the newest step every stage has committed.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from model import VOCAB, GPTConfig, TinyGPT
from torch import nn
from train import Batches, Progress, Ranks, agreed_step, ranks_from_env, read_corpus, run
from train import parse_args as parse_common

import hfai.telemetry
from haiscale import checkpoint as ckpt
from haiscale.checkpoint import saver
from haiscale.checkpoint.storage import locate
from haiscale.ddp import DistributedDataParallel
from haiscale.pipeline import GPipe, PipeDream, SequentialModel, make_subgroups, partition
from hfai import client as hfai_client


class Embed(nn.Module):
    """Token and position embeddings (the first layer of the pipeline)."""

    def __init__(self, gpt: TinyGPT) -> None:
        super().__init__()
        self.tok, self.pos, self.drop = gpt.tok, gpt.pos, gpt.drop

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.drop(self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device)))


class Head(nn.Module):
    """The final norm and the logits over the byte values (the last layer)."""

    def __init__(self, gpt: TinyGPT) -> None:
        super().__init__()
        self.ln, self.head = gpt.ln, gpt.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln(x))


def layers_of(gpt: TinyGPT) -> SequentialModel:
    """The GPT as a sequence of layers ``partition`` can cut: embedding, each block, head."""
    return SequentialModel(Embed(gpt), *gpt.blocks, Head(gpt))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--pp", type=int, default=2, help="pipeline stages (the world size must be a multiple)")
    extra.add_argument("--chunks", type=int, default=2, help="micro-batches per step (dividing --batch)")
    extra.add_argument("--schedule", choices=["1f1b", "gpipe"], default="1f1b")
    mine, rest = extra.parse_known_args(argv)
    a = parse_common(rest)
    a.pp, a.chunks, a.schedule = mine.pp, mine.chunks, mine.schedule
    return a


class PipelineTrainer:
    def __init__(self, a: argparse.Namespace, r: Ranks) -> None:
        self.a, self.r = a, r
        self.dp_group, self.pp_group = make_subgroups(pp_size=a.pp)
        self.stage, self.replica = self.pp_group.rank(), self.dp_group.rank()
        self.replicas = self.dp_group.size()
        torch.manual_seed(a.seed)  # the same on every rank: every stage cuts the same initial model
        random.seed(a.seed)
        cfg = GPTConfig(context=a.context, dim=a.dim, heads=a.heads, layers=a.layers, dropout=a.dropout)
        self.module = partition(layers_of(TinyGPT(cfg)), self.stage, a.pp)
        torch.manual_seed(a.seed + 1000 * self.stage)  # each stage's dropout masks its own (replicas agree)
        ddp = DistributedDataParallel(self.module, process_group=self.dp_group) if self.replicas > 1 else self.module
        schedule = PipeDream if a.schedule == "1f1b" else GPipe
        self.model = schedule(ddp, a.chunks, process_group=self.pp_group)
        self.ddp = ddp
        self.opt = torch.optim.AdamW(self.module.parameters(), lr=a.lr)
        self.batches = Batches(read_corpus(a.data), a.context, a.seed)
        self.root = f"{a.ckpt.rstrip('/')}/stage-{self.stage}"
        self.step = 0
        self.saved_step: int | None = None

    def state(self) -> dict[str, Any]:
        return {
            "model": self.module.state_dict(),
            "optim": self.opt.state_dict(),
            "step": self.step,
            "data": self.batches.state(),
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
        }

    def _common_step(self) -> int | None:
        """The newest step every stage committed (checked on every rank, from the stages' folders)."""
        steps = None
        for s in range(self.a.pp):
            committed = set(saver.committed_steps(locate(f"{self.a.ckpt.rstrip('/')}/stage-{s}", None)))
            steps = committed if steps is None else steps & committed
        return max(steps) if steps else None

    def resume(self) -> int | None:
        step = agreed_step(self._common_step() if self.r.rank == 0 else None, self.r)
        if step is None:
            return None
        state = self.state()
        ckpt.load(self.root, state, step=step, allocate_missing=True)  # the optimizer has no moments yet
        self.opt.load_state_dict(state["optim"])
        self.step = self.saved_step = state["step"]
        self.batches.restore(state["data"])
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        return step

    def save(self, blocking: bool) -> None:
        if self.saved_step == self.step:
            if blocking:
                ckpt.wait_for_saves()
            return
        hfai.telemetry.flush()
        # Each stage its own checkpoint, its DP group saving it (group rank 0 writes); only stage 0's is reported
        # to the scheduler (a suspend waits for one checkpoint: the run saves every stage before go_suspend).
        ckpt.save(self.root, self.state(), step=self.step, keep=self.a.keep, blocking=blocking, group=self.dp_group,
                  report=self.stage == 0)  # fmt: skip
        self.saved_step = self.step

    def train_step(self) -> float:
        x, y = self.batches.next(self.a.batch * self.replicas, self.replica, self.replicas)
        chunks = self.a.chunks

        def criterion(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(logits.view(-1, VOCAB), targets.reshape(-1)) / chunks

        self.opt.zero_grad(set_to_none=True)
        losses, _ = self.model.forward_backward(x, criterion=criterion, labels=(y,))
        self.opt.step()
        self.step += 1
        # The replica's loss is on its last stage; the step's loss, averaged over replicas, goes to rank 0.
        loss = torch.zeros(1)
        if losses is not None:
            loss += losses.detach().sum() / self.replicas
        dist.all_reduce(loss)
        return float(loss.item())

    def suspend_asked(self) -> bool:
        asked = self.r.rank == 0 and hfai_client.receive_suspend_command()
        flag = torch.tensor([1 if asked else 0])
        dist.broadcast(flag, src=0)
        return bool(flag.item())


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    r = ranks_from_env(dict(os.environ))
    dist.init_process_group(a.backend, rank=r.rank, world_size=r.world)
    t = PipelineTrainer(a, r)
    resumed = t.resume()
    progress = Progress(a, Ranks(r.rank, t.replicas, r.local_rank))  # tokens per step: the replicas' batches
    if r.rank == 0:
        print(f"rank 0 of {r.world} ({a.pp} stages x {t.replicas} replicas, {a.schedule}): "
              + (f"resumed from step {resumed}" if resumed is not None else "from scratch"), flush=True)  # fmt: skip
    run(t, a, r, progress)
    if isinstance(t.ddp, DistributedDataParallel):
        t.ddp.reducer.stop()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
