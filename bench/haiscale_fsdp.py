"""Training step time: haiscale FSDP vs torch FSDP (gloo, CPU) vs haiscale DDP, interleaved; and prefetch's gain.

Every rank process calls ``init_process_group("gloo")`` and holds one copy of the model per contender (same
initial values, same batch, the tiny GPT of examples/gpt/model.py, each transformer ``Block`` a unit):

- ``hs_fsdp``: ``haiscale.fsdp.FullyShardedDataParallel`` on the gloo group, its default collectives (hfreduce
  registered-buffer allreduces, hfreduce group derived from the gloo group), prefetch on;
- ``hs_fsdp_noprefetch``: the same wrapper with prefetch off (the prefetch/overlap gain);
- ``hs_fsdp_gloo``: haiscale FSDP with ``collectives="torch"``: gloo's all-gather and reduce-scatter, as torch
  FSDP uses (the implementation alone, without hfreduce);
- ``torch_fsdp``: ``torch.distributed.fsdp.FullyShardedDataParallel`` (FULL_SHARD, the same wrap policy,
  backward prefetch BACKWARD_PRE, forward prefetch on) over the gloo group;
- ``hs_ddp``: ``haiscale.ddp.DistributedDataParallel`` (replicated: the memory FSDP saves, at which cost).

Per round each contender runs ``--steps`` training steps (forward, backward, AdamW step, zero_grad) after a
barrier, in an order that rotates from round to round; time = max over ranks; CPU = user + sys of every thread,
summed over the ranks (what the load of other processes disturbs less than wall time). Ratios are medians over
rounds of per-round ratios. ``--batch 1 --context 16`` makes the step communication-bound. Nodes are simulated
on this machine (two ranks per node, FF_HFREDUCE_NODE_RANK); every rank runs torch with one thread.

    .venv/bin/python bench/haiscale_fsdp.py --worlds 2,4 --rounds 7
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _hfreduce_common import free_ports, run_ranks

REPO = Path(__file__).resolve().parent.parent
CONTENDERS = ("hs_fsdp", "hs_fsdp_noprefetch", "hs_fsdp_gloo", "torch_fsdp", "hs_ddp")


def build_model(args: argparse.Namespace) -> tuple[Any, Any, type]:
    """The tiny GPT (seeded: the same everywhere), a batch of this rank's, and its block class."""
    import torch

    sys.path.insert(0, str(REPO / "examples" / "gpt"))
    from model import Block, GPTConfig, TinyGPT  # examples/gpt/model.py

    torch.manual_seed(0)
    cfg = GPTConfig(context=args.context, dim=args.dim, heads=4, layers=args.layers, dropout=0.0)
    return TinyGPT(cfg), cfg, Block


def wrap_all(args: argparse.Namespace, dist: Any) -> dict[str, Any]:
    import torch
    from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as TorchFSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy as TorchWrapPolicy

    from haiscale.ddp import DistributedDataParallel as HaiDDP
    from haiscale.fsdp import FullyShardedDataParallel as HaiFSDP
    from haiscale.fsdp import ModuleWrapPolicy

    models: dict[str, Any] = {}
    model, _, block = build_model(args)
    models["hs_fsdp"] = HaiFSDP(model, auto_wrap_policy=ModuleWrapPolicy([block]))
    models["hs_fsdp_noprefetch"] = models["hs_fsdp"]  # the same wrapper, prefetch switched off for its turn
    model, _, block = build_model(args)
    models["hs_fsdp_gloo"] = HaiFSDP(model, auto_wrap_policy=ModuleWrapPolicy([block]), collectives="torch")
    model, _, block = build_model(args)
    models["torch_fsdp"] = TorchFSDP(
        model,
        auto_wrap_policy=TorchWrapPolicy({block}),
        sharding_strategy=ShardingStrategy.FULL_SHARD,
        backward_prefetch=BackwardPrefetch.BACKWARD_PRE,
        forward_prefetch=True,
        device_id=torch.device("cpu"),
    )
    models["hs_ddp"] = HaiDDP(build_model(args)[0])
    return models


def rank_main(rank: int, world: int, port: int, args: argparse.Namespace, queue: Any) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        FF_HFREDUCE_NODE_RANK=str(rank // 2),
        FF_HFREDUCE_TIMEOUT_S="120",
        GLOO_SOCKET_IFNAME="lo",
    )
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    models = wrap_all(args, dist)
    optimizers = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, m in models.items()}
    _, cfg, _ = build_model(args)
    g = torch.Generator().manual_seed(1 + rank)
    tokens = torch.randint(0, 256, (args.batch, cfg.context + 1), generator=g)
    if rank == 0:
        params = sum(p.numel() for p in build_model(args)[0].parameters())
        queue.put(("info", params, len(models["hs_fsdp"].units)))

    def steps(kind: str) -> tuple[float, float]:
        """Wall seconds and this process's CPU seconds (every thread: hfreduce's and gloo's too)."""
        model, opt = models[kind], optimizers[kind]
        models["hs_fsdp"].prefetch = kind != "hs_fsdp_noprefetch"
        dist.barrier()
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(args.steps):
            model(tokens[:, :-1], tokens[:, 1:]).backward()
            opt.step()
            opt.zero_grad()
        return time.perf_counter() - start, time.process_time() - cpu

    for kind in CONTENDERS:  # warm-up: lazy initialisation, first-touch, the orders prefetch follows
        steps(kind)
    for r in range(args.rounds):
        order = CONTENDERS[r % len(CONTENDERS) :] + CONTENDERS[: r % len(CONTENDERS)]
        took = {kind: steps(kind) for kind in order}
        worst = torch.tensor([took[k][0] for k in CONTENDERS], dtype=torch.float64)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        cpu = torch.tensor([took[k][1] for k in CONTENDERS], dtype=torch.float64)
        dist.all_reduce(cpu)
        if rank == 0:
            queue.put(
                (
                    "round",
                    dict(zip(CONTENDERS, worst.tolist(), strict=True)),
                    dict(zip(CONTENDERS, cpu.tolist(), strict=True)),
                )
            )
    models["hs_ddp"].reducer.stop()
    queue.close()
    queue.join_thread()  # the reports are sent by the queue's thread: flush them before leaving
    os._exit(0)  # without waiting for hfreduce's and gloo's threads


def run(world: int, args: argparse.Namespace) -> None:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    (port,) = free_ports(1)
    procs = [ctx.Process(target=rank_main, args=(rank, world, port, args, queue)) for rank in range(world)]
    got = run_ranks(procs, queue, 1 + args.rounds, timeout_s=1800)
    _, params, units = next(g for g in got if g[0] == "info")
    rounds = [g[1] for g in got if g[0] == "round"]
    cpus = [g[2] for g in got if g[0] == "round"]
    print(f"\n# tiny GPT dim {args.dim} x {args.layers} layers ({params / 1e6:.2f} M parameters, {units} units), "
          f"{world} ranks, batch {args.batch} x {args.context} per rank, {args.steps} steps/round")  # fmt: skip
    print("  round  " + "  ".join(f"{k:>18}" for k in CONTENDERS) + "   (ms/step)")
    for i, r in enumerate(rounds):
        print(f"  {i:5d}  " + "  ".join(f"{1e3 * r[k] / args.steps:18.1f}" for k in CONTENDERS))
    med = {k: statistics.median(1e3 * r[k] / args.steps for r in rounds) for k in CONTENDERS}
    print("  median " + "  ".join(f"{med[k]:18.1f}" for k in CONTENDERS))
    cpu_ms = {k: statistics.median(1e3 * c[k] / args.steps for c in cpus) for k in CONTENDERS}
    print("  cpu ms " + "  ".join(f"{cpu_ms[k]:18.1f}" for k in CONTENDERS) + "   (per step, all ranks, median)")

    def ratio(num: str, den: str, of: list[dict[str, float]] = rounds) -> float:
        return statistics.median(r[num] / r[den] for r in of)

    print(
        f"MEDIAN RATIO world {world}: haiscale FSDP vs torch FSDP {ratio('torch_fsdp', 'hs_fsdp'):.2f}x"
        f" (haiscale FSDP on gloo's collectives vs torch FSDP {ratio('torch_fsdp', 'hs_fsdp_gloo'):.2f}x)"
        f", prefetch gain (off / on) {ratio('hs_fsdp_noprefetch', 'hs_fsdp'):.2f}x"
        f", haiscale FSDP / haiscale DDP step time {ratio('hs_fsdp', 'hs_ddp'):.2f}x"
    )
    print(
        f"MEDIAN CPU RATIO world {world}: torch FSDP / haiscale FSDP {ratio('torch_fsdp', 'hs_fsdp', cpus):.2f}x"
        f", prefetch off / on {ratio('hs_fsdp_noprefetch', 'hs_fsdp', cpus):.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worlds", default="2,4", help="world sizes, comma separated (two ranks per node)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=3, help="training steps per contender and round")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args()
    for world in (int(w) for w in args.worlds.split(",")):
        run(world, args)


if __name__ == "__main__":
    main()
