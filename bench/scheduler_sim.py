"""Simulator report: FIFO, priority without preemption, HAI's time-sharing as its matcher does it
(``hai-classic``) and time-sharing with the fewest victims, suspended tasks resumed first (``hai``), on
one synthetic trace and seed, through the scheduler's own tick pipeline (``core.tick.plan_tick``).

Usage: python bench/scheduler_sim.py [--jobs 2000] [--nodes 128] [--load 1.1] [--seed 1] [--failures SCALE]
[--json] (any flag of ``ff-sched-sim`` is passed through; ``--failures 1`` adds Fire-Flyer 2's failure
arrivals, paper Tables VII and VIII). Prints the figures and time-sharing's ratios to the others; the
figures are deterministic for a seed (no timing), so the machine's load does not change them.
"""

from __future__ import annotations

import sys

from ff_scheduler.sim.__main__ import run

DEFAULTS = ["--jobs", "2000", "--nodes", "128", "--load", "1.1", "--seed", "1"]

if __name__ == "__main__":
    sys.exit(run([*DEFAULTS, *sys.argv[1:]]))
