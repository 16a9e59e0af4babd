"""Training steps/s: haiscale DDP vs torch DDP on backend "hfreduce" vs torch DDP on gloo, interleaved.

Every rank process calls ``init_process_group("gloo")`` and holds one copy of the model per contender (same
initial values, same batch): haiscale DDP (``haiscale.ddp.DistributedDataParallel``, hfreduce group derived
from the gloo group), torch DDP over ``new_group(backend="hfreduce")`` (skipped with a message where that
backend is not available), torch DDP over the gloo group (torch's defaults: 25 MiB buckets, grads copied
into them). Per round each contender runs ``--steps`` training steps (forward, backward, SGD step,
zero_grad) after a gloo barrier, in an order that rotates from round to round; time = max over ranks.
haiscale DDP runs twice per round: reducing each bucket as soon as it is full ("overlap", the default) and
all buckets after backward ("after"), which is the overlap's gain. Ratios are medians over rounds of per-round
ratios (t_gloo / t_haiscale, ...). Nodes are simulated on this machine (FF_HFREDUCE_NODE_RANK); every rank
runs torch with one thread.

Two bounds run in the same rounds: "local", the same steps on an unwrapped copy of the model (no
communication at all), and at 2 nodes "wire", the gradient's bytes exchanged between the two nodes and nothing
else (each rank swaps its 1/local-ranks slice of every gradient byte with the same local rank of the other
node over loopback TCP, as hfreduce's trees lay it out: ``_hfreduce_common.WireFloor``; the least any
allreduce at 2 nodes moves across). On saturated cores no schedule runs a step in less CPU than local + wire,
so torch-gloo's CPU / (local + wire) is the ceiling of any DDP's CPU ratio against it here ("bound" line).

Models: "mlp", a wide MLP (``--mlp-layers`` square layers of ``--mlp-width``, about 50 M parameters by default)
on a small batch, communication-bound; "gpt", a tiny GPT (examples/gpt/model.py) on byte sequences.

    .venv/bin/python bench/haiscale_ddp.py --layouts 2x1,2x2 --models mlp,gpt --rounds 7
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing as mp
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _hfreduce_common import WireFloor, free_ports, loopback_config, run_ranks

REPO = Path(__file__).resolve().parent.parent
CONTENDERS = ("haiscale", "haiscale_after", "torch_hfreduce", "torch_gloo")
BOUNDS = ("local", "wire")  # no communication; the gradient's bytes across and nothing else (2 nodes)


def build_model(name: str, args: argparse.Namespace) -> tuple[Any, Any]:
    """The model (seeded: the same on every rank and for every contender) and a function computing its loss."""
    import torch

    torch.manual_seed(0)
    if name == "mlp":
        layers: list[Any] = []
        for _ in range(args.mlp_layers):
            layers += [torch.nn.Linear(args.mlp_width, args.mlp_width), torch.nn.ReLU()]
        mlp = torch.nn.Sequential(*layers[:-1])
        g = torch.Generator().manual_seed(1)
        x = torch.randn(args.mlp_batch, args.mlp_width, generator=g)
        y = torch.randn(args.mlp_batch, args.mlp_width, generator=g)
        return mlp, lambda model: torch.nn.functional.mse_loss(model(x), y)
    sys.path.insert(0, str(REPO / "examples" / "gpt"))
    from model import GPTConfig, TinyGPT  # examples/gpt/model.py

    cfg = GPTConfig(context=args.gpt_context, dim=args.gpt_dim, heads=4, layers=args.gpt_layers, dropout=0.0)
    gpt = TinyGPT(cfg)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 256, (args.gpt_batch, cfg.context + 1), generator=g)
    return gpt, lambda model: model(tokens[:, :-1], tokens[:, 1:])


def rank_main(
    rank: int,
    world: int,
    num_local: int,
    ports: tuple[int, ...],
    model_name: str,
    args: argparse.Namespace,
    queue: Any,
) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(ports[0]),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        FF_HFREDUCE_NODE_RANK=str(rank // num_local),
        FF_HFREDUCE_TIMEOUT_S="120",
        GLOO_SOCKET_IFNAME="lo",
    )
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as TorchDDP

    from haiscale.ddp import DistributedDataParallel as HaiDDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    models: dict[str, Any] = {}
    model, loss_of = build_model(model_name, args)
    models["haiscale"] = HaiDDP(model)
    models["haiscale_after"] = models["haiscale"]  # the same wrapper, reducing after backward
    hf_group, skipped = _hfreduce_backend_group(dist)
    if hf_group is not None:
        models["torch_hfreduce"] = TorchDDP(build_model(model_name, args)[0], process_group=hf_group)
    models["torch_gloo"] = TorchDDP(build_model(model_name, args)[0])
    models["local"] = build_model(model_name, args)[0]
    optimizers = {k: torch.optim.SGD(m.parameters(), lr=1e-4) for k, m in models.items()}
    wire = _wire_bound(dist, rank, world, num_local, ports, 4 * sum(p.numel() for p in model.parameters()))
    kinds = [k for k in (*CONTENDERS, *BOUNDS) if k in models or (k == "wire" and wire is not None)]
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        queue.put(("info", params, len(models["haiscale"].reducer.buckets), skipped))

    def steps(kind: str) -> tuple[float, float]:
        """Wall seconds and this process's CPU seconds (every thread: hfreduce's and gloo's too)."""
        models["haiscale"].reducer.overlap = kind != "haiscale_after"
        dist.barrier()
        start, cpu = time.perf_counter(), time.process_time()
        if kind == "wire":
            assert wire is not None
            for _ in range(args.steps):
                wire[1]()
        else:
            ddp, opt = models[kind], optimizers[kind]
            for _ in range(args.steps):
                loss_of(ddp).backward()
                opt.step()
                opt.zero_grad()
        return time.perf_counter() - start, time.process_time() - cpu

    for kind in kinds:  # warm-up: first-touch of buffers, torch's lazy initialisation
        steps(kind)
    for r in range(args.rounds):
        order = kinds[r % len(kinds) :] + kinds[: r % len(kinds)]
        took = {kind: steps(kind) for kind in order}
        worst = torch.tensor([took[k][0] for k in kinds], dtype=torch.float64)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        cpu = torch.tensor([took[k][1] for k in kinds], dtype=torch.float64)
        dist.all_reduce(cpu)
        if rank == 0:
            queue.put(
                ("round", dict(zip(kinds, worst.tolist(), strict=True)), dict(zip(kinds, cpu.tolist(), strict=True)))
            )
    models["haiscale"].reducer.stop()
    if wire is not None:
        wire[0].close()
    dist.destroy_process_group()


def _wire_bound(
    dist: Any, rank: int, world: int, num_local: int, ports: tuple[int, ...], grad_bytes: int
) -> tuple[WireFloor, Callable[[], None]] | None:
    """At 2 nodes: the wire floor's links and one step's exchange (this rank's slice of the gradient's bytes, as
    hfreduce's trees send them); None at other layouts."""
    node, local = divmod(rank, num_local)
    if world // num_local != 2:
        return None
    wire = WireFloor(node, ports[1 + local], loopback_config(node, local, 2, num_local, ports[0]), dist)
    s0, s1 = grad_bytes * local // num_local, grad_bytes * (local + 1) // num_local
    out, into = bytearray(s1 - s0), bytearray(s1 - s0)
    return wire, functools.partial(wire.exchange, out, into)


def _hfreduce_backend_group(dist: Any) -> tuple[Any, str]:
    try:
        import hfreduce.distributed  # noqa: F401  (registers the backend where it exists)

        return dist.new_group(backend="hfreduce"), ""
    except Exception as exc:  # the backend is another helper's work; absent, the column is skipped
        return None, f"torch DDP on backend 'hfreduce' skipped: {type(exc).__name__}: {exc}"


def run(nodes: int, num_local: int, model_name: str, args: argparse.Namespace) -> None:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    world = nodes * num_local
    ports = free_ports(1 + num_local)  # torch's store, then a wire-bound port per local rank
    procs = [
        ctx.Process(target=rank_main, args=(rank, world, num_local, ports, model_name, args, queue))
        for rank in range(world)
    ]
    got = run_ranks(procs, queue, 1 + args.rounds, timeout_s=1800)
    _, params, buckets, skipped = next(g for g in got if g[0] == "info")
    rounds = [g[1] for g in got if g[0] == "round"]
    cpu = [g[2] for g in got if g[0] == "round"]
    report(f"{nodes}x{num_local}", model_name, params, buckets, skipped, rounds, cpu, args.steps)


def report(
    layout: str,
    model: str,
    params: int,
    buckets: int,
    skipped: str,
    rounds: list[dict[str, float]],
    cpu: list[dict[str, float]],
    steps: int,
) -> None:
    print(f"\n# {model} at {layout}: {params / 1e6:.1f} M parameters, haiscale buckets {buckets}, {steps} steps/round")
    if skipped:
        print(f"  {skipped}")
    kinds = list(rounds[0])
    print("  round  " + "  ".join(f"{k:>15}" for k in kinds) + "   (steps/s)")
    for i, r in enumerate(rounds):
        print(f"  {i:5d}  " + "  ".join(f"{steps / r[k]:15.2f}" for k in kinds))
    med = {k: statistics.median(steps / r[k] for r in rounds) for k in kinds}
    print("  median " + "  ".join(f"{med[k]:15.2f}" for k in kinds))
    cpu_ms = {k: statistics.median(1e3 * c[k] / steps for c in cpu) for k in kinds}
    print("  cpu ms " + "  ".join(f"{cpu_ms[k]:15.0f}" for k in kinds) + "   (per step, all ranks, median)")

    def ratio(num: str, den: str) -> float:
        return statistics.median(r[num] / r[den] for r in rounds)

    print(f"MEDIAN RATIO {model} {layout}: haiscale / torch-gloo {ratio('torch_gloo', 'haiscale'):.2f}x", end="")
    if "torch_hfreduce" in kinds:
        print(f", torch-hfreduce / torch-gloo {ratio('torch_gloo', 'torch_hfreduce'):.2f}x", end="")
        print(f", haiscale / torch-hfreduce {ratio('torch_hfreduce', 'haiscale'):.2f}x", end="")
    print(f", overlap gain (after-backward / overlapped) {ratio('haiscale_after', 'haiscale'):.2f}x")
    cpu_ratio = statistics.median(c["torch_gloo"] / c["haiscale"] for c in cpu)
    print(f"MEDIAN CPU RATIO {model} {layout}: torch-gloo CPU / haiscale CPU {cpu_ratio:.2f}x")
    if "wire" in kinds:
        floor_wall = statistics.median(r["torch_gloo"] / (r["local"] + r["wire"]) for r in rounds)
        floor_cpu = statistics.median(c["torch_gloo"] / (c["local"] + c["wire"]) for c in cpu)
        share = statistics.median((c["local"] + c["wire"]) / c["haiscale"] for c in cpu)
        print(
            f"BOUND {model} {layout}: torch-gloo / (local + wire) {floor_wall:.2f}x wall, {floor_cpu:.2f}x CPU"
            f" (the most any DDP can gain over torch-gloo here); (local + wire) CPU / haiscale CPU {share:.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layouts", default="2x1,2x2", help="nodes x local ranks, comma separated")
    parser.add_argument("--models", default="mlp,gpt", help="mlp, gpt or both")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=2, help="training steps per contender and round")
    parser.add_argument("--mlp-width", type=int, default=4096)
    parser.add_argument("--mlp-layers", type=int, default=3)
    parser.add_argument("--mlp-batch", type=int, default=8)
    parser.add_argument("--gpt-dim", type=int, default=128)
    parser.add_argument("--gpt-layers", type=int, default=4)
    parser.add_argument("--gpt-context", type=int, default=64)
    parser.add_argument("--gpt-batch", type=int, default=4)
    args = parser.parse_args()
    for model_name in args.models.split(","):
        if model_name == "gpt" and not (REPO / "examples" / "gpt" / "model.py").exists():
            print("\n# gpt skipped: examples/gpt/model.py is not there")
            continue
        for layout in args.layouts.split(","):
            nodes, num_local = (int(v) for v in layout.split("x"))
            run(nodes, num_local, model_name, args)


if __name__ == "__main__":
    main()
