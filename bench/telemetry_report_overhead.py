"""A training step with ``hfai.telemetry.report`` vs without: the reporting step's time over the plain one
(goal <= 1.02x).

The collector runs as in ``telemetry_ingest.py`` (its ``--serve`` process: mgmtd and the real collector on
SQLite), so the samples really go out: this process's background pusher sends them while it trains. The
step is a small torch MLP (``--width``, batch ``--batch``, SGD) on CPU; the reporting variant adds one line,
``telemetry.report(step=i, loss=loss.item(), tokens_per_s=...)`` (``loss.item()`` is in both variants, as any
loop that logs its loss has it). Rounds of ``--steps`` steps alternate which variant goes first; the figure
is the median of the per-round ratios, of wall time and of this process's CPU time (the pusher's thread
included; less disturbed than wall time on a shared machine). The samples the collector acknowledged are
printed at the end.

    .venv/bin/python bench/telemetry_report_overhead.py                    # 7 rounds of 300 steps
    .venv/bin/python bench/telemetry_report_overhead.py --rounds 9 --steps 500 --width 512
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from telemetry_ingest import bench_server


def train_block(
    model: Any, opt: Any, data: Any, target: Any, steps: int, first: int, report: bool
) -> tuple[float, float]:
    """Wall seconds and CPU seconds of this process (the pusher's thread included) per step."""
    import torch

    from hfai import telemetry

    tokens = data.shape[0]
    start, cpu = time.perf_counter(), time.process_time()
    for i in range(first, first + steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(data), target)
        loss.backward()
        opt.step()
        value = loss.item()
        if report:
            telemetry.report(step=i, loss=value, tokens_per_s=tokens / (time.perf_counter() - t0))
    return (time.perf_counter() - start) / steps, (time.process_time() - cpu) / steps


def run(args: argparse.Namespace) -> None:
    import torch

    from hfai import telemetry

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)  # a rank on its own cores; more threads only add noise on a busy host
    model = torch.nn.Sequential(
        torch.nn.Linear(args.width, args.width), torch.nn.ReLU(), torch.nn.Linear(args.width, args.width)
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    data, target = torch.randn(args.batch, args.width), torch.randn(args.batch, args.width)
    step = 0
    for report in (False, True):  # warm up both (and start the pusher)
        train_block(model, opt, data, target, 50, step, report)
        step += 50
    reporter = telemetry._Process.reporter
    thread = reporter.pusher._thread if reporter is not None and reporter.pusher is not None else None
    clock = time.pthread_getcpuclockid(thread.ident) if thread is not None and thread.ident else None
    push_cpu0, wall0 = (time.clock_gettime(clock) if clock is not None else 0.0), time.perf_counter()
    pushed0 = reporter.pusher.pusher.num_pushed if reporter and reporter.pusher and reporter.pusher.pusher else 0
    wall, cpu = [], []
    for r in range(args.rounds):
        got = {}
        for report in (False, True) if r % 2 == 0 else (True, False):
            got[report] = train_block(model, opt, data, target, args.steps, step, report)
            step += args.steps
        wall.append(got[True][0] / got[False][0])
        cpu.append(got[True][1] / got[False][1])
        print(f"round {r + 1}: plain {got[False][0] * 1e3:.3f} ms/step ({got[False][1] * 1e3:.3f} ms CPU), reporting "
              f"{got[True][0] * 1e3:.3f} ms/step ({got[True][1] * 1e3:.3f} ms CPU), ratio {wall[-1]:.4f} "
              f"(CPU {cpu[-1]:.4f})")  # fmt: skip
    print(f"median ratio reporting/plain over {args.rounds} rounds: wall {statistics.median(wall):.4f}, "
          f"CPU {statistics.median(cpu):.4f} (goal <= 1.02)")  # fmt: skip
    if clock is not None and reporter is not None and reporter.pusher is not None and reporter.pusher.pusher:
        push_cpu, elapsed = time.clock_gettime(clock) - push_cpu0, time.perf_counter() - wall0
        num = reporter.pusher.pusher.num_pushed - pushed0
        print(f"the push thread over the rounds: {push_cpu / elapsed * 1e3:.2f} ms CPU per second, "
              f"{push_cpu / max(num, 1) * 1e6:.1f} us per sample pushed ({num:,} samples)")  # fmt: skip
    telemetry.flush(10.0)
    pusher = reporter.pusher.pusher if reporter is not None and reporter.pusher is not None else None
    if pusher is not None:
        print(f"samples pushed to the collector: {pusher.num_pushed:,}; dropped: {pusher.buffer.dropped:,}")
    per_call = []
    for _ in range(5):  # the caller's side alone (append to the buffer; 50,000 calls overflow it: dropped)
        cpu = time.process_time()
        for i in range(10_000):
            telemetry.report(step=i, loss=0.5, tokens_per_s=1000.0)
        per_call.append((time.process_time() - cpu) / 10_000)
    print(f"report() with 3 metrics: median {statistics.median(per_call) * 1e6:.1f} us CPU per call")
    telemetry.flush(0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--dir", type=Path, default=None, help="where the server keeps its state (default: a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp, bench_server(Path(tmp)) as (info, _):
        # What the agent gives a rank: where telemetry is, the token, the rank's labels.
        os.environ.update({
            "FF_TELEMETRY_ADDRESS": info["telemetry"], "FF_TOKEN": info["token"],
            "FF_TELEMETRY_LABELS": json.dumps({"task_id": "1", "run_id": "1", "rank": "0", "node": "bench"}),
        })  # fmt: skip
        run(args)


if __name__ == "__main__":
    main()
