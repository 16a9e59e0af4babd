"""haiscale.pipeline: 1F1B (``PipeDream``) vs ``GPipe`` throughput and peak activation memory, interleaved.

Every rank process calls ``init_process_group("gloo")``, takes its stage of one seeded MLP (``--layers`` square
layers of ``--width``, cut evenly by ``partition``) and wraps it twice, once per schedule (the same stage
module: both train the same weights in turn). Per round each schedule runs ``--steps`` training steps
(``forward_backward`` over ``--chunks`` micro-batches of a ``--batch`` batch, SGD step, zero_grad) after a gloo
barrier, in an order that alternates between rounds; time = max over ranks; it also prints the CPU time per step
(every thread, summed over the ranks), which the load of other processes disturbs less. Ratios are medians over
rounds of per-round ratios. Peak activation memory is what the engine measures each step (``model.stats``): the bytes
of the tensors autograd saved for backward (parameters excluded) plus the stage inputs held, over the
micro-batches in flight; the bench prints stage 0's (the largest under 1F1B) and the largest over stages.
Ranks run torch with one thread; ``--pp`` stages, ``--dp`` replicas (haiscale DDP over each stage's replicas
when above 1; two ranks per simulated node).

    .venv/bin/python bench/haiscale_pipeline.py --pp 2,4 --rounds 7
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time
from typing import Any

from _hfreduce_common import free_ports, run_ranks

KINDS = ("gpipe", "1f1b")


def rank_main(rank: int, world: int, pp: int, port: int, args: argparse.Namespace, queue: Any) -> None:
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

    from haiscale.ddp import DistributedDataParallel
    from haiscale.pipeline import GPipe, PipeDream, make_subgroups, partition

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    dp_group, pp_group = make_subgroups(pp_size=pp)
    torch.manual_seed(0)
    layers: list[Any] = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.GELU()]
    stage: torch.nn.Module = partition(torch.nn.Sequential(*layers), pp_group.rank(), pp)
    if dp_group.size() > 1:
        stage = DistributedDataParallel(stage, process_group=dp_group)
    models = {"gpipe": GPipe(stage, args.chunks, pp_group), "1f1b": PipeDream(stage, args.chunks, pp_group)}
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(args.batch, args.width, generator=g), torch.randn(args.batch, args.width, generator=g)

    def criterion(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(out, target) / args.chunks

    def steps(kind: str) -> tuple[float, int, float]:
        """Wall seconds, peak activation bytes, this process's CPU seconds (every thread: gloo's too)."""
        model = models[kind]
        dist.barrier()
        start, cpu, peak = time.perf_counter(), time.process_time(), 0
        for _ in range(args.steps):
            model.forward_backward(x, criterion=criterion, labels=(y,))
            with torch.no_grad():
                for p in stage.parameters():
                    if p.grad is not None:
                        p.add_(p.grad, alpha=-1e-4)
                        p.grad = None
            peak = max(peak, model.stats.peak_activation_bytes)
        return time.perf_counter() - start, peak, time.process_time() - cpu

    for kind in KINDS:  # warm-up: connections, first touch of buffers
        steps(kind)
    for r in range(args.rounds):
        order = KINDS if r % 2 == 0 else KINDS[::-1]
        took = {kind: steps(kind) for kind in order}
        worst = torch.tensor([took[k][0] for k in KINDS], dtype=torch.float64)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        cpu = torch.tensor([took[k][2] for k in KINDS], dtype=torch.float64)
        dist.all_reduce(cpu)
        peaks = [None] * world
        dist.all_gather_object(peaks, [took[k][1] for k in KINDS])
        if rank == 0:
            queue.put(("round", dict(zip(KINDS, worst.tolist(), strict=True)), peaks, cpu.tolist()))
    if isinstance(stage, DistributedDataParallel):
        stage.reducer.stop()
    dist.destroy_process_group()


def run(pp: int, args: argparse.Namespace) -> None:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    world = pp * args.dp
    (port,) = free_ports(1)
    procs = [ctx.Process(target=rank_main, args=(rank, world, pp, port, args, queue)) for rank in range(world)]
    got = run_ranks(procs, queue, args.rounds, timeout_s=1800)
    rounds = [g[1] for g in got]
    peaks = got[-1][2]  # [rank][kind]: the same every round (the shapes do not change)
    cpu = [dict(zip(KINDS, g[3], strict=True)) for g in got]
    samples = args.batch * args.dp * args.steps
    print(f"\n# pp={pp} x dp={args.dp}: {args.layers} x Linear({args.width}) + GELU, batch {args.batch} per replica,")
    print(f"  {args.chunks} micro-batches, {args.steps} steps per round; samples/s (global)")
    print("  round  " + "  ".join(f"{k:>10}" for k in KINDS))
    for i, r in enumerate(rounds):
        print(f"  {i:5d}  " + "  ".join(f"{samples / r[k]:10.1f}" for k in KINDS))
    med = {k: statistics.median(samples / r[k] for r in rounds) for k in KINDS}
    print("  median " + "  ".join(f"{med[k]:10.1f}" for k in KINDS))
    cpu_ms = {k: statistics.median(1e3 * c[k] / args.steps for c in cpu) for k in KINDS}
    print("  cpu ms " + "  ".join(f"{cpu_ms[k]:10.0f}" for k in KINDS) + "   (per step, all ranks, median)")
    ratio = statistics.median(r["gpipe"] / r["1f1b"] for r in rounds)
    cpu_ratio = statistics.median(c["gpipe"] / c["1f1b"] for c in cpu)
    stage0 = peaks[0]
    largest = [max(p[i] for p in peaks) for i in range(len(KINDS))]
    print(f"  peak activation bytes, stage 0: gpipe {stage0[0]:,}  1f1b {stage0[1]:,}")
    print(f"  peak activation bytes, largest stage: gpipe {largest[0]:,}  1f1b {largest[1]:,}")
    ideal = min(pp, args.chunks) / args.chunks
    print(
        f"MEDIAN RATIO pp={pp} dp={args.dp} m={args.chunks}: 1F1B / GPipe throughput {ratio:.2f}x "
        f"(CPU per step GPipe / 1F1B {cpu_ratio:.2f}x), "
        f"peak activation memory (stage 0) {stage0[1] / stage0[0]:.2f}x (ideal {ideal:.2f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pp", default="2,4", help="stages per pipeline, comma separated")
    parser.add_argument("--dp", type=int, default=1, help="replicas (haiscale DDP across them when above 1)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=2, help="training steps per schedule and round")
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--batch", type=int, default=128, help="samples per replica and step")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    args = parser.parse_args()
    for pp in (int(v) for v in args.pp.split(",")):
        run(pp, args)


if __name__ == "__main__":
    main()
