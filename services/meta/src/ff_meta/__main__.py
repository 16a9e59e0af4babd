"""``python -m ff_meta``: load config, set up logging, serve until SIGTERM."""

from __future__ import annotations

import sys

from ff_meta.config import ENV_PREFIX, MetaSettings
from ff_meta.server import main
from ff_rpc.entry import run_service


def run(argv: list[str] | None = None) -> int:
    """Run the meta service (``python -m ff_meta``); the exit status."""
    return run_service(
        service="meta",
        description="fireflyer meta service (3FS file-system metadata)",
        model=MetaSettings,
        env_prefix=ENV_PREFIX,
        main=main,
        argv=argv,
    )


if __name__ == "__main__":
    sys.exit(run())
