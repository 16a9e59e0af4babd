"""haiscale.checkpoint on a real 3FS cluster: save and load throughput against the hf3fs client's sequential
write and read of the same bytes, and a training step's time while an async save runs against without.

One run starts a real cluster (mgmtd, three storage services with chains of 3, one meta service, as processes
on this machine, state under ``--dir``) and, each round, in an order that rotates from round to round:

- ``save``: ``ckpt.save(..., blocking=True)`` of a state of ``--size-mib`` MiB (an MLP's parameters and two
  Adam-like moments, a few dozen tensors), snapshot, checksums, batch writes, manifest and rename included;
  ``seq write``: the same number of bytes written to one file with ``fs.open(..., "wb")`` in 4 MiB writes
  and closed (the client's sequential path, as in bench/hf3fs_sequential.py);
- ``load``: ``ckpt.load`` of that checkpoint into the same tensors (in place: batch reads straight into them,
  checksums checked);
  ``seq read``: the file read back with ``readinto`` into a reused 4 MiB buffer;
- ``steps``: ``--steps`` training steps of a small MLP (``--step-mib`` MiB of parameters) timed alone, and the
  same steps with an async save of the MLP's state started before them (the steps run while it is written);
  ``steps writing``: the same steps while a thread writes as many bytes with the client's sequential write
  (no checkpoint manager: what 3FS itself costs the steps while the same bytes go in, the bound of the
  step ratio any checkpointer into 3FS reaches on this machine).

    .venv/bin/python bench/checkpoint.py                        # 256 MiB, 3 rounds
    .venv/bin/python bench/checkpoint.py --size-mib 128 --rounds 5 --dir /work/tmp

Prints the median MiB/s of each, the median of per-round ratios save/seq write and load/seq read (goal
>= 0.7), and the median per-round ratio of the step time with a save in flight to without (goal <= 1.15). For
each, also the CPU seconds it cost this process (trainer and client) and the cluster's processes (from /proc):
on this machine the servers share the trainer's cores, on a cluster they are other machines.

For the steps, the kernel's schedstat of the training thread splits their wall time into on CPU, waiting in
the run queue for a CPU, and off CPU (the GIL, a lock, I/O); the step's own time ratio (on + off CPU, with a
save / alone) is what the save costs the step when the step is not kept from a CPU by other processes (here:
the cluster's servers and other work on the machine).

``--keep-buffer`` saves with ``keep_buffer=True`` (each snapshot into the host buffer the previous one kept).

``--pin`` runs the cluster's processes on the last CPU and this process (training steps with one thread fewer,
the client, the save's thread) on the others: what the training steps lose to a save then is the client's own
cost, as with the servers on other machines.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from _hf3fs_common import bench_cluster

from haiscale import checkpoint as ckpt

MIB = 1 << 20
BLOCK = 4 * MIB


def state_of(size: int) -> dict[str, Any]:
    """About ``size`` bytes of fp32: 16 layers of weights and biases and two moments of each."""
    per_tensor = size // (16 * 3) // 4
    cols = 1024
    rows = max(1, per_tensor // cols)
    g = torch.Generator().manual_seed(0)
    layers = {f"l{i}": {"w": torch.randn(rows, cols, generator=g), "b": torch.randn(cols, generator=g)}
              for i in range(16)}  # fmt: skip
    moments = {f"l{i}.{m}": torch.randn(rows, cols, generator=g) for i in range(16) for m in ("m", "v")}
    return {"model": layers, "moments": moments, "step": 1}


def nbytes(state: dict[str, Any]) -> int:
    total = 0
    for v in state.values():
        if isinstance(v, dict):
            total += nbytes(v)
        elif isinstance(v, torch.Tensor):
            total += v.numel() * v.element_size()
    return total


def timed(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main_thread_sched() -> tuple[float, float]:
    """(on CPU, waiting in the run queue) seconds of the calling thread so far, from the kernel's schedstat."""
    with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
        on_cpu, waiting, _ = f.read().split()
    return int(on_cpu) / 1e9, int(waiting) / 1e9


@dataclass
class StepWindow:
    """Where the wall time of the timed steps went (seconds over all of them)."""

    wall: float
    main_cpu: float  # the training thread on a CPU
    main_runq: float  # the training thread runnable, waiting for a CPU
    others_cpu: float  # this process's other threads (torch's workers, the save's thread, the client's loop)
    cluster_cpu: float  # the cluster's processes

    @property
    def main_off_cpu(self) -> float:
        """Neither running nor runnable: waiting for the GIL, a lock or I/O."""
        return self.wall - self.main_cpu - self.main_runq


class Runner:
    def __init__(self, fs: Any, size_mib: int, step_mib: int, steps: int, cluster_cpu: Callable[[], float]) -> None:
        self.fs = fs
        self.cluster_cpu = cluster_cpu
        self.keep_buffer = False
        self.windows: dict[str, list[StepWindow]] = {"steps_saving": [], "steps_alone": [], "steps_writing": []}
        self.state = state_of(size_mib * MIB)
        self.size = nbytes(self.state)
        self.payload = memoryview(torch.randn(BLOCK // 4).numpy().tobytes())
        self.buf = memoryview(bytearray(BLOCK))
        self.step_no = 0
        self.steps = steps
        width = int((step_mib * MIB / 4 / 4) ** 0.5)
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(4)))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-4)
        self.x = torch.randn(32, width)

    def save(self) -> float:
        self.step_no += 1
        return timed(lambda: ckpt.save("hf3fs:///bench/ckpt", self.state, step=self.step_no, keep=1, fs=self.fs,
                                       blocking=True, keep_buffer=self.keep_buffer) and None)  # fmt: skip

    def seq_write(self) -> float:
        return timed(lambda: self._write("/bench/seq.bin", self.size))

    def _write(self, path: str, size: int) -> None:
        """``size`` bytes into a new file ``path``, in 4 MiB writes (the client's sequential path)."""
        with self.fs.open(path, "wb") as f:
            done = 0
            while done < size:
                n = min(BLOCK, size - done)
                f.write(self.payload[:n])
                done += n

    def load(self) -> float:
        return timed(lambda: ckpt.load("hf3fs:///bench/ckpt", self.state, fs=self.fs) and None)

    def seq_read(self) -> float:
        def run() -> None:
            with self.fs.open("/bench/seq.bin", "rb", buffering=0) as f:
                while f.readinto(self.buf):
                    pass

        return timed(run)

    def _train(self, name: str) -> float:
        (cpu0, runq0), proc0, cluster0 = main_thread_sched(), time.process_time(), self.cluster_cpu()
        t0 = time.perf_counter()
        for _ in range(self.steps):
            loss = self.model(self.x).square().mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
        wall = time.perf_counter() - t0
        (cpu1, runq1), proc1, cluster1 = main_thread_sched(), time.process_time(), self.cluster_cpu()
        others = proc1 - proc0 - (cpu1 - cpu0)
        self.windows[name].append(StepWindow(wall, cpu1 - cpu0, runq1 - runq0, others, cluster1 - cluster0))
        return wall / self.steps

    def steps_alone(self) -> float:
        return self._train("steps_alone")

    def steps_saving(self) -> float:
        """Mean step time of steps run while an async save of the state is written."""
        self.step_no += 1
        state = {"model": self.model.state_dict(), "big": self.state}
        handle = ckpt.save("hf3fs:///bench/train", state, step=self.step_no, keep=1, fs=self.fs,
                           keep_buffer=self.keep_buffer)  # fmt: skip
        mean = self._train("steps_saving")
        if not handle.done():
            print("  (the save outlasted the steps)", flush=True)
        handle.wait()
        return mean

    def steps_writing(self) -> float:
        """Mean step time of steps run while the client writes as many bytes as ``steps_saving``'s save to a file."""
        size = self.size + nbytes({"model": self.model.state_dict()})
        writer = threading.Thread(target=self._write, args=("/bench/train-seq.bin", size))
        writer.start()
        mean = self._train("steps_writing")
        if writer.is_alive():
            print("  (the write outlasted the steps)", flush=True)
        writer.join()
        return mean


def pin(pid: int, cpus: set[int]) -> None:
    """Run every thread of process ``pid`` (and the threads it starts later) on ``cpus``."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(tid), cpus)


def cluster_cpu_s(c: Any) -> float:
    return float(sum(c.cpu_s().values()))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-mib", type=int, default=256)
    p.add_argument("--step-mib", type=int, default=16, help="MiB of parameters of the trained MLP")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dir", type=Path, default=None, help="where the cluster lives")
    p.add_argument("--pin", action="store_true", help="the cluster on the last CPU, this process on the others")
    p.add_argument("--keep-buffer", action="store_true", help="saves with keep_buffer=True (a warm host buffer)")
    a = p.parse_args()
    with bench_cluster("ckpt-bench-", a.dir, with_mount=False) as c:
        if a.pin:
            cpus = sorted(os.sched_getaffinity(0))
            if len(cpus) < 2:
                p.error("--pin needs at least 2 CPUs")
            for pid in c.pids.values():
                pin(pid, {cpus[-1]})
            pin(os.getpid(), set(cpus[:-1]))
            torch.set_num_threads(len(cpus) - 1)
            print(f"pinned: cluster on CPU {cpus[-1]}, this process on {cpus[:-1]} ({len(cpus) - 1} torch threads)")
        r = Runner(c.fs, a.size_mib, a.step_mib, a.steps, lambda: cluster_cpu_s(c))
        r.keep_buffer = a.keep_buffer
        mib = r.size / MIB
        print(f"{mib:.0f} MiB in {sum(1 for _ in ckpt_leaves(r.state))} tensors, {a.rounds} rounds, state in {c.root}")
        pairs = [("save", "seq_write"), ("load", "seq_read"), ("steps_saving", "steps_alone", "steps_writing")]
        times: dict[str, list[float]] = {k: [] for pair in pairs for k in pair}
        cpu: dict[str, list[tuple[float, float]]] = {k: [] for k in times}  # (this process, cluster) CPU s
        r.seq_write()  # the file seq_read reads
        r.save()  # the checkpoint load reads
        for i in range(a.rounds):
            line = []
            for pair in pairs[i % 3 :] + pairs[: i % 3]:
                for name in pair if i % 2 == 0 else pair[::-1]:
                    own, cluster = time.process_time(), cluster_cpu_s(c)
                    times[name].append(getattr(r, name)())
                    cpu[name].append((time.process_time() - own, cluster_cpu_s(c) - cluster))
                    line.append(f"{name} {times[name][-1]:.3f}s")
            print(f"round {i + 1}: " + " | ".join(line) + f" | load average {os.getloadavg()[0]:.1f}", flush=True)
        print("\nmedians:")
        for a_, b_ in pairs[:2]:
            ratio = statistics.median(b / x for x, b in zip(times[a_], times[b_], strict=True))
            print(f"  {a_:<5} {mib / statistics.median(times[a_]):8.1f} MiB/s   {b_:<9} "
                  f"{mib / statistics.median(times[b_]):8.1f} MiB/s   ratio x{ratio:.3f} (goal >= 0.7)")  # fmt: skip
        ratio = statistics.median(x / b for x, b in zip(times["steps_saving"], times["steps_alone"], strict=True))
        print(f"  step {1e3 * statistics.median(times['steps_alone']):.1f} ms alone, "
              f"{1e3 * statistics.median(times['steps_saving']):.1f} ms with a save in flight: "
              f"x{ratio:.3f} (goal <= 1.15)")  # fmt: skip
        bound = statistics.median(x / b for x, b in zip(times["steps_writing"], times["steps_alone"], strict=True))
        print(f"  step {1e3 * statistics.median(times['steps_writing']):.1f} ms while the client writes as many "
              f"bytes (no checkpoint manager): x{bound:.3f} of alone, the bound of the ratio above here")  # fmt: skip
        print("CPU seconds per operation (medians; steps: the steps and the save's snapshot and wait):")
        for name, pairs_ in cpu.items():
            print(f"  {name:<12} this process {statistics.median(x for x, _ in pairs_):6.3f}  "
                  f"cluster {statistics.median(y for _, y in pairs_):6.3f}")  # fmt: skip
        print_step_windows(r.windows, a.steps)
    return 0


def print_step_windows(windows: dict[str, list[StepWindow]], steps: int) -> None:
    """Where the steps' time went, alone and with a save in flight, and the step's own time ratio."""
    print("the training thread per step (ms, medians over rounds; from /proc schedstat):")
    fields = ("wall", "main_cpu", "main_runq", "main_off_cpu", "others_cpu", "cluster_cpu")
    print("  " + " " * 13 + "".join(f"{f:>14}" for f in fields))
    for name, ws in windows.items():
        cells = "".join(f"{1e3 * statistics.median(getattr(w, f) for w in ws) / steps:14.1f}" for f in fields)
        print(f"  {name:<13}{cells}")
    own = statistics.median(
        (s.main_cpu + s.main_off_cpu) / (a.main_cpu + a.main_off_cpu)
        for s, a in zip(windows["steps_saving"], windows["steps_alone"], strict=True)
    )
    print(f"  the step's own time (on CPU + off CPU, run-queue waits left out), with a save / alone: x{own:.3f}")


def ckpt_leaves(state: dict[str, Any]) -> Any:
    for v in state.values():
        if isinstance(v, dict):
            yield from ckpt_leaves(v)
        elif isinstance(v, torch.Tensor):
            yield v


if __name__ == "__main__":
    sys.exit(main())
