"""``python -m ff_mgmtd``: load config, set up logging, serve until SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path

from ff_config import ConfigError, add_settings_arguments, describe_settings, load_settings, overrides_from_args
from ff_mgmtd.config import ENV_PREFIX, MgmtdSettings
from ff_mgmtd.server import main
from ff_rpc import configure_logging

logger = logging.getLogger("ff_mgmtd")


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ff-mgmtd", description="fireflyer cluster manager")
    parser.add_argument("--config", type=Path, default=None, help=f"TOML config file (or {ENV_PREFIX}CONFIG)")
    add_settings_arguments(parser, MgmtdSettings)
    args = parser.parse_args(argv)
    try:
        settings = load_settings(
            MgmtdSettings, env_prefix=ENV_PREFIX, environ=os.environ, config_file=args.config,
            overrides=overrides_from_args(args, MgmtdSettings),
        )  # fmt: skip
    except ConfigError as exc:
        print(f"ff-mgmtd: {exc}", file=sys.stderr)
        return 2
    configure_logging("mgmtd", settings.log_level)
    logger.info("starting", extra={"config": describe_settings(settings)})
    if warning := settings.failover_warning():
        logger.warning(warning)
    asyncio.run(main(settings))
    return 0


if __name__ == "__main__":
    sys.exit(run())
