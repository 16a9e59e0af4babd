"""TCP ports for servers that cannot bind port 0 themselves (picked below the ephemeral range)."""

from __future__ import annotations

from ff_config.ports import free_port

__all__ = ["free_port"]
