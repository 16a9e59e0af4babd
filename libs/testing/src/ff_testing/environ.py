"""The environment a test gives the commands it runs: the caller's, without its Fire-Flyer settings."""

from __future__ import annotations

import os
from collections.abc import Mapping

from ff_config.ports import PORT_RANGE_ENV

# Kept: not a setting of the command under test but the test worker's own share of the port range.
_KEPT = frozenset({PORT_RANGE_ENV})


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """``os.environ`` without ``FF_*`` settings, plus ``extra``.

    tox passes them through, and a stray ``FF_TOKEN`` or ``FF_MGMTD_ADDRESSES`` must not change what a test sees.
    """
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FF_") or k in _KEPT}
    return {**clean, **(extra or {})}
