"""One rank of a haiscale.pipeline test, as its own process: ``python pipeline_worker.py SCENARIO OUT_JSON``.

The launcher sets torch's variables (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), FF_HFREDUCE_NODE_RANK (the
simulated node: two ranks per node) and TEST_PP (stages per pipeline). The worker uses the API as HaiScale's
examples do (``make_subgroups``, ``partition``, ``PipeDream(DDP(stage), chunks, process_group=pp_group)``,
``forward_backward``) and reports what the test asserts on.
"""

from __future__ import annotations

import datetime
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
from haiscale.pipeline import GPipe, PipeDream, Pipeline, SequentialModel, make_subgroups, partition

STEPS = 3
CHUNKS = 4
MICRO = 2  # samples per micro-batch
BALANCE = [3, 2]  # layers of the 5-layer MLP per stage at pp=2
SCHEDULES: dict[str, type[Pipeline]] = {"gpipe": GPipe, "1f1b": PipeDream}


def mlp(seed: int) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)
    )


def global_batch(step: int, dp: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank can make the step's global batch; replica d trains on rows [d * per, (d + 1) * per)."""
    g = torch.Generator().manual_seed(1000 + step)
    rows = dp * CHUNKS * MICRO
    return torch.randn(rows, 6, generator=g), torch.randn(rows, 3, generator=g)


class Momentum:
    """SGD with momentum as torch.optim.SGD computes it; written out because torch.optim's first use imports
    torch._dynamo (seconds per process here)."""

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
            p.grad = None


def reference(dp: int) -> torch.nn.Sequential:
    """One process, the whole global batch per step, the mean loss over it."""
    net = mlp(seed=7)
    opt = Momentum(net.parameters())
    for step in range(STEPS):
        x, y = global_batch(step, dp)
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    return net


def criterion(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(out, y) / CHUNKS  # the step's mean over its micro-batches


def train(
    kind: str, *, ddp: bool, offset: bool, dp_group: Any, pp_group: Any, accumulate: bool = False
) -> dict[str, Any]:
    """STEPS steps of the pipeline (DDP across replicas if ``ddp``); distance to the one-process reference.
    ``accumulate``: each step is two ``forward_backward`` calls on the two halves of the batch, the first inside
    the DDP wrapper's ``no_sync()``."""
    pp_rank, pp_size = pp_group.rank(), pp_group.size()
    dp, replica = dp_group.size(), dp_group.rank()
    stage: torch.nn.Module = partition(mlp(seed=7 if not ddp else 7 + replica), pp_rank, pp_size, balance=BALANCE)
    if ddp:  # replicas start from different values: DDP gives every one replica 0's
        stage = DistributedDataParallel(stage, process_group=dp_group)
    model = SCHEDULES[kind](stage, CHUNKS, process_group=pp_group, offset_replicas=offset)
    opt = Momentum(model.parameters())
    report: dict[str, Any] = {"losses": [], "offset_s": [], "peak_activation_bytes": 0, "peak_in_flight": 0}
    per = CHUNKS * MICRO
    before = stage.reducer.group.counters().collectives if isinstance(stage, DistributedDataParallel) else 0
    for step in range(STEPS):
        x, y = global_batch(step, dp)
        x, y = x[replica * per : (replica + 1) * per], y[replica * per : (replica + 1) * per]
        if accumulate and isinstance(stage, DistributedDataParallel):
            half = per // 2
            with stage.no_sync():
                model.forward_backward(x[:half], criterion=half_criterion, labels=(y[:half],))
            loss, _ = model.forward_backward(x[half:], criterion=half_criterion, labels=(y[half:],))
        else:
            loss, _ = model.forward_backward(x, criterion=criterion, labels=(y,))
        opt.step()
        if loss is not None:
            report["losses"].append(float(loss.sum()))
        report["offset_s"].append(model.stats.offset_s)
        report["peak_activation_bytes"] = model.stats.peak_activation_bytes
        report["peak_in_flight"] = model.stats.peak_in_flight
    ref = reference(dp)
    want = dict(ref.named_parameters())
    bare = stage.module if isinstance(stage, DistributedDataParallel) else stage
    report["max_abs_diff"] = max(float((p.detach() - want[n].detach()).abs().max()) for n, p in bare.named_parameters())
    with torch.no_grad():  # evaluation: forwards only, the outputs on the last stage
        x_eval = torch.randn(CHUNKS * 3, 6, generator=torch.Generator().manual_seed(5))
        out = model(x_eval)
        report["eval_diff"] = None if out is None else float((out - ref(x_eval)).abs().max())
    report["params"] = sorted(n for n, _ in bare.named_parameters())
    if isinstance(stage, DistributedDataParallel):
        report["collectives"] = stage.reducer.group.counters().collectives - before  # DDP's reductions
        stage.reducer.stop()
    return report


class Embed(torch.nn.Module):
    """A first layer that passes three tensors on: features, an index (int64), a mask (bool)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(6, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.lin(x), torch.arange(8).flip(0), x[:, :1] > 0


class Mix(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, h: torch.Tensor, idx: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.tanh(self.lin(h[:, idx])) * mask + h, idx, mask


class Head(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 3)

    def forward(self, h: torch.Tensor, idx: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.lin(h)


def tuple_model() -> SequentialModel:
    torch.manual_seed(11)
    return SequentialModel(Embed(), Mix(), Mix(), Head())


def half_criterion(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(out, y) / (2 * CHUNKS)  # two calls per step


def train_tuples(pp_group: Any) -> float:
    """A SequentialModel whose stages pass (float, int64, bool) tensors on, as HaiScale's GraphCast example's
    do: 1F1B against one process."""
    model = PipeDream(partition(tuple_model(), pp_group.rank(), 2, balance=[2, 2]), CHUNKS, pp_group)
    ref = tuple_model()
    opt, ref_opt = Momentum(model.parameters()), Momentum(ref.parameters())
    for step in range(STEPS):
        x, y = global_batch(step, 1)
        model.forward_backward(x, criterion=criterion, labels=(y,))
        opt.step()
        torch.nn.functional.mse_loss(ref(x), y).backward()
        ref_opt.step()
    want = dict(ref.named_parameters())
    return max(float((p.detach() - want[n].detach()).abs().max()) for n, p in model.module.named_parameters())


def scenario_train(rank: int, world: int) -> dict[str, Any]:
    dp_group, pp_group = make_subgroups(pp_size=int(os.environ["TEST_PP"]))
    ddp = dp_group.size() > 1
    report: dict[str, Any] = {"dp_rank": dp_group.rank(), "pp_rank": pp_group.rank()}
    for kind in SCHEDULES:
        report[kind] = train(kind, ddp=ddp, offset=False, dp_group=dp_group, pp_group=pp_group)
    if ddp:
        report["1f1b offset"] = train("1f1b", ddp=True, offset=True, dp_group=dp_group, pp_group=pp_group)
        report["1f1b no_sync"] = train(
            "1f1b", ddp=True, offset=False, dp_group=dp_group, pp_group=pp_group, accumulate=True
        )
    else:
        report["tuples max_abs_diff"] = train_tuples(pp_group)
    report["errors"] = bad_calls(pp_group)
    return report


def bad_calls(pp_group: Any) -> dict[str, str]:
    """Calls refused on every stage before anything is sent: the group still works afterwards."""
    model = PipeDream(partition(mlp(seed=7), pp_group.rank(), pp_group.size(), balance=BALANCE), CHUNKS, pp_group)
    attempts: dict[str, Callable[[], Any]] = {
        "chunks do not divide": lambda: model.forward_backward(
            torch.randn(6, 6), criterion=criterion, labels=(torch.randn(6, 3),)
        ),
        "no criterion": lambda: model.forward_backward(torch.randn(8, 6), labels=(torch.randn(8, 3),)),
    }
    out = {}
    for name, attempt in attempts.items():
        try:
            attempt()
            out[name] = "no error"
        except Exception as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
    loss, _ = model.forward_backward(torch.randn(8, 6), criterion=criterion, labels=(torch.randn(8, 3),))
    out["after"] = "ok" if model.is_last_stage == (loss is not None) else f"loss {loss!r}"
    return out


class _SleepFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, forward_s: float, backward_s: float) -> torch.Tensor:
        ctx.backward_s = backward_s
        time.sleep(forward_s)
        return x * 1.0

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        time.sleep(ctx.backward_s)
        return grad, None, None


class FixedCost(torch.nn.Module):
    """A linear layer that takes a fixed time forward and backward (a sleep: the same on a loaded machine)."""

    def __init__(self, forward_s: float, backward_s: float) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.forward_s, self.backward_s = forward_s, backward_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _SleepFn.apply(self.linear(x), self.forward_s, self.backward_s)  # type: ignore[no-any-return]


def scenario_bubble(rank: int, world: int) -> dict[str, Any]:
    """pp = world, one fixed-cost layer per stage; per step, every stage's busy time and its start and end."""
    _, pp_group = make_subgroups(pp_size=world)
    chunks = int(os.environ["TEST_CHUNKS"])
    forward_s = float(os.environ["TEST_FORWARD_S"])
    layers = torch.nn.Sequential(*[FixedCost(forward_s, 2 * forward_s) for _ in range(world)])
    stage = partition(layers, pp_group.rank(), world)
    report: dict[str, Any] = {}
    measured = int(os.environ["TEST_STEPS"])
    for n, (kind, cls) in enumerate(SCHEDULES.items()):
        model = cls(stage, chunks, process_group=pp_group)
        steps = []
        for _ in range(measured + (1 if n == 0 else 0)):  # the very first step pays the connections' set-up
            dist.barrier()
            x, y = torch.randn(chunks, 8), torch.randn(chunks, 8)
            model.forward_backward(x, criterion=lambda out, y: (out - y).pow(2).mean(), labels=(y,))
            s = model.stats
            steps.append({"busy_s": s.busy_s, "started": s.started, "finished": s.finished})
        report[kind] = steps[-measured:]
    return report


def scenario_offset(rank: int, world: int) -> dict[str, Any]:
    """pp=2 x dp=2, DDP, one fixed-cost layer per stage: when stage 0's activation sends leave, per replica, with
    and without ``offset_replicas`` (ranks 0 and 1, stage 0 of replicas 0 and 1, share node 0)."""
    dp_group, pp_group = make_subgroups(pp_size=2)
    forward_s = float(os.environ["TEST_FORWARD_S"])
    report: dict[str, Any] = {}
    for offset in (False, True):
        layers = torch.nn.Sequential(*[FixedCost(forward_s, 2 * forward_s) for _ in range(2)])
        stage = DistributedDataParallel(partition(layers, pp_group.rank(), 2), process_group=dp_group)
        model = PipeDream(stage, CHUNKS, process_group=pp_group, offset_replicas=offset)
        for _ in range(3):
            x, y = torch.randn(CHUNKS, 8), torch.randn(CHUNKS, 8)
            model.forward_backward(x, criterion=lambda out, y: (out - y).pow(2).mean(), labels=(y,))
        report["offset" if offset else "plain"] = {"sends": model.stats.send_times, "offset_s": model.stats.offset_s}
        stage.reducer.stop()
    return report


def scenario_kill(rank: int, world: int) -> dict[str, Any]:
    """pp=2 x dp=2 with DDP: rank TEST_VICTIM SIGKILLs itself in the forward of the third micro-batch of its
    second step; the others report what they saw."""
    victim = int(os.environ["TEST_VICTIM"])
    dp_group, pp_group = make_subgroups(pp_size=2)
    layers = mlp(seed=7)
    if rank == victim:
        calls = [0]

        def kill(module: Any, args: Any) -> None:
            calls[0] += 1
            if calls[0] == CHUNKS + 3:
                os.kill(os.getpid(), signal.SIGKILL)

        layers[-1].register_forward_pre_hook(kill)
    stage = DistributedDataParallel(partition(layers, pp_group.rank(), 2, balance=BALANCE), process_group=dp_group)
    model = PipeDream(stage, CHUNKS, process_group=pp_group)
    for step in range(2):
        x, y = global_batch(step, 1)
        started = time.monotonic()
        try:
            model.forward_backward(x, criterion=criterion, labels=(y,))
        except Exception as exc:  # reported to the test, which asserts on it
            return {
                "step": step,
                "error": type(exc).__name__,
                "message": str(exc),
                "culprit": getattr(exc, "rank", None),
                "elapsed_s": time.monotonic() - started,
            }
    return {"error": None}


SCENARIOS = {"train": scenario_train, "bubble": scenario_bubble, "offset": scenario_offset, "kill": scenario_kill}


def main() -> None:
    scenario, out = sys.argv[1], sys.argv[2]
    if os.environ.get("TEST_BACKEND") == "hfreduce":
        import hfreduce.distributed  # noqa: F401  registers the backend
    timeout = datetime.timedelta(seconds=float(os.environ.get("TEST_TIMEOUT_S", "30")))
    dist.init_process_group(os.environ.get("TEST_BACKEND", "gloo"), timeout=timeout)
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
