"""torch's DistributedDataParallel, unchanged, on the hfreduce group, against single-process training.

Every rank trains its shard of each global batch; every rank also replays the whole training in one process
on the whole global batch (the same initial weights, the same batches): the parameters must end the same.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

STEPS = 3
PER_RANK = 4
# fp32: DDP averages the ranks' gradients while the reference takes one mean over the global batch, so the
# two differ by a few roundings per step; 1e-5 absolute on O(0.1) weights is a few hundred ulps of room
TOLERANCE = 1e-5


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 3))


def batches(world: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    return [
        (torch.randn(world * PER_RANK, 8, generator=gen), torch.randn(world * PER_RANK, 3, generator=gen))
        for _ in range(STEPS)
    ]


def train(net: nn.Module, data: list[tuple[torch.Tensor, torch.Tensor]], rank: int | None) -> list[float]:
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    losses = []
    shard = slice(None) if rank is None else slice(rank * PER_RANK, (rank + 1) * PER_RANK)
    for xs, ys in data:
        x, y = xs[shard], ys[shard]
        opt.zero_grad()
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def max_diff(a: nn.Module, b: nn.Module) -> float:
    return max(float((p - q).detach().abs().max()) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def hook(group: Any, world: int) -> Any:
    """A comm hook that allreduces each bucket through ``get_future`` (what torch's own hooks do)."""

    def allreduce_mean(state, bucket):  # type: ignore[no-untyped-def]  # DDP rejects string annotations
        work = dist.all_reduce(bucket.buffer(), group=group, async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0].div_(world))

    return allreduce_mean


def train_and_compare(group: Any, rank: int, world: int) -> dict[str, Any]:
    data = batches(world)
    reference = model()
    train(reference, data, None)
    report: dict[str, Any] = {"tolerance": TOLERANCE}
    for variant in ("default", "comm_hook"):
        # small buckets: several allreduces per backward, overlapping it
        ddp = DistributedDataParallel(model(), process_group=group, bucket_cap_mb=0.002)
        if variant == "comm_hook":
            ddp.register_comm_hook(None, hook(group, world))
        train(ddp, data, rank)
        report[variant] = max_diff(ddp.module, reference)
    return report
