"""Train the tiny GPT data-parallel, checkpointing into 3FS, honouring HAI's suspend protocol.

    # by hand, torchrun-style (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; or one process without them)
    python examples/gpt/train.py --data corpus.txt --ckpt ./ckpt --steps 300
    # on the cluster: 2 nodes, the agent starts LOCAL_WORLD_SIZE ranks on each
    hfai python examples/gpt/train.py --data hf3fs:///data/corpus.txt --ckpt hf3fs:///ckpt/gpt -- --nodes 2

Each step every rank takes its slice of the next global batch of windows from a per-epoch permutation of
the corpus; gradients are averaged by DDP. Every ``--ckpt-every`` steps (and when the scheduler asks the task
to suspend) the model, the optimizer, the RNG states, the step and the data position are saved with
``haiscale.checkpoint`` (asynchronously: training goes on while it is written); a run resumes from the newest
committed checkpoint and continues its loss curve where it stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from dataclasses import dataclass
from typing import Any, Protocol

import fsspec
import torch
import torch.distributed as dist
from model import GPTConfig, TinyGPT

import hfai.telemetry
from haiscale import checkpoint as ckpt
from haiscale.ddp import DistributedDataParallel  # torch.nn.parallel's runs the same (the one line to switch)
from hfai import client as hfai_client


@dataclass(frozen=True)
class Ranks:
    rank: int
    world: int
    local_rank: int


def ranks_from_env(env: dict[str, str]) -> Ranks:
    """Global rank and world: HAI's task env (WORLD_SIZE/RANK count nodes, LOCAL_WORLD_SIZE ranks per node)
    when the agent started us, else torchrun's (RANK/WORLD_SIZE count processes)."""
    local = int(env.get("LOCAL_RANK", "0"))
    if "HFAI_RUN_DIR" in env and "LOCAL_WORLD_SIZE" in env:
        per_node = int(env["LOCAL_WORLD_SIZE"])
        return Ranks(int(env["RANK"]) * per_node + local, int(env["WORLD_SIZE"]) * per_node, local)
    return Ranks(int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1")), local)


class Batches:
    """Windows of ``context + 1`` bytes in a fresh permutation each epoch; the position is (epoch, index)."""

    def __init__(self, data: torch.Tensor, context: int, seed: int) -> None:
        self.data, self.context, self.seed = data, context, seed
        self.num_windows = (len(data) - 1) // context
        self.epoch, self.index = 0, 0
        self._order = self._permutation()

    def _permutation(self) -> torch.Tensor:
        return torch.randperm(self.num_windows, generator=torch.Generator().manual_seed(self.seed + self.epoch))

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}

    def restore(self, state: dict[str, int]) -> None:
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
        self._order = self._permutation()

    def next(self, global_batch: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's share of the next global batch (inputs, targets)."""
        if self.index + global_batch > self.num_windows:
            self.epoch, self.index = self.epoch + 1, 0
            self._order = self._permutation()
        ids = self._order[self.index : self.index + global_batch]
        self.index += global_batch
        per_rank = global_batch // world
        starts = ids[rank * per_rank : (rank + 1) * per_rank] * self.context
        rows = torch.stack([self.data[s : s + self.context + 1] for s in starts.tolist()]).long()
        return rows[:, :-1], rows[:, 1:]


def agreed_step(step: int | None, r: Ranks) -> int | None:
    """Rank 0's ``step`` on every rank: the checkpoint all of them resume from.

    Each rank looking for the newest checkpoint itself could find different ones (the old job's save of this task
    may commit a newer one meanwhile), and the replicas would then differ.
    """
    if r.world == 1:
        return step
    box = [step]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def read_corpus(path: str) -> torch.Tensor:
    """The corpus bytes from a local path or an ``hf3fs://`` URL (fsspec: the hf3fs client reads 3FS)."""
    with fsspec.open(path, "rb") as f:
        return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="the corpus: a local path or hf3fs:///... (see corpus.py)")
    p.add_argument("--ckpt", required=True, help="checkpoint root: hf3fs:///... or a local folder")
    p.add_argument("--steps", type=int, default=300, help="train until this step")
    p.add_argument("--batch", type=int, default=16, help="sequences per rank per step")
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ckpt-every", type=int, default=100, help="save every N steps (0: only at suspend and end)")
    p.add_argument("--keep", type=int, default=3, help="committed checkpoints kept")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--metrics", default="", help="rank 0 appends one JSON line per step here")
    p.add_argument("--backend", default="gloo")
    return p.parse_args(argv)


class Trainer:
    def __init__(self, a: argparse.Namespace, r: Ranks) -> None:
        self.a, self.r = a, r
        torch.manual_seed(a.seed)  # the same on every rank: replicas start equal, dropout masks agree
        random.seed(a.seed)
        cfg = GPTConfig(context=a.context, dim=a.dim, heads=a.heads, layers=a.layers, dropout=a.dropout)
        self.model = TinyGPT(cfg)
        self.ddp = DistributedDataParallel(self.model) if r.world > 1 else self.model
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=a.lr)
        self.batches = Batches(read_corpus(a.data), a.context, a.seed)
        self.step = 0
        self.saved_step: int | None = None

    def state(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optim": self.opt.state_dict(),
            "step": self.step,
            "data": self.batches.state(),
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
        }

    def resume(self) -> int | None:
        """Load the newest committed checkpoint, if any; its step."""
        step = agreed_step(ckpt.latest_step(self.a.ckpt) if self.r.rank == 0 else None, self.r)
        if step is None:
            return None
        state = self.state()
        loaded = ckpt.load(self.a.ckpt, state, step=step, allocate_missing=True)  # the optimizer has no moments yet
        self.restore_optimizer(state["optim"])
        self.step = self.saved_step = state["step"]
        self.batches.restore(state["data"])
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        return loaded.step

    def restore_optimizer(self, state: dict[str, Any]) -> None:
        self.opt.load_state_dict(state)

    def save(self, blocking: bool) -> None:
        if self.saved_step == self.step:  # saved already (maybe still being written)
            if blocking:
                ckpt.wait_for_saves()
            return
        # The steps reported so far reach telemetry first: once the scheduler counts this checkpoint it may end
        # the run at once (a suspend asked for), and samples still buffered would be lost with it.
        hfai.telemetry.flush()
        ckpt.save(self.a.ckpt, self.state(), step=self.step, keep=self.a.keep, blocking=blocking)
        self.saved_step = self.step

    def train_step(self) -> float:
        x, y = self.batches.next(self.a.batch * self.r.world, self.r.rank, self.r.world)
        loss = self.ddp(x, y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.step += 1
        return float(loss.item())

    def suspend_asked(self) -> bool:
        """Whether the scheduler asked to suspend: only rank 0 is told, so it tells the others."""
        asked = self.r.rank == 0 and hfai_client.receive_suspend_command()  # global rank 0 asks, once
        flag = torch.tensor([1 if asked else 0])
        if self.r.world > 1:
            dist.broadcast(flag, src=0)
        return bool(flag.item())


class Progress:
    """Rank 0's account of the run: a JSON line per step (``--metrics``), the task's telemetry (loss every step,
    tokens/s every ``--log-every`` steps: what the dashboard draws) and a line on stdout every ``--log-every``."""

    def __init__(self, a: argparse.Namespace, r: Ranks) -> None:
        self.on = r.rank == 0
        self.every = a.log_every
        self.log = open(a.metrics, "a") if a.metrics and self.on else None  # noqa: SIM115
        self.tokens = a.batch * r.world * a.context
        self.started = time.perf_counter()

    def step(self, step: int, loss: float) -> None:
        if not self.on:
            return
        if self.log is not None:
            self.log.write(json.dumps({"step": step, "loss": loss}) + "\n")
            self.log.flush()
        hfai.telemetry.report(step=step, loss=loss)  # buffered and sent in the background: never blocks
        if step % self.every == 0:
            rate = self.tokens * self.every / (time.perf_counter() - self.started)
            print(f"step {step} loss {loss:.4f} tokens/s {rate:.0f}", flush=True)
            hfai.telemetry.report(step=step, tokens_per_s=rate)
            self.started = time.perf_counter()


class Steps(Protocol):
    """What ``run`` drives: a trainer of this file or of its variants (pipeline, FSDP)."""

    step: int

    def train_step(self) -> float: ...
    def save(self, blocking: bool) -> None: ...
    def suspend_asked(self) -> bool: ...


def run(t: Steps, a: argparse.Namespace, r: Ranks, progress: Progress) -> None:
    """Train until ``--steps``: a checkpoint every ``--ckpt-every`` steps, and at a suspend (then ``go_suspend``)."""
    while t.step < a.steps:
        if t.suspend_asked():
            t.save(blocking=True)  # every rank's slice written, rank 0 committed (and reported) it
            if r.world > 1:
                dist.barrier()
            if r.rank == 0:
                print(f"suspending at step {t.step}", flush=True)
                hfai_client.go_suspend()  # does not return: the agent stops the run
            while True:
                time.sleep(1)
        loss = t.train_step()
        progress.step(t.step, loss)
        if a.ckpt_every and t.step % a.ckpt_every == 0:
            t.save(blocking=False)
    t.save(blocking=True)
    if r.world > 1:
        dist.barrier()
    if r.rank == 0:
        print(f"done at step {t.step}", flush=True)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    r = ranks_from_env(dict(os.environ))
    if r.world > 1:
        dist.init_process_group(a.backend, rank=r.rank, world_size=r.world)
    t = Trainer(a, r)
    resumed = t.resume()
    if r.rank == 0:
        print(f"rank 0 of {r.world}: " + (f"resumed from step {resumed}" if resumed is not None else "from scratch"))
    run(t, a, r, Progress(a, r))
    if r.world > 1:
        t.ddp.reducer.stop()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
