"""``python -m ff_storage``: load config, set up logging, serve until SIGTERM."""

from __future__ import annotations

import sys

from ff_rpc.entry import run_service
from ff_storage.config import ENV_PREFIX, StorageSettings
from ff_storage.server import main


def run(argv: list[str] | None = None) -> int:
    """Run the storage service with settings from ``argv`` and ``FF_STORAGE_*``; returns the process exit code."""
    return run_service(
        service="storage",
        description="fireflyer storage service (3FS chunk store)",
        model=StorageSettings,
        env_prefix=ENV_PREFIX,
        main=main,
        argv=argv,
    )


if __name__ == "__main__":
    sys.exit(run())
