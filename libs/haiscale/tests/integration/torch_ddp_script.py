"""A training script written for torch DDP on gloo, as in torch's tutorials, run with torchrun.

The one line changed from the torch version is the import of ``DistributedDataParallel``: the test runs it
as it is and checks that it trains like one process on the global batch.
Usage: ``torchrun --standalone --nproc-per-node 2 torch_ddp_script.py OUT.pt`` (or any launcher that sets
torch's MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE)
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from haiscale.ddp import DistributedDataParallel as DDP  # was: from torch.nn.parallel import ...

EPOCHS, BATCH, LR = 2, 4, 0.05


def dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(32, 5, generator=g)
    return TensorDataset(x, x @ torch.randn(5, 2, generator=g) + 0.1 * torch.randn(32, 2, generator=g))


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ddp_model = DDP(model())
    data = dataset()
    sampler = DistributedSampler(data, shuffle=False)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=LR)
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp_model(x), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(ddp_model.parameters(), max_norm=1.0)
            optimizer.step()
    if rank == 0:
        torch.save(ddp_model.module.state_dict(), out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
