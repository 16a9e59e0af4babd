"""One rank of an integration test, run as its own process: ``python worker.py SCENARIO OUT_JSON``.

The layout and options come from the environment (MASTER_ADDR, FF_HFREDUCE_NODE_RANK, ...), as a
launcher would set them. Every rank can regenerate every rank's input from the seeds, so each computes
the float64 reference itself and reports its errors; the test asserts on those reports.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import struct
import sys
import threading
import time
import zlib
from typing import Any

import numpy as np

from hfreduce import Group, GroupConfig, PeerFailureError, RendezvousError, expected_allreduce_counters
from hfreduce.joining import LINK_HELLO
from hfreduce.reduction import DType, bf16_bits, bf16_values, unit_roundoff

OPS = ("sum", "avg", "max", "min")
# struct tcp_info (linux/tcp.h): tcpi_bytes_acked and tcpi_bytes_received, two u64 at byte 120
_TCP_INFO_BYTES = struct.Struct("QQ")
_TCP_INFO_BYTES_AT = 120


def inputs(seed: int, world: int, n: int) -> np.ndarray:
    """Every rank's input as float64 rows (values chosen so no rank's contribution is negligible)."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((world, n))


def rounded(values: np.ndarray, dtype: DType) -> np.ndarray:
    if dtype is DType.BF16:
        return bf16_values(bf16_bits(values.ravel())).astype(np.float64).reshape(values.shape)
    return values.astype(dtype.storage).astype(np.float64)


def make_buffer(values: np.ndarray, dtype: DType, use_torch: bool) -> Any:
    if use_torch:
        import torch

        tdt = {DType.F32: torch.float32, DType.F16: torch.float16, DType.BF16: torch.bfloat16}[dtype]
        return torch.tensor(values, dtype=torch.float64).to(tdt)
    return values.astype(dtype.storage)


def as_f64(buf: Any) -> np.ndarray:
    if type(buf).__module__.startswith("torch"):
        return buf.double().numpy()
    return np.asarray(buf, dtype=np.float64)


def reference(op: str, x: np.ndarray) -> np.ndarray:
    return {"sum": x.sum(0), "avg": x.mean(0), "max": x.max(0), "min": x.min(0)}[op]


def check(
    name: str, got: np.ndarray, ref: np.ndarray, scale: np.ndarray, dtype: DType, world: int, exact: bool, raw: bytes
) -> dict[str, Any]:
    err = np.abs(got - ref)
    # each value passes through at most (world + 2) roundings to the dtype, each relative to sum |x|
    bound = 0.0 if exact else (world + 2) * unit_roundoff(dtype)
    worst = float(np.max(err - bound * scale)) if len(err) else 0.0
    rel = float(np.max(err / np.maximum(scale, 1e-30))) if len(err) else 0.0
    return {"name": name, "ok": worst <= 0.0, "max_rel_err": rel, "bound": bound, "crc": zlib.crc32(raw)}


def raw_bytes(buf: Any) -> bytes:
    if type(buf).__module__.startswith("torch"):
        import torch

        return bytes(buf.view(torch.int16).numpy().tobytes()) if buf.element_size() == 2 else buf.numpy().tobytes()
    return np.ascontiguousarray(buf).tobytes()


def correctness(group: Group, cfg: GroupConfig, sizes: list[int], dtypes: list[DType], use_torch: bool) -> list[Any]:
    world, rank = cfg.world_size, cfg.rank
    out = []
    case = 0
    for dtype in dtypes:
        for n in sizes:
            for op in OPS:
                case += 1
                x = rounded(inputs(case, world, n), dtype)
                buf = make_buffer(x[rank], dtype, use_torch)
                before = group.counters()
                if op == "min":
                    group.allreduce_async(buf, op).wait()
                else:
                    group.allreduce(buf, op)
                after = group.counters()
                scale = np.abs(x).sum(0) / (world if op == "avg" else 1)
                res = check(
                    f"allreduce/{op}/{dtype.value}/{n}",
                    as_f64(buf),
                    reference(op, x),
                    scale,
                    dtype,
                    world,
                    op in ("max", "min"),
                    raw_bytes(buf),
                )
                if op == "sum" and cfg.algorithm == "tree" and not use_torch:
                    res["counters_ok"] = _counters_ok(cfg, group, before, after, n, dtype, registered=False)
                out.append(res)
            case += 1
            x = rounded(inputs(case, world, n), dtype)
            buf = make_buffer(x[rank], dtype, use_torch)
            dst = world - 1
            group.reduce(buf, dst, "sum")
            if rank == dst:
                out.append(
                    check(
                        f"reduce/{dtype.value}/{n}",
                        as_f64(buf),
                        x.sum(0),
                        np.abs(x).sum(0),
                        dtype,
                        world,
                        False,
                        b"dst",
                    )
                )
            else:
                out.append(
                    check(
                        f"reduce-untouched/{dtype.value}/{n}",
                        as_f64(buf),
                        x[rank],
                        x[rank],
                        dtype,
                        world,
                        True,
                        b"other",
                    )
                )
            case += 1
            x = rounded(inputs(case, world, n), dtype)
            buf = make_buffer(x[rank], dtype, use_torch)
            src = world // 2
            group.broadcast(buf, src)
            out.append(
                check(f"broadcast/{dtype.value}/{n}", as_f64(buf), x[src], x[src], dtype, world, True, raw_bytes(buf))
            )
            case += 1
            x = rounded(inputs(case, world, n), dtype)
            gathered = make_buffer(np.zeros(world * n), dtype, use_torch)
            group.allgather(gathered, make_buffer(x[rank], dtype, use_torch))
            out.append(
                check(
                    f"allgather/{dtype.value}/{n}",
                    as_f64(gathered),
                    x.ravel(),
                    np.abs(x).ravel(),
                    dtype,
                    world,
                    True,
                    raw_bytes(gathered),
                )
            )
            for op in ("sum", "max"):
                case += 1
                raw = inputs(case, world, world * n)
                # rounding is per element: only this rank's row and the columns of its part are needed (rounding,
                # reference and scale over all world x world*n values were most of a large case's CPU)
                x = rounded(raw[:, rank * n : (rank + 1) * n], dtype)
                part = make_buffer(np.zeros(n), dtype, use_torch)
                group.reduce_scatter(part, make_buffer(rounded(raw[rank], dtype), dtype, use_torch), op)
                ref = reference(op, x)
                scale = np.abs(x).sum(0)
                out.append(
                    check(
                        f"reduce_scatter/{op}/{dtype.value}/{n}",
                        as_f64(part),
                        ref,
                        scale,
                        dtype,
                        world,
                        op == "max",
                        b"rs",
                    )
                )
    return out


def registered(group: Group, cfg: GroupConfig, sizes: list[int]) -> list[Any]:
    world, rank = cfg.world_size, cfg.rank
    out = []
    for dtype in (DType.F32, DType.F16):
        for n in sizes:
            buf = group.alloc(n, dtype.value)
            for op in ("sum", "max", "avg"):
                x = rounded(inputs(1000 + n + len(op), world, n), dtype)
                buf[...] = x[rank].astype(dtype.storage)
                before = group.counters()
                group.allreduce(buf, op)
                after = group.counters()
                res = check(
                    f"registered/{op}/{dtype.value}/{n}",
                    as_f64(buf),
                    reference(op, x),
                    np.abs(x).sum(0),
                    dtype,
                    world,
                    op == "max",
                    raw_bytes(buf),
                )
                if op == "sum":
                    res["counters_ok"] = _counters_ok(cfg, group, before, after, n, dtype, registered=True)
                out.append(res)
            if n:
                out += registered_allgather(group, cfg, n, dtype)
                out += registered_reduce_scatter(group, cfg, n, dtype)
    return out


def registered_reduce_scatter(group: Group, cfg: GroupConfig, n: int, dtype: DType) -> list[Any]:
    """``reduce_scatter_registered`` of blocks of ``n``: sum, avg and max, in place and into another buffer."""
    world, rank = cfg.world_size, cfg.rank
    buf = group.alloc(world * n, dtype.value)
    out = []
    for op in ("sum", "avg", "max"):
        for into in ("in-place", "out"):
            raw = inputs(3000 + n + len(op) + len(into), world, world * n)
            buf[...] = rounded(raw[rank], dtype).astype(dtype.storage)
            target = np.full(n, 3.0, dtype=dtype.storage) if into == "out" else None
            group.reduce_scatter_registered(buf, target, op)
            got = buf[rank * n : (rank + 1) * n] if target is None else target
            x = rounded(raw[:, rank * n : (rank + 1) * n], dtype)  # every rank's block of this rank
            name = f"reduce_scatter_registered/{op}-{into}/{dtype.value}/{n}"
            out.append(check(name, as_f64(got), reference(op, x), np.abs(x).sum(0), dtype, world, op == "max", b""))
    return out


def registered_allgather(group: Group, cfg: GroupConfig, n: int, dtype: DType) -> list[Any]:
    """``allgather_registered`` of blocks of ``n``, in place and into another buffer: every block bit for bit, the
    other ranks' blocks starting as garbage (nothing may be summed into them)."""
    world, rank = cfg.world_size, cfg.rank
    buf = group.alloc(world * n, dtype.value)
    out = []
    for into in ("in-place", "out"):
        x = rounded(inputs(2000 + n + len(into), world, n), dtype)
        buf[...] = np.float32(7.0)
        buf[rank * n : (rank + 1) * n] = x[rank].astype(dtype.storage)
        target = np.full(world * n, 3.0, dtype=dtype.storage) if into == "out" else None
        group.allgather_registered(buf, target)
        got = buf if target is None else target
        name = f"registered/allgather-{into}/{dtype.value}/{n}"
        out.append(check(name, as_f64(got), x.ravel(), np.abs(x).ravel(), dtype, world, True, raw_bytes(got)))
    refused = []  # before anything is queued: a buffer not from alloc, an `out` of another size
    for bad_buf, bad_out in ((np.zeros(world * n, dtype.storage), None), (buf, np.zeros(world * n + 1, dtype.storage))):
        try:
            group.allgather_registered(bad_buf, bad_out)
            refused.append(False)
        except ValueError:
            refused.append(True)
    out.append({"name": f"registered/allgather-refusals/{dtype.value}/{n}", "ok": all(refused), "crc": 0})
    return out


def _counters_ok(
    cfg: GroupConfig, group: Group, before: Any, after: Any, n: int, dtype: DType, registered: bool
) -> bool:
    delta = after.copy()
    for field in (
        "copied_in",
        "reduce_read",
        "reduce_written",
        "sent",
        "received",
        "reduce_inter",
        "copied_out",
        "distributed",
        "collectives",
    ):
        setattr(delta, field, getattr(after, field) - getattr(before, field))
    wire = dtype.itemsize if cfg.compression is None or dtype is not DType.F32 else 2
    expect = expected_allreduce_counters(
        num_elems=n,
        itemsize=dtype.itemsize,
        wire_itemsize=wire,
        num_local=cfg.local_world_size,
        local_rank=cfg.local_rank,
        node_rank=cfg.node_rank,
        trees=group._rt.trees,
        segment_elems=cfg.shm_slot_bytes // dtype.itemsize,
        chunk_elems=group._rt.chunk_elems,
        registered=registered,
        direct=not registered and group._rt.cross_memory,
    )
    return bool(delta == expect)


def compression(group: Group, cfg: GroupConfig) -> list[Any]:
    world, rank = cfg.world_size, cfg.rank
    x = inputs(77, world, 50_000).astype(np.float32).astype(np.float64)
    buf = x[rank].astype(np.float32)
    group.allreduce(buf, "sum")
    ref = x.sum(0)
    err = np.abs(buf - ref)
    scale = np.abs(x).sum(0)
    wire = DType.BF16 if cfg.compression == "bf16" else DType.F16
    return [
        {
            "name": f"compression/{cfg.compression}",
            "max_rel_err": float(np.max(err / scale)),
            "mean_rel_err": float(np.mean(err / scale)),
            "rms_err_over_rms_ref": float(np.sqrt(np.mean(err**2)) / np.sqrt(np.mean(ref**2))),
            "bound": (world + 2) * unit_roundoff(wire),
            "ok": bool(np.all(err <= (world + 2) * unit_roundoff(wire) * scale)),
            "crc": zlib.crc32(buf.tobytes()),
        }
    ]


def fault(group: Group, cfg: GroupConfig, kind: str, victim: int) -> dict[str, Any]:
    """The victim dies (SIGKILL) or hangs mid-run; the others record what they raised and when."""
    buf = np.ones(2_000_000, dtype=np.float32)
    group.allreduce(buf)  # everyone is up
    if cfg.rank == victim:
        if kind == "kill":
            threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGKILL)).start()
            while True:
                group.allreduce(buf)
        time.sleep(cfg.timeout_s * 2 + 1)  # hang: never call the collective
        return {"rank": cfg.rank, "victim": True}
    start = time.monotonic()
    try:
        while time.monotonic() - start < cfg.timeout_s * 4:
            t0 = time.monotonic()
            group.allreduce(buf)
    except PeerFailureError as exc:
        elapsed = time.monotonic() - t0
        status = None
        if cfg.rank == 0:
            time.sleep(1.0)  # keep the control server up while the others read the status
        else:
            try:
                status = group.status()
            except OSError:
                status = None
        return {
            "rank": cfg.rank,
            "error": "PeerFailureError",
            "culprit": exc.rank,
            "message": str(exc),
            "elapsed_s": elapsed,
            "status": status,
        }
    except Exception as exc:
        return {
            "rank": cfg.rank,
            "error": type(exc).__name__,
            "message": str(exc),
            "culprit": None,
            "elapsed_s": time.monotonic() - start,
        }
    return {"rank": cfg.rank, "error": None}


def tree_link_traffic(group: Group) -> dict[str, Any]:
    """This rank's node in each tree (parent, children), and the bytes each of its tree links sent (acknowledged)
    and received, by tree, direction and neighbour."""
    rt = group._rt
    nodes = [rt.trees[tree][rt.config.node_rank] for tree in (0, 1)]
    links = []
    for direction, table in (("up", rt.up_links), ("down", rt.down_links)):
        for tree in (0, 1):
            for neighbour, link in table[tree].items():
                info = link.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
                sent, received = _TCP_INFO_BYTES.unpack_from(info, _TCP_INFO_BYTES_AT)
                links.append(
                    {"tree": tree, "direction": direction, "neighbour": neighbour, "sent": sent, "received": received}
                )
    return {
        "nodes": [{"parent": node.parent, "children": list(node.children)} for node in nodes],
        "links": links,
        "hello_bytes": LINK_HELLO.size,
    }


def main() -> None:
    scenario, out_path = sys.argv[1], sys.argv[2]
    cfg = GroupConfig.from_env()
    result: dict[str, Any] = {"rank": cfg.rank}
    try:
        group = Group(cfg)
    except RendezvousError as exc:
        result.update(error="RendezvousError", message=str(exc), missing=list(exc.missing_ranks))
        _write(out_path, result)
        return
    if scenario == "fault":
        result.update(fault(group, cfg, os.environ["TEST_FAULT"], int(os.environ["TEST_VICTIM"])))
        _write(out_path, result)
        os._exit(0)  # the group is broken; leave without waiting for peers
    sizes = [int(s) for s in os.environ.get("TEST_SIZES", "0,1,7").split(",")]
    if scenario == "correctness":
        dtypes = [DType(d) for d in os.environ.get("TEST_DTYPES", "float32,float16").split(",")]
        use_torch = os.environ.get("TEST_TORCH") == "1"
        result["cases"] = correctness(group, cfg, sizes, dtypes, use_torch)
        if os.environ.get("TEST_REGISTERED") == "1":
            result["cases"] += registered(group, cfg, sizes)
        group.barrier()
    elif scenario == "compression":
        result["cases"] = compression(group, cfg)
    result["status"] = group.status()
    result["counters"] = dataclasses.asdict(group.counters())
    result["seq"] = group.seq
    result["cross_memory"] = group._rt.cross_memory
    result["pipeline"] = group._rt.runner.mode
    result["tree_links"] = tree_link_traffic(group)
    group.close()
    _write(out_path, result)


def _write(path: str, result: dict[str, Any]) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main()
