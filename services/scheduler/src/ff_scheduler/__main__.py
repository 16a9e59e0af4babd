"""``python -m ff_scheduler``: load config, set up logging, serve until SIGTERM."""

from __future__ import annotations

import sys

from ff_rpc.entry import run_service
from ff_scheduler.config import ENV_PREFIX, SchedulerSettings
from ff_scheduler.server import main


def run(argv: list[str] | None = None) -> int:
    """Run the scheduler with settings from ``argv`` and ``FF_SCHEDULER_*``; returns the process exit code."""
    return run_service(
        service="scheduler",
        description="fireflyer time-sharing scheduler",
        model=SchedulerSettings,
        env_prefix=ENV_PREFIX,
        main=main,
        argv=argv,
    )


if __name__ == "__main__":
    sys.exit(run())
