"""torch's DistributedDataParallel, unchanged, on the hfreduce group, against single-process training.

Every rank trains its shard of each global batch; every rank also replays the whole training in one process
on the whole global batch (the same initial weights, the same batches): the parameters must end the same.
"""

from __future__ import annotations

import contextlib
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
Batches = list[tuple[torch.Tensor, torch.Tensor]]


class Net(nn.Module):
    """A small MLP; ``spare`` is a layer forward never uses (for ``find_unused_parameters``)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 3))
        self.spare = nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.body(x)
        return out


def model() -> Net:
    torch.manual_seed(0)
    return Net()


def batches(world: int, micro: int) -> Batches:
    """Per step, ``micro`` micro-batches of ``PER_RANK`` rows per rank, rank-major within a micro-batch."""
    gen = torch.Generator().manual_seed(1)
    rows = world * PER_RANK * micro
    return [(torch.randn(rows, 8, generator=gen), torch.randn(rows, 3, generator=gen)) for _ in range(STEPS)]


def train(
    net: nn.Module, data: list[tuple[torch.Tensor, torch.Tensor]], rank: int | None, world: int, micro: int
) -> None:
    """SGD; a step accumulates ``micro`` micro-batches (all but the last under ``no_sync`` with DDP). Single
    process (``rank`` None): one mean over the whole global batch of the step."""
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    for xs, ys in data:
        opt.zero_grad()
        if rank is None:
            nn.functional.mse_loss(net(xs), ys).backward()
        else:
            for m in range(micro):
                rows = slice((m * world + rank) * PER_RANK, (m * world + rank + 1) * PER_RANK)
                sync = m == micro - 1 or not isinstance(net, DistributedDataParallel)
                with contextlib.nullcontext() if sync else net.no_sync():
                    (nn.functional.mse_loss(net(xs[rows]), ys[rows]) / micro).backward()
        opt.step()


def max_diff(a: nn.Module, b: nn.Module) -> float:
    return max(float((p - q).detach().abs().max()) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def hook(group: Any, world: int) -> Any:
    """A comm hook that allreduces each bucket through ``get_future`` (what torch's own hooks do)."""

    def allreduce_mean(state, bucket):  # type: ignore[no-untyped-def]  # DDP rejects string annotations
        work = dist.all_reduce(bucket.buffer(), group=group, async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0].div_(world))

    return allreduce_mean


VARIANTS = {  # name: (micro-batches per step, comm hook, find_unused_parameters)
    "default": (1, False, True),
    "comm_hook": (1, True, True),
    "no_sync": (2, False, True),
}


def train_and_compare(group: Any, rank: int, world: int) -> dict[str, Any]:
    """Each variant's largest parameter difference from single-process training. ``spare`` is unused in all
    of them (``find_unused_parameters=True``): it must come out unchanged, as in the reference."""
    report: dict[str, Any] = {"tolerance": TOLERANCE}
    for name, (micro, with_hook, unused) in VARIANTS.items():
        data = batches(world, micro)
        reference = model()
        train(reference, data, None, world, micro)
        # small buckets: several allreduces per backward, overlapping it
        ddp = DistributedDataParallel(model(), process_group=group, bucket_cap_mb=0.002, find_unused_parameters=unused)
        if with_hook:
            ddp.register_comm_hook(None, hook(group, world))
        train(ddp, data, rank, world, micro)
        report[name] = max_diff(ddp.module, reference)
        report[name + " spare moved"] = float((ddp.module.spare.weight - model().spare.weight).detach().abs().max())
    return report
