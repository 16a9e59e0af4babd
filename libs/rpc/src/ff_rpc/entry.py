"""The ``__main__`` of every service: flags and settings, JSON logs, the settings logged masked, ``asyncio.run``."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from ff_config import (
    ConfigError,
    SettingsModel,
    add_settings_arguments,
    describe_settings,
    load_settings,
    overrides_from_args,
)
from ff_rpc.logs import configure_logging

SettingsT = TypeVar("SettingsT", bound=SettingsModel)


def run_service(
    *,
    service: str,
    description: str,
    model: type[SettingsT],
    env_prefix: str,
    main: Callable[[SettingsT], Coroutine[Any, Any, None]],
    argv: list[str] | None = None,
    warnings: Callable[[SettingsT], list[str]] | None = None,
) -> int:
    """Run one service process until it stops; exit code 2 for a configuration error.

    Args:
        service: short name (``mgmtd``): the program is ``ff-<service>``, logs carry ``service``.
        description: the ``--help`` text.
        model: the service's settings; every field is also a ``--flag`` and an ``<env_prefix>`` variable.
        env_prefix: e.g. ``FF_MGMTD_``.
        main: the service, given its settings.
        argv: the arguments (default: the command line).
        warnings: settings that are valid but risky, logged as warnings at start.
    """
    prog = f"ff-{service}"
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--config", type=Path, default=None, help=f"TOML config file (or {env_prefix}CONFIG)")
    add_settings_arguments(parser, model)
    args = parser.parse_args(argv)
    try:
        settings = load_settings(
            model,
            env_prefix=env_prefix,
            environ=os.environ,
            config_file=args.config,
            overrides=overrides_from_args(args, model),
        )
    except ConfigError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    configure_logging(service, str(getattr(settings, "log_level", "INFO")))
    logger = logging.getLogger(f"ff_{service}")
    logger.info("starting", extra={"config": describe_settings(settings)})
    for warning in warnings(settings) if warnings else []:
        if warning:
            logger.warning(warning)
    asyncio.run(main(settings))
    # The service has stopped; what is left is the interpreter's teardown, whose garbage collection of every
    # object a service holds (grpc, protobuf, sqlalchemy) took 1-3 s per process on a loaded 2-core machine,
    # and `fireflyer down` waits for each process to exit. Frozen objects are skipped by that collection; the
    # exit handlers still run.
    gc.freeze()
    return 0
