"""``python -m ff_telemetry``: load config, set up logging, serve until SIGTERM."""

from __future__ import annotations

import sys

from ff_rpc.entry import run_service
from ff_telemetry.config import ENV_PREFIX, TelemetrySettings
from ff_telemetry.server import main


def run(argv: list[str] | None = None) -> int:
    """Run the collector with settings from ``argv`` and ``FF_TELEMETRY_*``; returns the process exit code."""
    return run_service(
        service="telemetry",
        description="fireflyer telemetry collector",
        model=TelemetrySettings,
        env_prefix=ENV_PREFIX,
        main=main,
        argv=argv,
    )


if __name__ == "__main__":
    sys.exit(run())
