"""``python -m ff_scheduler``: load config, set up logging, serve until SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path

from ff_config import ConfigError, add_settings_arguments, describe_settings, load_settings, overrides_from_args
from ff_rpc import configure_logging
from ff_scheduler.config import ENV_PREFIX, SchedulerSettings
from ff_scheduler.server import main

logger = logging.getLogger("ff_scheduler")


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ff-scheduler", description="fireflyer time-sharing scheduler")
    parser.add_argument("--config", type=Path, default=None, help=f"TOML config file (or {ENV_PREFIX}CONFIG)")
    add_settings_arguments(parser, SchedulerSettings)
    args = parser.parse_args(argv)
    try:
        settings = load_settings(
            SchedulerSettings,
            env_prefix=ENV_PREFIX,
            environ=os.environ,
            config_file=args.config,
            overrides=overrides_from_args(args, SchedulerSettings),
        )
    except ConfigError as exc:
        print(f"ff-scheduler: {exc}", file=sys.stderr)
        return 2
    configure_logging("scheduler", settings.log_level)
    logger.info("starting", extra={"config": describe_settings(settings)})
    asyncio.run(main(settings))
    return 0


if __name__ == "__main__":
    sys.exit(run())
