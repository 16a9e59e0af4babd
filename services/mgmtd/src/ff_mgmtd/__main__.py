"""``python -m ff_mgmtd``: load config, set up logging, serve until SIGTERM."""

from __future__ import annotations

import sys

from ff_mgmtd.config import ENV_PREFIX, MgmtdSettings
from ff_mgmtd.server import main
from ff_rpc.entry import run_service


def run(argv: list[str] | None = None) -> int:
    """Run mgmtd with settings from ``argv`` and ``FF_MGMTD_*``; returns the process exit code."""
    return run_service(
        service="mgmtd",
        description="fireflyer cluster manager",
        model=MgmtdSettings,
        env_prefix=ENV_PREFIX,
        main=main,
        argv=argv,
        warnings=lambda s: [s.failover_warning()],
    )


if __name__ == "__main__":
    sys.exit(run())
