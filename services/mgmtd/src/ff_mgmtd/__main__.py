"""``python -m ff_mgmtd``: load config, set up logging, serve until SIGTERM."""

from __future__ import annotations

import logging
import sys

from ff_mgmtd.bootstrap import BootstrapAdminError
from ff_mgmtd.config import ENV_PREFIX, MgmtdSettings
from ff_mgmtd.server import main
from ff_rpc.entry import run_service

logger = logging.getLogger("ff_mgmtd")
EXIT_CONFIG_ERROR = 2  # what run_service returns for a setting it refuses


async def _main(settings: MgmtdSettings) -> None:
    """``main``; a bootstrap admin token that cannot be used ends the process as a configuration error does."""
    try:
        await main(settings)
    except BootstrapAdminError as err:
        logger.error("%s", err)
        raise SystemExit(EXIT_CONFIG_ERROR) from None


def run(argv: list[str] | None = None) -> int:
    """Run mgmtd with settings from ``argv`` and ``FF_MGMTD_*``; returns the process exit code."""
    return run_service(
        service="mgmtd",
        description="fireflyer cluster manager",
        model=MgmtdSettings,
        env_prefix=ENV_PREFIX,
        main=_main,
        argv=argv,
        warnings=lambda s: [s.failover_warning()],
    )


if __name__ == "__main__":
    sys.exit(run())
