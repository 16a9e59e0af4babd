"""``python -m ff_agent``: load config, set up logging, serve until SIGTERM."""

from __future__ import annotations

import sys

from ff_agent.config import ENV_PREFIX, AgentSettings
from ff_agent.server import main
from ff_rpc.entry import run_service


def run(argv: list[str] | None = None) -> int:
    """Run the agent with settings from ``argv`` and ``FF_AGENT_*``; returns the process exit code."""
    return run_service(
        service="agent",
        description="fireflyer node agent",
        model=AgentSettings,
        env_prefix=ENV_PREFIX,
        main=main,
        argv=argv,
    )


if __name__ == "__main__":
    sys.exit(run())
