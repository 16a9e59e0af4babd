"""One rank of a haiscale DDP test, run as its own process: ``python ddp_worker.py SCENARIO OUT_JSON``.

The launcher sets torch's variables (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE) and FF_HFREDUCE_NODE_RANK
(the simulated node). The worker calls ``init_process_group("gloo")`` like any torch script, wraps models
with haiscale DDP, and reports what the test asserts on. Every rank also trains the same model on the
whole global batch in one process (the reference) and reports how far its DDP parameters are from it.
"""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import hashlib
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from haiscale.ddp import DistributedDataParallel

STEPS = 3
SHARD = 4  # samples per rank and micro-batch
BUCKET_CAP_MB = 0.002  # about 2 KiB: several buckets even for these small models


class Net(torch.nn.Module):
    """A small MLP with a branch some ranks skip, a layer nobody uses, and buffers of two dtypes."""

    def __init__(self, seed: int, *, extras: bool = False) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.body = torch.nn.Sequential(
            torch.nn.Linear(6, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh()
        )
        self.head = torch.nn.Linear(32, 3)
        self.branch = torch.nn.Linear(32, 3)
        self.never = torch.nn.Linear(2, 2)
        self.register_buffer("seen", torch.full((3,), seed, dtype=torch.int64))
        self.register_buffer("scale", torch.tensor([1.0 + seed]))
        for layer in (self.branch, self.never):
            layer.requires_grad_(extras)  # only the "unused" scenario trains them

    def forward(self, x: torch.Tensor, use_branch: bool = False) -> torch.Tensor:
        h = self.body(x)
        out = self.head(h)
        return out + self.branch(h) if use_branch else out


def batch(step: int, micro: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of a step and micro-batch (every rank can make it; rank r trains on rows r)."""
    g = torch.Generator().manual_seed(1000 * step + micro)
    return torch.randn(world, SHARD, 6, generator=g), torch.randn(world, SHARD, 3, generator=g)


def uses_branch(scenario: str, rank: int, step: int) -> bool:
    return scenario == "unused" and (rank + step) % 2 == 0


def shard_loss(model: Callable[..., torch.Tensor], x: torch.Tensor, y: torch.Tensor, branch: bool) -> torch.Tensor:
    return torch.nn.functional.mse_loss(model(x, use_branch=branch), y)


class Momentum:
    """SGD with momentum, as torch.optim.SGD(lr, momentum) computes it (a parameter without a gradient is
    skipped). Written out because torch.optim's first use imports torch._dynamo: 3-12 s per process here."""

    def __init__(self, params: Any, lr: float = 0.1, momentum: float = 0.9) -> None:
        self.params = list(params)
        self.lr, self.momentum = lr, momentum
        self.bufs: dict[int, torch.Tensor] = {}

    @torch.no_grad()
    def step(self) -> None:
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            buf = self.bufs.get(i)
            self.bufs[i] = p.grad.clone() if buf is None else buf.mul_(self.momentum).add_(p.grad)
            p.add_(self.bufs[i], alpha=-self.lr)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.zero_()


def train_reference(scenario: str, world: int, micro: int) -> Net:
    """Single-process training on the global batch: the loss is the mean of the shards' losses."""
    net = Net(seed=100, extras=scenario == "unused")
    opt = Momentum(net.parameters())
    for step in range(STEPS):
        for m in range(micro):
            x, y = batch(step, m, world)
            losses = [shard_loss(net, x[r], y[r], uses_branch(scenario, r, step)) for r in range(world)]
            (torch.stack(losses).mean() / micro).backward()
        opt.step()
        opt.zero_grad()
    return net


def train_ddp(scenario: str, rank: int, world: int) -> dict[str, Any]:
    # different on every rank: DDP must start everyone from rank 0's values
    net = Net(seed=100 + rank, extras=scenario == "unused")
    # one scenario passes its own process group (all ranks, new_group): its store forms the hfreduce group
    group = dist.new_group(list(range(world))) if scenario == "after_backward" else None
    ddp = DistributedDataParallel(
        net,
        process_group=group,
        bucket_cap_mb=BUCKET_CAP_MB,
        find_unused_parameters=scenario == "unused",
        gradient_as_bucket_view=scenario != "copy_grads",
        overlap=scenario != "after_backward",
    )
    report: dict[str, Any] = {"buckets": len(ddp.reducer.buckets), "seen": net.seen.tolist()}
    report["scale"] = net.scale.tolist()
    opt = Momentum(ddp.parameters())
    micro = 2 if scenario == "no_sync" else 1
    before = ddp.reducer.group.counters()
    for step in range(STEPS):
        for m in range(micro):
            x, y = batch(step, m, world)
            last = m == micro - 1
            with contextlib.nullcontext() if last else ddp.no_sync():
                loss = shard_loss(ddp, x[rank], y[rank], uses_branch(scenario, rank, step)) / micro
                loss.backward()
        if scenario == "plain":
            report.setdefault("grads_are_views", []).append(_grads_are_views(ddp))
        opt.step()
        opt.zero_grad(set_to_none=scenario != "copy_grads")
    after = ddp.reducer.group.counters()
    # registered buckets: nothing copied in or out of the user's buffers, only sent, received and reduced
    report["copied_bytes"] = after.copied_in - before.copied_in + after.copied_out - before.copied_out
    report["moved_bytes"] = after.sent - before.sent + after.reduce_read - before.reduce_read
    report["never_grad_is_none"] = all(p.grad is None for p in net.never.parameters())
    reference = train_reference(scenario, world, micro)
    report["max_abs_diff"] = max(
        float((a.detach() - b.detach()).abs().max())
        for a, b in zip(net.parameters(), reference.parameters(), strict=True)
    )
    report["digest"] = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in net.parameters())).hexdigest()
    report["state_keys_prefixed"] = all(k.startswith("module.") for k in ddp.state_dict())
    ddp.load_state_dict(reference.state_dict())  # the bare model's keys load too
    report["loaded_bare"] = all(
        torch.equal(a, b) for a, b in zip(net.parameters(), reference.parameters(), strict=True)
    )
    ddp.reducer.stop()
    return report


def _grads_are_views(ddp: DistributedDataParallel) -> bool:
    reducer = ddp.reducer
    return all(
        p.grad is not None and p.grad.data_ptr() == v.data_ptr()
        for p, v in zip(reducer.params, reducer.views, strict=True)
    )


def scenario_train(rank: int, world: int) -> dict[str, Any]:
    names = ("plain", "no_sync", "unused", "copy_grads", "after_backward")
    return {name: train_ddp(name, rank, world) for name in names}


def scenario_kill(rank: int, world: int) -> dict[str, Any]:
    """Rank VICTIM SIGKILLs itself in the middle of its second backward; the others report what they saw."""
    victim = int(os.environ["TEST_VICTIM"])
    net = Net(seed=100)
    ddp = DistributedDataParallel(net, bucket_cap_mb=BUCKET_CAP_MB)
    for step in range(2):
        x, y = batch(step, 0, world)
        out = ddp(x[rank])
        if step == 1 and rank == victim:
            hidden = net.body[0].weight  # its gradient comes late in backward, after the head's buckets went out
            hidden.register_hook(lambda g: os.kill(os.getpid(), signal.SIGKILL))
        start = time.monotonic()
        try:
            torch.nn.functional.mse_loss(out, y[rank]).backward()
        except Exception as exc:  # reported to the test, which asserts on the type
            return {
                "step": step,
                "error": type(exc).__name__,
                "message": str(exc),
                "culprit": getattr(exc, "rank", None),
                "elapsed_s": time.monotonic() - start,
            }
    return {"error": None}


def scenario_mismatch(rank: int, world: int) -> dict[str, Any]:
    """Rank 1's model has one layer of another width: every rank refuses at construction, naming it."""
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2 if rank != 1 else 3))
    try:
        DistributedDataParallel(net)
    except RuntimeError as exc:
        return {"error": type(exc).__name__, "message": str(exc)}
    return {"error": None}


def scenario_recreate(rank: int, world: int) -> dict[str, Any]:
    """Three times: destroy the default group and make it again (the store, which torch keeps for the process,
    is the same each time), wrap, one step, ``reducer.stop()``.

    The group is made on backend "hfreduce", which takes a fresh key prefix each time: gloo made again on the
    same store may itself read its first group's keys.

    The env:// store's server lives in rank 0's store object. The hfreduce backend keeps the server of every store
    it joins through for the process; ``main``'s gloo group is torch's alone, and destroying it would free the server
    while rank 1, through its own destroy, may already have connected its next store to it: rank 1's rendezvous
    then fails and rank 0's new server waits for it (torch's timeout, 30 min by default). So this script keeps
    gloo's store, as any torch script that makes its default group again must, and bounds torch's waits.
    """
    kept = dist.distributed_c10d._get_default_store()  # noqa: F841 (held, not used)
    grads = []
    for _ in range(3):
        dist.barrier()  # no rank tears its side of the group down while another is still making it
        dist.destroy_process_group()
        dist.init_process_group("hfreduce", timeout=datetime.timedelta(seconds=60))
        ddp = DistributedDataParallel(Net(seed=100), bucket_cap_mb=BUCKET_CAP_MB)
        x, y = batch(0, 0, world)
        torch.nn.functional.mse_loss(ddp(x[rank]), y[rank]).backward()
        grads.append(float(sum(p.grad.double().sum() for p in ddp.parameters() if p.grad is not None)))
        ddp.reducer.stop()
    return {"error": None, "grads": grads}


SCENARIOS = {
    "train": scenario_train,
    "kill": scenario_kill,
    "mismatch": scenario_mismatch,
    "recreate": scenario_recreate,
}


def main() -> None:
    scenario, out = sys.argv[1], sys.argv[2]
    stacks_after = os.environ.get("TEST_STACKS_AFTER_S")
    if stacks_after:  # a hung rank leaves every thread's stack for the launcher to show
        stacks = open(f"{out}.stacks", "w")  # noqa: SIM115 (open until the process exits)
        faulthandler.dump_traceback_later(float(stacks_after), file=stacks)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        result = SCENARIOS[scenario](rank, world)
    except Exception as exc:  # the test shows it
        result = {"crash": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    with open(out, "w") as f:
        json.dump(result, f)
    if scenario == "kill":
        os._exit(0)  # a peer is gone: gloo's teardown would wait for it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
