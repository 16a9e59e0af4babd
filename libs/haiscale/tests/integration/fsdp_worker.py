"""One rank of a haiscale FSDP test, run as its own process: ``python fsdp_worker.py SCENARIO OUT_JSON``.

The launcher sets torch's variables (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), FF_HFREDUCE_NODE_RANK (the
simulated node), TEST_BACKEND (the process group's: ``hfreduce`` or ``gloo``) and TEST_COLLECTIVES (FSDP's:
``hfreduce``, registered-buffer allreduces; ``torch``, the process group's all-gather and reduce-scatter).
Every rank also trains the same model on the whole global batch in one process (the reference) and reports how
far its FSDP parameters are from it.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import hfreduce.distributed  # noqa: F401  (registers the "hfreduce" backend)
from haiscale import checkpoint as ckpt
from haiscale.ddp import DistributedDataParallel
from haiscale.fsdp import FullyShardedDataParallel, MixedPrecision, ModuleWrapPolicy, SizeWrapPolicy
from haiscale.fsdp.comm import HFReduceComm, Pending

GLOBAL_BATCH = 8  # rows per step, split evenly over the ranks (1, 2 or 4)
WIDTH = 24
STEPS = 4
COLLECTIVES = os.environ.get("TEST_COLLECTIVES", "hfreduce")  # haiscale FSDP's collectives= option


class Block(torch.nn.Module):
    """A residual MLP block: the unit of wrapping."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 2 * width)
        self.down = torch.nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.tanh(self.up(self.norm(x))))


class Net(torch.nn.Module):
    """Input layer, blocks, head; the input and head stay in the root unit. A buffer counts steps."""

    def __init__(self, seed: int, *, width: int = WIDTH, blocks: int = 3) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.inp = torch.nn.Linear(6, width)
        self.blocks = torch.nn.Sequential(*[Block(width) for _ in range(blocks)])
        self.head = torch.nn.Linear(width, 3)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64) + seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.inp(x)))


class Momentum:
    """SGD with momentum as torch.optim.SGD computes it, with torch.optim's ``state``/``param_groups`` shape.
    Written out because torch.optim's first step imports torch._dynamo: seconds per process here."""

    def __init__(self, params: Any, lr: float = 0.05, momentum: float = 0.9) -> None:
        self.param_groups = [{"params": list(params), "lr": lr, "momentum": momentum}]
        self.state: dict[torch.Tensor, dict[str, Any]] = {}

    @torch.no_grad()
    def step(self) -> None:
        group = self.param_groups[0]
        for p in group["params"]:
            if p.grad is None:
                continue
            st = self.state.setdefault(p, {})
            buf = st.get("momentum_buffer")
            if buf is None:
                st["momentum_buffer"] = buf = p.grad.detach().clone()
            else:
                buf.mul_(group["momentum"]).add_(p.grad)
            p.add_(buf, alpha=-group["lr"])

    def zero_grad(self) -> None:
        for p in self.param_groups[0]["params"]:
            p.grad = None


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(GLOBAL_BATCH, 6, generator=g), torch.randn(GLOBAL_BATCH, 3, generator=g)


def rows(rank: int, world: int) -> slice:
    per = GLOBAL_BATCH // world
    return slice(rank * per, (rank + 1) * per)


def loss_of(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(out.float(), y)


def train_reference(steps: int) -> Net:
    """One process, the whole global batch per step."""
    net = Net(seed=100)
    opt = Momentum(net.parameters())
    for step in range(steps):
        x, y = batch(step)
        loss_of(net(x), y).backward()
        opt.step()
        opt.zero_grad()
    return net


def wrap(net: Net, **options: Any) -> FullyShardedDataParallel:
    return FullyShardedDataParallel(net, auto_wrap_policy=ModuleWrapPolicy([Block]), collectives=COLLECTIVES, **options)


def train_fsdp(fsdp: FullyShardedDataParallel, opt: Momentum | None, steps: range, rank: int, world: int) -> list[bool]:
    """Train; return, per step, whether every shard had its gradient when backward returned."""
    had_grads = []
    for step in steps:
        x, y = batch(step)
        loss_of(fsdp(x[rows(rank, world)]), y[rows(rank, world)]).backward()
        had_grads.append(all(u.shard.grad is not None for u in fsdp.units))
        if opt is not None:
            opt.step()
            opt.zero_grad()
    return had_grads


def max_diff(state: dict[str, torch.Tensor], reference: torch.nn.Module) -> float:
    ref = reference.state_dict()
    return max(float((state[k].float() - v.float()).abs().max()) for k, v in ref.items() if v.is_floating_point())


def digest(state: dict[str, torch.Tensor]) -> str:
    return hashlib.sha256(b"".join(v.detach().float().numpy().tobytes() for v in state.values())).hexdigest()


# ----- scenarios -----


def scenario_train(rank: int, world: int) -> dict[str, Any]:
    """Each variant from different initial values per rank (FSDP takes rank 0's), trained STEPS steps."""
    reference = train_reference(STEPS)
    variants: dict[str, dict[str, Any]] = {
        "prefetch": {},
        "no_prefetch": {"prefetch": False},
        "step_in_backward": {"step_in_backward": Momentum},
        "mixed_bf16": {"mixed_precision": MixedPrecision(torch.bfloat16, reduce_dtype=torch.float32)},
    }
    report: dict[str, Any] = {}
    for name, options in variants.items():
        net = Net(seed=100 + rank)
        fsdp = wrap(net, **options)
        opt = None if fsdp.optimizers else Momentum(fsdp.parameters())
        gathered = record_gathered(fsdp, net.blocks[1])
        issued = record_issued(fsdp, late=rank == 1 and name == "step_in_backward")
        had_grads = train_fsdp(fsdp, opt, range(STEPS), rank, world)
        state = fsdp.full_state_dict()
        report[name] = {
            "max_abs_diff": max_diff(state, reference),
            "digest": digest(state),
            "units": len(fsdp.units),
            "calls": int(state["calls"]),
            "grads_after_backward": had_grads,
            "gathered_in_block": gathered,
            "gathered_after": fsdp.gathered_bytes(),
            "shard_numel": sum(u.shard.numel() for u in fsdp.units),
            "issued": issued,
        }
    report["total_numel"] = sum(p.numel() for p in reference.parameters())
    report["block_bytes"] = sum(p.numel() * 4 for p in reference.blocks[0].parameters())
    report["memory"] = memory_ratio(rank, world)
    return report


def record_gathered(fsdp: FullyShardedDataParallel, block: torch.nn.Module) -> list[int]:
    """Gathered bytes when ``block``'s forward starts (after FSDP's own hook gathered it), per step."""
    seen: list[int] = []
    block.register_forward_pre_hook(lambda *_: seen.append(fsdp.gathered_bytes()))
    return seen


def record_issued(fsdp: FullyShardedDataParallel, *, late: bool) -> list[list[Any]]:
    """The collectives FSDP starts through hfreduce's registered buffers: (kind, elements, which buffer), what
    the node's ranks must agree on. ``late``: this rank starts each backward's first reduce-scatter 30 ms after
    its peers and looks at it again 60 ms later, when it has completed (with ``step_in_backward`` it takes the
    result at once, while its peers found it in flight): the timing in which a pool of buffers handed out in
    the order they came back gave the next all-gather different buffers on the two ranks."""
    comm = fsdp.comm
    issued: list[list[Any]] = []
    if not isinstance(comm, HFReduceComm):
        return issued
    gather, scatter = comm.all_gather, comm.reduce_scatter_mean

    def all_gather(out: torch.Tensor, shard: torch.Tensor) -> Pending:
        pending = gather(out, shard)
        issued.append(["all_gather", out.numel(), comm.slot_of(pending)])
        return pending

    def reduce_scatter_mean(out: torch.Tensor, write: Callable[[torch.Tensor], None], numel: int) -> Pending:
        first = late and sum(kind == "reduce_scatter" for kind, _, _ in issued) % len(fsdp.units) == 0
        if first:
            time.sleep(0.03)
        pending = scatter(out, write, numel)
        issued.append(["reduce_scatter", numel, comm.slot_of(pending)])
        if first:
            time.sleep(0.06)
        return pending

    comm.all_gather, comm.reduce_scatter_mean = all_gather, reduce_scatter_mean  # type: ignore[method-assign]
    return issued


def memory_ratio(rank: int, world: int) -> dict[str, Any]:
    """Per-rank parameter + gradient + optimizer bytes after a step: FSDP vs haiscale DDP, same model."""

    def resident(params: list[torch.Tensor], opt: Momentum) -> int:
        tensors = list(params) + [p.grad for p in params if p.grad is not None]
        tensors += [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
        return sum(t.numel() * t.element_size() for t in tensors)

    out: dict[str, Any] = {}
    for kind in ("fsdp", "ddp"):
        net = Net(seed=100, width=64, blocks=4)
        model: torch.nn.Module
        if kind == "fsdp":
            model = FullyShardedDataParallel(net, auto_wrap_policy=SizeWrapPolicy(10_000), collectives=COLLECTIVES)
        else:
            model = DistributedDataParallel(net)
        opt = Momentum(model.parameters())
        x, y = batch(0)
        loss_of(model(x[rows(rank, world)]), y[rows(rank, world)]).backward()
        opt.step()  # gradients kept: the peak between backward and zero_grad
        out[kind] = resident(list(model.parameters()), opt)
        if kind == "fsdp":  # nothing of FSDP's left in flight on the hfreduce group the DDP wrapper takes over
            out["fsdp_in_flight"] = model.comm.in_flight() if isinstance(model.comm, HFReduceComm) else 0  # type: ignore[union-attr]
        if kind == "ddp":
            model.reducer.stop()  # type: ignore[union-attr,operator]
        else:
            out["fsdp_units"] = len(model.units)  # type: ignore[arg-type]
    out["ratio"] = out["fsdp"] / out["ddp"]
    return out


def scenario_save(rank: int, world: int) -> dict[str, Any]:
    """World 4: train 2 steps, save the full state (torch.save, rank 0) and the sharded one (checkpoint
    manager), train 2 more; the loading side (world 2) must reach the same parameters."""
    folder = Path(os.environ["TEST_DIR"])
    fsdp = wrap(Net(seed=100))
    opt = Momentum(fsdp.parameters())
    train_fsdp(fsdp, opt, range(2), rank, world)
    full = {"model": fsdp.full_state_dict(), "optim": fsdp.full_optim_state_dict(opt)}
    if rank == 0:
        torch.save(full, folder / "full.pt")
    sharded = {"model": fsdp.sharded_state_dict(), "optim": fsdp.sharded_optim_state_dict(opt)}
    ckpt.save(folder / "sharded", sharded, step=2, blocking=True, report=False)
    train_fsdp(fsdp, opt, range(2, STEPS), rank, world)
    state = fsdp.full_state_dict()
    return {"max_abs_diff": max_diff(state, train_reference(STEPS)), "digest": digest(state)}


def scenario_load(rank: int, world: int) -> dict[str, Any]:
    folder = Path(os.environ["TEST_DIR"])
    reference = train_reference(STEPS)
    report: dict[str, Any] = {}
    for how in ("full", "sharded"):
        fsdp = wrap(Net(seed=7))  # other values: everything must come from the checkpoint
        opt = Momentum(fsdp.parameters())  # no state yet
        if how == "full":
            full = torch.load(folder / "full.pt")
            fsdp.load_state_dict(full["model"])
            fsdp.load_full_optim_state_dict(opt, full["optim"])
        else:
            state = {"model": fsdp.sharded_state_dict(), "optim": fsdp.sharded_optim_state_dict(opt)}
            loaded = ckpt.load(folder / "sharded", state, allocate_missing=True)
            fsdp.load_sharded_optim_state_dict(opt, state["optim"])
            report["saved_world_size"] = loaded.world_size
        train_fsdp(fsdp, opt, range(2, STEPS), rank, world)
        state = fsdp.full_state_dict()
        report[how] = {
            "max_abs_diff": max_diff(state, reference),
            "digest": digest(state),
            "calls": int(state["calls"]),
        }
    return report


def scenario_kill(rank: int, world: int) -> dict[str, Any]:
    """Rank TEST_VICTIM SIGKILLs itself in the middle of its second backward; the others report what they saw."""
    victim = int(os.environ["TEST_VICTIM"])
    net = Net(seed=100)
    fsdp = wrap(net)
    opt = Momentum(fsdp.parameters())

    def kill_in_backward(_module: torch.nn.Module, _args: Any, output: torch.Tensor) -> None:
        output.register_hook(lambda _grad: os.kill(os.getpid(), signal.SIGKILL))

    for step in range(2):
        x, y = batch(step)
        if step == 1 and rank == victim:  # dies once block 1's output has its gradient: mid-backward, with the
            net.blocks[1].register_forward_hook(kill_in_backward)  # last block's gradient reduce-scatter started
        out = fsdp(x[rows(rank, world)])
        start = time.monotonic()
        try:
            loss_of(out, y[rows(rank, world)]).backward()
        except Exception as exc:  # reported to the test, which asserts on the type and message
            refused = ""
            try:
                fsdp(x[rows(rank, world)])
            except RuntimeError as again:
                refused = str(again)
            return {
                "step": step,
                "error": type(exc).__name__,
                "message": str(exc),
                "elapsed_s": time.monotonic() - start,
                "refused_after": refused,
            }
        opt.step()
        opt.zero_grad()
    return {"error": None}


def _error_of(fn: Callable[[], Any]) -> list[str] | None:
    try:
        fn()
    except Exception as exc:
        return [type(exc).__name__, str(exc)]
    return None


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = Block(4)
        self.b = Block(4)
        self.b.up.weight = self.a.up.weight  # tied across the two units


def scenario_bad_arguments(rank: int, world: int) -> dict[str, Any]:
    policy = ModuleWrapPolicy([Block])
    frozen = torch.nn.Linear(2, 2).requires_grad_(False)
    wide = torch.nn.Linear(2, 2).double()
    different = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2 if rank != 1 else 3))
    fsdp = wrap(Net(seed=100))
    before = fsdp.full_state_dict()
    bad_state = dict(before)
    bad_state["head.weight"] = torch.zeros(4, 4)
    missing_state = {k: v for k, v in before.items() if k != "inp.bias"}
    results = {
        "not_module": _error_of(lambda: FullyShardedDataParallel("model")),  # type: ignore[arg-type]
        "policy": _error_of(lambda: FullyShardedDataParallel(Net(1), auto_wrap_policy=3)),  # type: ignore[arg-type]
        "class_policy": _error_of(lambda: ModuleWrapPolicy([int])),  # type: ignore[list-item]
        "size_policy": _error_of(lambda: SizeWrapPolicy(0)),
        "precision": _error_of(lambda: FullyShardedDataParallel(Net(1), mixed_precision="bf16")),  # type: ignore[arg-type]
        "precision_dtype": _error_of(lambda: MixedPrecision(torch.int8)),
        "step": _error_of(lambda: FullyShardedDataParallel(Net(1), step_in_backward=3)),  # type: ignore[arg-type]
        "group": _error_of(lambda: FullyShardedDataParallel(Net(1), process_group="world")),
        "collectives": _error_of(lambda: FullyShardedDataParallel(Net(1), collectives="nccl")),
        "frozen": _error_of(lambda: FullyShardedDataParallel(frozen)),
        "float64": _error_of(lambda: FullyShardedDataParallel(wide)),
        "tied": _error_of(lambda: FullyShardedDataParallel(Tied(), auto_wrap_policy=policy)),
        "twice": _error_of(lambda: FullyShardedDataParallel(torch.nn.Sequential(fsdp))),
        "different": _error_of(lambda: FullyShardedDataParallel(different)),
        "bad_shape": _error_of(lambda: fsdp.load_state_dict(bad_state)),
        "missing_key": _error_of(lambda: fsdp.load_state_dict(missing_state)),
    }
    after = fsdp.full_state_dict()
    results["unchanged"] = all(torch.equal(before[k], after[k]) for k in before)  # type: ignore[assignment]
    return results


SCENARIOS: dict[str, Callable[[int, int], dict[str, Any]]] = {
    "train": scenario_train,
    "save": scenario_save,
    "load": scenario_load,
    "kill": scenario_kill,
    "bad_arguments": scenario_bad_arguments,
}


def main() -> None:
    scenario, out = sys.argv[1], sys.argv[2]
    dist.init_process_group(os.environ.get("TEST_BACKEND", "hfreduce"))
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        result = SCENARIOS[scenario](rank, world)
    except Exception as exc:  # the test shows it
        result = {"crash": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    with open(out, "w") as f:
        json.dump(result, f)
    os._exit(0)  # do not wait for torch's or hfreduce's background threads (a peer may be gone)


if __name__ == "__main__":
    main()
