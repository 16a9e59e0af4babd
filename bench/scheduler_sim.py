"""Simulator report: FIFO without preemption vs HAI time-sharing (and priority without preemption) on one
synthetic trace and seed, through the scheduler's own assigner and matcher.

Usage: python bench/scheduler_sim.py [--jobs 2000] [--nodes 128] [--load 1.1] [--seed 1] [--json]
(any flag of ``ff-sched-sim`` is passed through). Prints figures and the time-sharing/FIFO ratios.
"""

from __future__ import annotations

import sys

from ff_scheduler.sim.__main__ import run

DEFAULTS = ["--jobs", "2000", "--nodes", "128", "--load", "1.1", "--seed", "1"]

if __name__ == "__main__":
    sys.exit(run([*DEFAULTS, *sys.argv[1:]]))
