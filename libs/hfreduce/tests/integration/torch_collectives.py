"""Every torch.distributed collective on the hfreduce group against the same call on a gloo group.

Inputs are small integers (also in floating point), so sums and averages over 2 or 4 ranks are exact in
every dtype and any order: results must be equal, not close.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

Case = Callable[[Any], Any]  # runs one collective on the given group, returns what to compare


def values(rank: int, n: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    """Rank-dependent small integers (-8..8, exact in fp16 and bf16) as ``dtype``."""
    base = (torch.arange(n) * 7 + rank * 3 + salt) % 17 - 8
    return base.to(dtype)


def cases(rank: int, world: int) -> dict[str, Case]:
    out: dict[str, Case] = {}
    floats = (torch.float32, torch.float16, torch.bfloat16)
    for dtype in (*floats, torch.float64, torch.int64):
        ops = ["SUM", "MAX", "MIN"] + (["AVG"] if dtype.is_floating_point else ["PRODUCT"])
        for op in ops:
            out[f"all_reduce {op} {dtype}"] = _all_reduce(rank, dtype, getattr(dist.ReduceOp, op))
    out["all_reduce BOR torch.int32"] = _all_reduce(rank, torch.int32, dist.ReduceOp.BOR)
    out["all_reduce PREMUL_SUM torch.float32"] = _all_reduce(rank, torch.float32, dist._make_nccl_premul_sum(0.5))
    out["all_reduce non-contiguous"] = lambda g: _reduced(g, values(rank, 12, torch.float32).view(3, 4).t())
    out["all_reduce async get_future"] = lambda g: (
        dist.all_reduce(values(rank, 300, torch.float32), group=g, async_op=True).get_future().wait()[0]
    )
    out["allreduce_coalesced"] = lambda g: _coalesced(g, rank)
    for dtype in (torch.float32, torch.int32, torch.bool):
        out[f"broadcast {dtype}"] = lambda g, d=dtype: _broadcast(g, values(rank, 33, d), world - 1)
    out["broadcast odd bytes uint8"] = lambda g: _broadcast(g, values(rank, 5, torch.uint8), 0)
    for dtype in (torch.float32, torch.int64, torch.uint8):
        out[f"all_gather {dtype}"] = lambda g, d=dtype: _all_gather(g, values(rank, 9, d), world)
        out[f"all_gather_into_tensor {dtype}"] = lambda g, d=dtype: _all_gather_into(g, values(rank, 9, d), world)
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        out[f"reduce_scatter {dtype}"] = lambda g, d=dtype: _reduce_scatter(g, rank, world, d)
        out[f"reduce_scatter_tensor {dtype}"] = lambda g, d=dtype: _reduce_scatter_tensor(g, rank, world, d, "SUM")
    out["reduce_scatter_tensor MAX"] = lambda g: _reduce_scatter_tensor(g, rank, world, torch.float32, "MAX")
    for dtype in (torch.float32, torch.int64):
        out[f"reduce {dtype}"] = lambda g, d=dtype: _reduce(g, rank, world, values(rank, 50, d))
    out["barrier"] = lambda g: dist.barrier(group=g)
    out["all_to_all_single even"] = lambda g: _a2a_single(g, rank, world, None)
    out["all_to_all_single splits"] = lambda g: _a2a_single(g, rank, world, [(rank + j) % 3 for j in range(world)])
    out["all_to_all"] = lambda g: _a2a(g, rank, world)
    out["gather"] = lambda g: _gather(g, rank, world)
    out["scatter"] = lambda g: _scatter(g, rank, world)
    out["all_gather_object"] = lambda g: _gather_object(g, rank, world)
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool):
        out[f"send/recv ring {dtype}"] = lambda g, d=dtype: _ring(g, rank, world, values(rank, 37, d))
    out["send/recv ring 3 MiB"] = lambda g: _ring(g, rank, world, values(rank, 3 << 18, torch.float32))
    out["send/recv ring empty"] = lambda g: _ring(g, rank, world, values(rank, 0, torch.float32))
    out["isend/irecv tagged, in order"] = lambda g: _tagged(g, rank, world)
    return out


def _ring(g: Any, rank: int, world: int, t: torch.Tensor) -> torch.Tensor:
    """Every rank sends to the next and receives from the previous (isend first: both directions at once)."""
    got = torch.empty_like(t)
    work = dist.isend(t, (rank + 1) % world, group=g)
    dist.recv(got, (rank - 1) % world, group=g)
    work.wait()
    return got


def _tagged(g: Any, rank: int, world: int) -> list[torch.Tensor]:
    """Three messages to the next rank, received in the order sent, each with its tag."""
    sends = [
        dist.isend(values(rank, 5 + i, torch.float32, salt=i), (rank + 1) % world, group=g, tag=i) for i in range(3)
    ]
    got = [torch.empty(5 + i) for i in range(3)]
    recvs = [dist.irecv(got[i], (rank - 1) % world, group=g, tag=i) for i in range(3)]
    for w in [*sends, *recvs]:
        w.wait()
    return got


def compare(hf: Any, gloo: Any, rank: int, world: int) -> dict[str, str]:
    """Each case on both groups: "ok", or what differed."""
    results: dict[str, str] = {}
    for name, case in cases(rank, world).items():
        try:
            got, want = case(hf), case(gloo)
            results[name] = "ok" if _same(got, want) else f"differs: hfreduce {got!r} gloo {want!r}"
        except Exception as exc:
            results[name] = f"raised {type(exc).__name__}: {exc}"
    return results


def unsupported(hf: Any, rank: int, world: int) -> dict[str, str]:
    """What the backend cannot do raises an error naming it; the group still works afterwards."""
    attempts: dict[str, Callable[[], Any]] = {
        "recv any source": lambda: dist.recv(torch.ones(2), group=hf),
        "BAND float": lambda: dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BAND, group=hf),
        "BXOR half in reduce_scatter": lambda: dist.reduce_scatter_tensor(
            torch.ones(1, dtype=torch.float16), torch.ones(world, dtype=torch.float16), op=dist.ReduceOp.BXOR, group=hf
        ),
        "AVG int": lambda: dist.all_reduce(torch.ones(2, dtype=torch.int64), op=dist.ReduceOp.AVG, group=hf),
    }
    report: dict[str, str] = {}
    for name, attempt in attempts.items():
        try:
            attempt()
            report[name] = "no error"
        except Exception as exc:
            report[name] = f"{type(exc).__name__}: {exc}"
    after = torch.ones(3)
    dist.all_reduce(after, group=hf)
    report["after"] = str(after.tolist())
    return report


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, list | tuple):
        return isinstance(b, list | tuple) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _reduced(g: Any, t: torch.Tensor, op: Any = dist.ReduceOp.SUM) -> torch.Tensor:
    t = t.clone() if t.is_contiguous() else t
    dist.all_reduce(t, op=op, group=g)
    return t


def _all_reduce(rank: int, dtype: torch.dtype, op: Any) -> Case:
    def run(g: Any) -> torch.Tensor:
        t = values(rank, 1000, dtype)
        if op == dist.ReduceOp.PRODUCT:
            t = t % 3 + 1
        if dtype is torch.int32:
            t = t.abs()
        if dist.get_backend(g) == "gloo" and op == dist.ReduceOp.AVG:  # gloo has no AVG: sum, then divide
            dist.all_reduce(t, group=g)
            return t / dist.get_world_size(g)
        if dist.get_backend(g) == "gloo" and op == dist.ReduceOp.PREMUL_SUM:  # nor PREMUL_SUM
            t = t * 0.5
            op_ = dist.ReduceOp.SUM
        else:
            op_ = op
        dist.all_reduce(t, op=op_, group=g)
        return t

    return run


def _coalesced(g: Any, rank: int) -> list[torch.Tensor]:
    """The process group's own method (torch's ``dist.all_reduce_coalesced`` is gone)."""
    ts = [values(rank, 5, torch.float32), values(rank, 7, torch.float32, 1)]
    g.allreduce_coalesced(ts, dist.AllreduceCoalescedOptions()).wait()
    return ts


def _broadcast(g: Any, t: torch.Tensor, src: int) -> torch.Tensor:
    dist.broadcast(t, src, group=g)
    return t


def _all_gather(g: Any, t: torch.Tensor, world: int) -> list[torch.Tensor]:
    outs = [torch.zeros_like(t) for _ in range(world)]
    dist.all_gather(outs, t, group=g)
    return outs


def _all_gather_into(g: Any, t: torch.Tensor, world: int) -> torch.Tensor:
    out = torch.zeros(world * t.numel(), dtype=t.dtype)
    dist.all_gather_into_tensor(out, t, group=g)
    return out


def _reduce_scatter(g: Any, rank: int, world: int, dtype: torch.dtype) -> torch.Tensor:
    out = torch.zeros(6, dtype=dtype)
    dist.reduce_scatter(out, [values(rank, 6, dtype, salt=j) for j in range(world)], group=g)
    return out


def _reduce_scatter_tensor(g: Any, rank: int, world: int, dtype: torch.dtype, op: str) -> torch.Tensor:
    out = torch.zeros(5, dtype=dtype)
    dist.reduce_scatter_tensor(out, values(rank, 5 * world, dtype), op=getattr(dist.ReduceOp, op), group=g)
    return out


def _reduce(g: Any, rank: int, world: int, t: torch.Tensor) -> torch.Tensor | None:
    dst = world - 1
    dist.reduce(t, dst, group=g)
    return t if rank == dst else None  # gloo leaves scratch in the other ranks' buffers


def _a2a_single(g: Any, rank: int, world: int, splits: list[int] | None) -> torch.Tensor:
    if splits is None:
        inp = values(rank, 4 * world, torch.float32).view(2 * world, 2)
        out = torch.zeros_like(inp)
        dist.all_to_all_single(out, inp, group=g)
        return out
    # what rank j sends to rank r: (j + r) % 3 rows; so this rank receives (j + rank) % 3 from each j
    recv = [(j + rank) % 3 for j in range(world)]
    inp = values(rank, sum(splits) * 3, torch.int64).view(-1, 3)
    out = torch.zeros(sum(recv), 3, dtype=torch.int64)
    dist.all_to_all_single(out, inp, recv, splits, group=g)
    return out


def _a2a(g: Any, rank: int, world: int) -> list[torch.Tensor]:
    """Tensors of different sizes per pair, which gloo refuses: against the exact expected values."""
    if dist.get_backend(g) == "gloo":
        return [values(j, j + rank + 1, torch.float32, salt=rank) for j in range(world)]
    ins = [values(rank, rank + j + 1, torch.float32, salt=j) for j in range(world)]
    outs = [torch.zeros(j + rank + 1) for j in range(world)]
    dist.all_to_all(outs, ins, group=g)
    return outs


def _gather(g: Any, rank: int, world: int) -> list[torch.Tensor] | None:
    t = values(rank, 8, torch.float32)
    outs = [torch.zeros(8) for _ in range(world)] if rank == 0 else None
    dist.gather(t, outs, dst=0, group=g)
    return outs


def _scatter(g: Any, rank: int, world: int) -> torch.Tensor:
    out = torch.zeros(4, dtype=torch.int32)
    parts = [values(9, 4, torch.int32, salt=j) for j in range(world)] if rank == world - 1 else None
    dist.scatter(out, parts, src=world - 1, group=g)
    return out


def _gather_object(g: Any, rank: int, world: int) -> list[Any]:
    objs: list[Any] = [None] * world
    dist.all_gather_object(objs, {"rank": rank, "t": time.time() > 0}, group=g)
    return objs
