"""One rank of a torch.distributed test, as its own process: ``python torch_worker.py SCENARIO OUT_JSON``.

The layout comes from the environment as torchrun would set it (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE) plus FF_HFREDUCE_NODE_RANK, which makes ranks on this one host count as
different nodes. Each scenario writes a JSON report the test asserts on.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

import hfreduce.distributed  # noqa: F401 (registers the backend)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_collectives as collectives
import torch_ddp as ddp

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
TIMEOUT = datetime.timedelta(seconds=float(os.environ.get("TEST_TIMEOUT_S", "20")))


def init_groups() -> tuple[Any, Any]:
    """The hfreduce group and a gloo group over the same ranks, set up the way TEST_INIT says."""
    how = os.environ.get("TEST_INIT", "hfreduce")
    if how == "new_group":
        dist.init_process_group("gloo", rank=RANK, world_size=WORLD, timeout=TIMEOUT)
        return dist.new_group(backend="hfreduce"), dist.group.WORLD
    dist.init_process_group(how, rank=RANK, world_size=WORLD, timeout=TIMEOUT)
    return dist.group.WORLD, dist.new_group(backend="gloo")


def check_rendezvous() -> dict[str, Any]:
    """group_from_store on the default store, as haiscale does: layout and an allreduce."""
    from hfreduce.distributed import join_store

    store = dist.distributed_c10d._get_default_store()
    with tempfile.TemporaryDirectory() as tmp:  # where the control server's address is written (for an agent)
        control_file = os.path.join(tmp, "control.json")
        env = {**os.environ, "FF_HFREDUCE_CONTROL_FILE": control_file}
        group, layout = join_store(store, RANK, WORLD, prefix="test-a", timeout_s=20, env=env)
        with open(control_file) as f:
            written = json.load(f)
    buf = torch.full((1000,), float(RANK + 1))
    group.allreduce(buf)
    report = {
        "hf_rank": group.rank,
        "node_rank": group.config.node_rank,
        "local_rank": group.config.local_rank,
        "num_nodes": group.config.num_nodes,
        "local_world_size": group.config.local_world_size,
        "sum": buf.tolist()[:3],
        "torch_ranks": list(layout.torch_ranks),
        "control_written": written,
        "control": {"addr": group.config.master_addr, "port": group.config.master_port},
    }
    group.close()
    return report


def scenario_layout() -> dict[str, Any]:
    """Everything one layout shows, in one launch: rendezvous, collectives against gloo, DDP."""
    hf, gloo = init_groups()
    report: dict[str, Any] = {"backend": dist.get_backend(hf), "seconds": {}}
    parts = {
        "rendezvous": check_rendezvous,
        "collectives": lambda: collectives.compare(hf, gloo, RANK, WORLD),
        "errors": lambda: collectives.unsupported(hf, RANK, WORLD),
        "ddp": lambda: ddp.train_and_compare(hf, RANK, WORLD),
    }
    wanted = os.environ.get("TEST_PARTS", ",".join(parts)).split(",")
    for name, part in parts.items():
        if name not in wanted:
            continue
        start = time.monotonic()
        report[name] = part()
        report["seconds"][name] = round(time.monotonic() - start, 2)
    dist.barrier(group=gloo)
    dist.destroy_process_group()
    return report


def scenario_rendezvous_missing() -> dict[str, Any]:
    """WORLD_SIZE counts one rank more than is launched: the others raise RendezvousError naming it."""
    from hfreduce import RendezvousError
    from hfreduce.distributed import group_from_store

    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        WORLD,
        RANK == 0,
        timeout=TIMEOUT,
        wait_for_workers=False,
    )
    store.set(f"started/{RANK}", "1")  # the launched ranks wait for each other, however slow their start
    store.wait([f"started/{r}" for r in range(WORLD - 1)], TIMEOUT)
    start = time.monotonic()
    try:
        group_from_store(store, RANK, WORLD, timeout_s=1.0)
    except RendezvousError as exc:
        return {
            "error": type(exc).__name__,
            "message": str(exc),
            "missing": list(exc.missing_ranks),
            "elapsed_s": time.monotonic() - start,
        }
    return {"error": None}


def scenario_kill() -> dict[str, Any]:
    """DDP on hfreduce; rank TEST_VICTIM SIGKILLs itself in the middle of step 2's backward."""
    import signal

    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    victim = int(os.environ["TEST_VICTIM"])
    import torch._dynamo  # DDP imports it: seconds on a loaded machine, so before the group's clock runs

    dist.init_process_group("hfreduce", rank=RANK, world_size=WORLD, timeout=TIMEOUT)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(256, 1024), nn.Tanh(), nn.Linear(1024, 256))
    ddp = DistributedDataParallel(net, bucket_cap_mb=1)
    step = {"n": 0}

    def die(grad: torch.Tensor) -> torch.Tensor:
        if victim == RANK and step["n"] == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return grad

    net[0].weight.register_hook(die)  # the first layer's gradient comes last: the later buckets are in flight
    x = torch.randn(8, 256)
    start = time.monotonic()
    try:
        for n in range(6):
            step["n"] = n
            start = time.monotonic()
            ddp(x).square().mean().backward()
    except Exception as exc:
        return {
            "error": type(exc).__name__,
            "message": str(exc),
            "step": step["n"],
            "elapsed_s": time.monotonic() - start,
        }
    return {"error": None}


def scenario_peer_gone() -> dict[str, Any]:
    """Rank 1 sends rank 0 one message and exits; rank 0's next ``dist.recv`` and ``dist.all_reduce`` must raise
    naming it (``Work.wait()`` raises the failure), not return with the buffers unchanged."""
    dist.init_process_group("hfreduce", rank=RANK, world_size=WORLD, timeout=TIMEOUT)
    if RANK == 1:
        dist.send(torch.ones(2), 0)
        os._exit(0)
    first = torch.zeros(2)
    dist.recv(first, 1)
    report: dict[str, Any] = {"first": first.tolist()}
    for name, call in (
        ("recv", lambda: dist.recv(torch.zeros(2), 1)),
        ("all_reduce", lambda: dist.all_reduce(torch.ones(2))),
    ):
        start = time.monotonic()
        try:
            call()
            report[name] = "returned"
        except Exception as exc:
            report[name] = f"{type(exc).__name__}: {exc}"
        report[f"{name} elapsed_s"] = time.monotonic() - start
    return report


SCENARIOS: dict[str, Callable[[], dict[str, Any]]] = {
    name.removeprefix("scenario_"): fn for name, fn in globals().items() if name.startswith("scenario_")
}


def main() -> None:
    scenario, out = sys.argv[1], sys.argv[2]
    try:
        report = SCENARIOS[scenario]()
    except BaseException as exc:
        report = {"crash": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    with open(out, "w") as f:
        json.dump(report, f)
    os._exit(0)  # do not wait for torch's or hfreduce's background threads


if __name__ == "__main__":
    main()
