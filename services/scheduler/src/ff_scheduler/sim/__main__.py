"""``ff-sched-sim``: compare scheduling policies on one job trace (CSV or synthetic), side by side."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ff_scheduler.core.policy import LifecyclePolicy
from ff_scheduler.sim.engine import SimConfig, Simulation
from ff_scheduler.sim.failures import FailureModel
from ff_scheduler.sim.report import POLICIES, Figures, figures, render
from ff_scheduler.sim.trace import Job, SyntheticTrace, TraceError, read_csv, write_csv


def _build_parser() -> argparse.ArgumentParser:
    """The simulator's command line: a trace (CSV or synthetic), the cluster, and the policies to compare."""
    p = argparse.ArgumentParser(prog="ff-sched-sim", description=__doc__)
    p.add_argument("--trace", type=Path, help="CSV trace (job_id,submit_s,num_nodes,duration_s,priority,user)")
    p.add_argument("--jobs", type=int, default=1000, help="synthetic: number of jobs")
    p.add_argument("--load", type=float, default=1.1, help="synthetic: offered load (node-time asked / available)")
    p.add_argument("--mean-duration-s", type=float, default=3600.0, help="synthetic: mean job duration")
    p.add_argument("--users", type=int, default=8, help="synthetic: number of users")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--nodes", type=int, default=64)
    p.add_argument("--zones", type=int, default=1)
    p.add_argument("--policies", default=",".join(POLICIES), help=f"comma-separated, of {', '.join(POLICIES)}")
    p.add_argument("--suspend-overhead-s", type=float, default=30.0, help="time to checkpoint when suspended")
    p.add_argument("--restart-overhead-s", type=float, default=60.0, help="time a resumed run reloads")
    p.add_argument("--checkpoint-interval-s", type=float, default=300.0, help="a run checkpoints this often (0: never)")
    p.add_argument(
        "--failures",
        type=float,
        default=0.0,
        metavar="SCALE",
        help="node and link failures at SCALE x Fire-Flyer 2's rates (paper Tables VII, VIII); 0: none",
    )
    p.add_argument("--repair-s", type=float, default=3600.0, help="how long a failed node is gone")
    p.add_argument("--save-trace", type=Path, help="write the trace used to this CSV")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    return p


def _load_jobs(args: argparse.Namespace) -> list[Job]:
    """The jobs of the CSV trace given, else of a synthetic trace from the arguments; TraceError for a bad file."""
    if args.trace is not None:
        return read_csv(args.trace)
    synthetic = SyntheticTrace(
        num_jobs=args.jobs,
        num_nodes=args.nodes,
        load=args.load,
        mean_duration_s=args.mean_duration_s,
        num_users=args.users,
    )
    return synthetic.generate(args.seed)


def _compare(jobs: list[Job], names: list[str], config: SimConfig) -> list[Figures]:
    """Simulate each named policy over the same jobs and return their figures, in order."""
    life = LifecyclePolicy(ack_window_s=5.0, default_grace_s=max(60.0, config.suspend_overhead_s * 2))
    return [figures(Simulation(jobs, POLICIES[n], life, config, n).run()) for n in names]


def run(argv: list[str] | None = None) -> int:
    """Run the simulator and print the comparison table; returns the exit code (2: bad arguments or trace)."""
    args = _build_parser().parse_args(argv)
    names = [n.strip() for n in args.policies.split(",") if n.strip()]
    unknown = [n for n in names if n not in POLICIES]
    if unknown or not names:
        print(f"ff-sched-sim: unknown policies {unknown}; known: {', '.join(POLICIES)}", file=sys.stderr)
        return 2
    try:
        jobs = _load_jobs(args)
    except (OSError, TraceError) as exc:
        print(f"ff-sched-sim: {exc}", file=sys.stderr)
        return 2
    too_big = [j.job_id for j in jobs if j.num_nodes > args.nodes]
    if too_big:
        print(f"ff-sched-sim: jobs {too_big[:5]} need more than {args.nodes} nodes", file=sys.stderr)
        return 2
    if args.save_trace is not None:
        write_csv(args.save_trace, jobs)
    if not args.checkpoint_interval_s >= 0:
        print(f"ff-sched-sim: --checkpoint-interval-s must be >= 0, not {args.checkpoint_interval_s}", file=sys.stderr)
        return 2
    try:
        failures = FailureModel(scale=args.failures, repair_s=args.repair_s) if args.failures else None
    except ValueError as exc:
        print(f"ff-sched-sim: {exc}", file=sys.stderr)
        return 2
    config = SimConfig(
        num_nodes=args.nodes,
        num_zones=args.zones,
        suspend_overhead_s=args.suspend_overhead_s,
        restart_overhead_s=args.restart_overhead_s,
        checkpoint_interval_s=args.checkpoint_interval_s,
        failures=failures,
        failure_seed=args.seed,
    )
    results = _compare(jobs, names, config)
    if args.json:
        print(json.dumps([f.as_dict() for f in results], indent=2))
    else:
        failing = f", failures at {args.failures:g}x the paper's rates" if failures else ""
        print(f"{len(jobs)} jobs on {args.nodes} nodes (seed {args.seed}{failing})\n")
        print(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(run())
